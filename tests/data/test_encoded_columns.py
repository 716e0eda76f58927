"""Encoded camera columns: frames kept as codec packets in the store, read back as uint8.

Round trips per codec (PNG exact, JPEG and video close), reads that start mid-GOP, packets
given already encoded kept byte for byte, a writer killed mid-episode, flipped packet bytes
caught by the checksum, and bad frames refused without losing what was committed.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.damage import flip_chunk_byte
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import ColumnError, FrameCodecError, IntegrityError
from torchstore.io.frames.codec import FrameCodec, encode_frames

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._camera_frames import camera_frames  # noqa: E402

H, W = 48, 64
#: mean absolute error each lossy kind stays under on camera-like frames at its defaults
LOSSY_MAE = {"jpeg": 6.0, "av1": 6.0, "h264": 7.0}


def _columns(kind: str, **settings) -> list[ColumnSpec]:
    codec = FrameCodec(kind, **settings)
    return [
        ColumnSpec("obs/cam", torch.uint8, (H, W, 3), codec=codec),
        ColumnSpec("action", torch.float32, (2,)),
    ]


def _episode(i: int, n: int) -> dict[str, np.ndarray]:
    frames = camera_frames(n, H, W, episode=i, seed=3)
    action = np.stack([np.arange(n), np.full(n, i)], axis=1).astype(np.float32)
    return {"obs/cam": frames, "action": action}


def _write(path, kind: str, lengths=(37, 50, 21), **settings) -> list[dict]:
    episodes = [_episode(i, n) for i, n in enumerate(lengths)]
    with TrajectoryStoreWriter(path, _columns(kind, **settings)) as w:
        for i, ep in enumerate(episodes):
            if i == 1:  # an episode appended in parts, as a recorder does
                half = len(ep["action"]) // 3
                w.append({k: v[:half] for k, v in ep.items()})
                w.append({k: v[half:] for k, v in ep.items()})
                w.end_episode({"i": i})
            else:
                w.add_episode(ep, {"i": i})
    return episodes


@pytest.mark.parametrize("kind", ["png", "jpeg", "av1", "h264"])
def test_frames_read_back_per_codec(tmp_path, kind):
    path = tmp_path / "s.h5"
    episodes = _write(path, kind)
    frames = np.concatenate([ep["obs/cam"] for ep in episodes])
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 3 and store.num_rows == len(frames)
        spec = store.column("obs/cam")
        assert spec.codec.kind == kind and store.manifest.format_version == 3
        got = store.read_slab(0, store.num_rows)
        assert got["obs", "cam"].dtype == torch.uint8
        assert got["obs", "cam"].shape == (len(frames), H, W, 3)
        assert torch.equal(
            got["action"], torch.from_numpy(np.concatenate([e["action"] for e in episodes]))
        )
        cam = got["obs", "cam"].numpy()
        if kind == "png":
            assert np.array_equal(cam, frames)
            assert "(exact)" in spec.describe()
        else:
            assert np.abs(cam.astype(np.int16) - frames).mean() < LOSSY_MAE[kind]
            assert "(lossy)" in spec.describe()
        # any range, across episode edges and mid-GOP, decodes to the same frames
        for a, b in [(0, 1), (5, 9), (36, 38), (40, 100), (86, 108), (107, 108)]:
            assert np.array_equal(store.read_column("obs/cam", a, b), cam[a:b]), (a, b)
        rows = torch.tensor([100, 3, 3, 60, 0, 87])
        assert np.array_equal(store[rows]["obs", "cam"].numpy(), cam[rows.numpy()])
        assert store.episode_metadata(1) == {"i": 1}


def test_a_store_without_codecs_keeps_format_2_and_its_manifest(tmp_path):
    with TrajectoryStoreWriter(tmp_path / "raw.h5", [ColumnSpec("x", torch.float32)]) as w:
        w.add_episode({"x": np.zeros(3, np.float32)})
    with TrajectoryStore(tmp_path / "raw.h5") as store:
        assert store.manifest.format_version == 2
        assert "codec" not in store.manifest.to_json()


def test_add_episodes_encodes_each_episode_on_its_own(tmp_path):
    eps = [_episode(i, n) for i, n in enumerate((20, 45, 7))]
    rows = {k: np.concatenate([e[k] for e in eps]) for k in eps[0]}
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns("av1", gop=8)) as w:
        w.add_episodes(rows, [20, 45, 7])
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert store.num_episodes == 3
        for i in range(3):
            packets = store.encoded_episode("obs/cam", i)
            assert len(packets) == len(eps[i]["action"]) and packets.keyframes[0]
            whole = store.episode(i)["obs", "cam"].numpy()
            assert np.abs(whole.astype(np.int16) - eps[i]["obs/cam"]).mean() < LOSSY_MAE["av1"]


def test_packets_given_encoded_are_kept_byte_for_byte(tmp_path):
    """An import that has the packets already (LeRobot MP4, RLDS JPEG) stores them as they
    are: no decode, no re-encode."""
    ep = _episode(0, 30)
    encoded = encode_frames(FrameCodec("h264", gop=10), ep["obs/cam"])
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns("h264", gop=10)) as w:
        w.add_episode({"obs/cam": encoded, "action": ep["action"]})
        w.add_episode(_episode(1, 12))  # frames, encoded by the writer, in the same column
    with TrajectoryStore(tmp_path / "s.h5") as store:
        back = store.encoded_episode("obs/cam", 0)
        assert [bytes(p) for p in back.packets] == [bytes(p) for p in encoded.packets]
        assert np.array_equal(back.keyframes, encoded.keyframes)
        assert back.info.extradata == encoded.info.extradata
        assert store.num_rows == 42


def test_given_packets_of_another_kind_or_size_are_refused(tmp_path):
    ep = _episode(0, 6)
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns("av1")) as w:
        w.add_episode(_episode(1, 5))
        with pytest.raises(FrameCodecError, match="keeps av1 frames, got jpeg packets"):
            w.add_episode(
                {"obs/cam": encode_frames(FrameCodec.jpeg(), ep["obs/cam"]), "action": ep["action"]}
            )
        small = encode_frames(FrameCodec("av1"), ep["obs/cam"][:, :32, :32])
        with pytest.raises(FrameCodecError, match=r"frames are \[48, 64, 3\]"):
            w.add_episode({"obs/cam": small, "action": ep["action"]})
        hollow = encode_frames(FrameCodec("av1"), ep["obs/cam"])
        hollow = type(hollow)(
            hollow.codec, hollow.info, [b"", *hollow.packets[1:]], hollow.keyframes
        )
        with pytest.raises(FrameCodecError, match="the packet of frame 0 is empty"):
            w.add_episode({"obs/cam": hollow, "action": ep["action"]})
        with pytest.raises(ColumnError, match="expects rows of shape"):
            w.add_episode({"obs/cam": ep["obs/cam"][:, :, :, :1], "action": ep["action"]})
        w.add_episode(_episode(2, 4))  # the writer goes on
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert store.num_episodes == 2 and store.num_rows == 9


def test_a_codec_on_a_column_that_is_not_frames_is_refused():
    with pytest.raises(ColumnError, match="must be uint8 \\[H, W, C\\] frames"):
        ColumnSpec("x", torch.float32, (8, 8, 3), codec="png")
    with pytest.raises(ColumnError, match="cannot have 4 channels"):
        ColumnSpec("x", torch.uint8, (8, 8, 4), codec="av1")
    assert ColumnSpec("x", torch.uint8, (8, 8, 4), codec="raw").codec is None


def _killed_mid_episode(path: str, ready_w: int) -> None:
    w = TrajectoryStoreWriter.resume(path)
    ep = _episode(7, 40)
    w.append({k: v[:25] for k, v in ep.items()})
    w._ds.packets["obs/cam"].write_staged()  # packets of the open episode reach the file
    w._ds.columns["obs/cam"].write_staged()
    w._file.flush()
    os.write(ready_w, b"x")
    signal.pause()


def test_a_writer_killed_mid_episode_loses_only_that_episode(tmp_path):
    path = str(tmp_path / "s.h5")
    episodes = _write(path, "av1", lengths=(30, 26))
    with TrajectoryStore(path) as store:
        before = store.read_slab(0, store.num_rows)["obs", "cam"].numpy()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _killed_mid_episode(path, ready_w)
        finally:
            os._exit(1)
    assert os.read(ready_r, 1) == b"x"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 2
        assert np.array_equal(store.read_slab(0, store.num_rows)["obs", "cam"].numpy(), before)
    with TrajectoryStoreWriter.resume(path) as w:
        w.add_episode(_episode(2, 15))
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 3 and store.num_rows == 71
        assert np.array_equal(store.read_column("obs/cam", 0, 56), before)
        third = store.episode(2)["obs", "cam"].numpy()
        assert np.abs(third.astype(np.int16) - _episode(2, 15)["obs/cam"]).mean() < LOSSY_MAE["av1"]
    assert len(episodes) == 2


def test_a_flipped_packet_byte_is_caught_by_the_checksum_before_the_decoder(tmp_path):
    from torchstore.data.store.verify import verify_store

    path = tmp_path / "s.h5"
    _write(path, "av1", lengths=(30,))
    flip_chunk_byte(path, "packets/obs/cam", 0, 200)
    with TrajectoryStore(path) as store:
        with pytest.raises(IntegrityError, match="packets"):
            store.read_column("obs/cam", 10, 20)
        assert np.array_equal(store.read_column("action", 0, 30)[:, 0], np.arange(30))
    report = verify_store(path)
    assert not report.ok and any("packets" in p for p in report.problems)


def test_a_corrupt_packet_names_column_episode_and_frame(tmp_path):
    """Bytes that pass the checksum but do not decode (damaged at the source)."""
    ep = _episode(0, 20)
    encoded = encode_frames(FrameCodec("av1", gop=8), ep["obs/cam"])
    packets = list(encoded.packets)
    packets[9] = bytes(len(packets[9]))  # zeros: not an AV1 temporal unit
    bad = type(encoded)(encoded.codec, encoded.info, packets, encoded.keyframes)
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns("av1", gop=8)) as w:
        w.add_episode(_episode(1, 5))
        w.add_episode({"obs/cam": bad, "action": ep["action"]})
    with TrajectoryStore(tmp_path / "s.h5") as store:
        with pytest.raises(
            FrameCodecError, match="column 'obs/cam' episode 1: frame (9|10|11)"
        ) as caught:
            store.read_column("obs/cam", 5, 25)
        assert caught.value.frame in (9, 10, 11)  # libdav1d may report it a frame or two late
        assert store.read_column("obs/cam", 5, 13).shape == (8, H, W, 3)  # the GOP before it


def test_a_recorder_may_reuse_its_frame_buffer_as_soon_as_append_returns(tmp_path):
    """Frames are encoded on the column's own thread, from a copy taken in append."""
    ep = _episode(4, 24)
    buffer = np.empty((1, H, W, 3), np.uint8)
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns("png")) as w:
        for t in range(24):
            buffer[0] = ep["obs/cam"][t]
            w.append({"obs/cam": buffer, "action": ep["action"][t : t + 1]})
            buffer[0] = 0  # the env writes its next frame here
        w.end_episode()
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert np.array_equal(store.read_column("obs/cam", 0, 24), ep["obs/cam"])


@pytest.mark.parametrize("kind", ["jpeg", "av1"])
def test_runs_cut_at_keyframes_decode_the_same_on_several_threads(tmp_path, kind):
    from torchstore.data.file.encoded import decode_packet_runs

    path = tmp_path / "s.h5"
    _write(path, kind, lengths=(70, 45), gop=8) if kind == "av1" else _write(path, kind)
    with TrajectoryStore(path) as store:
        n = store.num_rows
        whole = store.read_column("obs/cam", 0, n)
        spec = store.column("obs/cam")
        for a, b in [(0, n), (3, n - 5), (9, 10), (60, 80)]:
            runs = store.read_packet_runs("obs/cam", a, b)
            for min_frames in (1, 5, 17, 1000):
                pieces = [p for r in runs for p in r.split(min_frames)]
                assert sum(p.count for p in pieces) == b - a
                # a piece is at least min_frames packets unless its run is shorter
                for r in runs:
                    mine = r.split(min_frames)
                    if len(mine) > 1:
                        assert min(len(p.packets) for p in mine) >= min_frames
                out = np.zeros((b - a, H, W, 3), np.uint8)
                for p in pieces:  # every piece decodes alone, into its own rows
                    decode_packet_runs(spec, [p], out)
                assert np.array_equal(out, whole[a:b]), (a, b, min_frames)
            out = np.zeros((b - a, H, W, 3), np.uint8)
            decode_packet_runs(spec, runs, out, threads=3)
            assert np.array_equal(out, whole[a:b]), (a, b)


def test_a_fork_after_decoding_on_other_threads_does_not_hang(tmp_path):
    """A child forked after a refill or pool thread decoded (DataLoader workers, forked
    tests) must not free those threads' FFmpeg contexts: that waited forever."""
    import threading

    from tests.forked import run_forked
    from torchstore.data.file.encoded import decode_packet_runs

    path = tmp_path / "s.h5"
    _write(path, "av1", lengths=(40, 40), gop=8)
    with TrajectoryStore(path) as store:
        reader = threading.Thread(target=store.read_column, args=("obs/cam", 0, 80))
        reader.start()
        reader.join()
        out = np.empty((80, H, W, 3), np.uint8)
        runs = store.read_packet_runs("obs/cam", 0, 80)
        decode_packet_runs(store.column("obs/cam"), runs, out, threads=3)
        status, text = run_forked(lambda: store.read_column("obs/cam", 5, 30), timeout=60)
        assert status == "ok", f"{status}: {text}"


def test_an_episode_refused_for_room_commits_when_tried_again(tmp_path):
    """end_episode refused before anything is written (no room) keeps the episode pending,
    its frames encoded: the next end_episode commits it."""
    import errno

    from torchstore.errors import StorageFullError

    ep = _episode(0, 20)
    with TrajectoryStoreWriter(tmp_path / "s.h5", _columns("av1")) as w:
        w.append(ep)
        real = w._check_room
        refusals = []

        def no_room_once(nbytes):
            if not refusals:
                refusals.append(nbytes)
                raise StorageFullError(errno.ENOSPC, "no room (test)", str(w.path))
            real(nbytes)

        w._check_room = no_room_once
        with pytest.raises(StorageFullError):
            w.end_episode()
        assert w.pending_rows == 20
        w.end_episode()
    with TrajectoryStore(tmp_path / "s.h5") as store:
        assert store.num_episodes == 1 and store.num_rows == 20
        got = store.read_column("obs/cam", 0, 20)
        assert np.abs(got.astype(np.int16) - ep["obs/cam"]).mean() < LOSSY_MAE["av1"]
