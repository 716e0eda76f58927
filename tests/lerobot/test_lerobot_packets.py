"""LeRobot cameras kept as their MP4 packets: import without decoding, export without
re-encoding, byte for byte, and the decoded frames PyAV's own."""

from __future__ import annotations

import json
import logging
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from torchstore.cli import main
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import ArgumentError, VideoError
from torchstore.io.frames.codec import FrameCodec, packets_from_mp4, write_mp4
from torchstore.lerobot import LeRobotSource, LeRobotWriter, export_lerobot, import_lerobot

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._camera_frames import camera_frames  # noqa: E402

FPS = 30
H, W = 96, 128
CAM = "observation.images.cam"
LENGTHS = (60, 60)
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": None},
    CAM: {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
}


def record(root: Path, lengths=LENGTHS, **kwargs) -> None:
    with LeRobotWriter(root, fps=FPS, features=FEATURES, **kwargs) as w:
        for e, n in enumerate(lengths):
            state = np.stack([np.arange(n), np.full(n, e), np.zeros(n)], 1).astype(np.float32)
            w.add_episode(
                {"observation.state": state, CAM: camera_frames(n, H, W, episode=e, seed=5)},
                task="pick",
            )


@pytest.fixture(scope="module")
def av1_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packets") / "ds"
    record(root)
    return root


@pytest.fixture(scope="module")
def h264_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packets") / "ds264"
    record(root, (30, 25), video_encoder="h264")
    return root


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def mp4_packets(root: Path) -> list:
    """Each episode's packets as packets_from_mp4 takes them out of the dataset's MP4s."""
    with LeRobotSource(root) as src:
        out = []
        for e in src.episodes:
            rel, start = e.videos[CAM]
            out.append(packets_from_mp4(root / rel, start, start + e.length / FPS, FPS))
        return out


def pyav_frames(root: Path) -> list[np.ndarray]:
    """Each episode's frames as PyAV decodes its MP4 (``av.open(...).decode``), placed by
    timestamp."""
    import av

    with LeRobotSource(root) as src:
        entries = list(src.episodes)
    by_file: dict[str, dict[int, np.ndarray]] = {}
    out = []
    for e in entries:
        rel, start = e.videos[CAM]
        if rel not in by_file:
            with av.open(str(root / rel)) as container:
                by_file[rel] = {
                    round(frame.pts * frame.time_base * FPS): frame.to_ndarray(format="rgb24")
                    for frame in container.decode(video=0)
                }
        first = round(Fraction(start).limit_denominator(10**6) * FPS)
        out.append(np.stack([by_file[rel][first + k] for k in range(e.length)]))
    return out


def same_packets(a, b) -> bool:
    return (
        [bytes(p) for p in a.packets] == [bytes(p) for p in b.packets]
        and np.array_equal(np.asarray(a.keyframes), np.asarray(b.keyframes))
        and a.info.extradata == b.info.extradata
    )


def test_import_keeps_the_mp4_packets_byte_for_byte(av1_dataset, tmp_path):
    summary = import_lerobot(av1_dataset, tmp_path / "a.h5", progress=False)
    assert summary.packet_cameras == (CAM,) and summary.decoded_cameras == {}
    info = json.loads((av1_dataset / "meta/info.json").read_text())["features"][CAM]["info"]
    with TrajectoryStore(tmp_path / "a.h5") as store:
        spec = store.column(CAM)
        assert spec.codec == FrameCodec.from_lerobot_info(info) == FrameCodec.lerobot_av1()
        for e, want in enumerate(mp4_packets(av1_dataset)):
            assert same_packets(store.encoded_episode(CAM, e), want), e
        # the other columns as before
        state = store.episode(1)["observation.state"].numpy()
        np.testing.assert_array_equal(state[:, 0], np.arange(60))


def test_imported_frames_are_what_pyav_decodes_from_the_mp4(av1_dataset, tmp_path):
    import_lerobot(av1_dataset, tmp_path / "a.h5", progress=False)
    import_lerobot(av1_dataset, tmp_path / "raw.h5", video="decode", progress=False)
    decoded = pyav_frames(av1_dataset)
    with TrajectoryStore(tmp_path / "a.h5") as store, TrajectoryStore(tmp_path / "raw.h5") as raw:
        assert raw.column(CAM).codec is None  # decode: raw frames, as earlier releases
        for e, want in enumerate(decoded):
            assert np.array_equal(store.episode(e)[CAM].numpy(), want), e
            assert np.array_equal(raw.episode(e)[CAM].numpy(), want), e
        # a read that starts mid-episode decodes to the same frames
        assert np.array_equal(store.read_column(CAM, 45, 75), np.concatenate(decoded)[45:75])


def _one_frame_store(store, path: Path) -> int:
    """Bytes of a store with ``store``'s columns and chunks holding one frame: what its
    layout allocates however little it holds (every table's first chunk)."""
    from torchstore.io.frames.codec import EncodedFrames

    first = store.encoded_episode(CAM, 0)
    one = EncodedFrames(first.codec, first.info, first.packets[:1], first.keyframes[:1])
    others = [c.name for c in store.columns if c.name != CAM]
    row = store.read_slab(0, 1, others)
    meta = store.manifest.metadata
    with TrajectoryStoreWriter(
        path, store.columns, metadata=meta, expected_rows=store.num_rows
    ) as w:
        w.add_episode({CAM: one, **{n: row[n].numpy() for n in others}})
    return path.stat().st_size


def test_the_store_is_about_the_size_of_the_dataset(av1_dataset, tmp_path):
    """Raw frames are ~20x the dataset; packets are the MP4's bytes. The import sizes its
    tables' chunks to its rows (at the default 128 KiB a table, these 7 columns alone took
    ~1 MB); what a store of the same chunks holding one frame takes (HDF5's metadata, the
    first chunks of the packet, hash and episode tables) is ~180 KB, more than this small dataset's
    whole parquet, so the bound is on what the data adds beyond that."""
    folder = folder_bytes(av1_dataset)
    mp4 = sum(p.stat().st_size for p in (av1_dataset / "videos").rglob("*.mp4"))
    import_lerobot(av1_dataset, tmp_path / "raw.h5", video="decode", progress=False)
    import_lerobot(av1_dataset, tmp_path / "a.h5", progress=False)
    raw, kept = (tmp_path / "raw.h5").stat().st_size, (tmp_path / "a.h5").stat().st_size
    assert raw > 10 * folder
    with TrajectoryStore(tmp_path / "a.h5") as store:
        fixed = _one_frame_store(store, tmp_path / "one.h5")
        stored = sum(
            store.encoded_episode(CAM, e).nbytes + len(store.encoded_episode(CAM, e).info.extradata)
            for e in range(store.num_episodes)
        )
    assert stored < mp4  # the packets, without the MP4's boxes and index
    assert fixed < 400_000, fixed  # six 128 KiB column chunks alone are 786 KB
    assert kept - fixed <= 1.05 * folder, (kept, fixed, folder)


def test_export_writes_the_stored_packets_back(av1_dataset, tmp_path):
    import_lerobot(av1_dataset, tmp_path / "a.h5", progress=False)
    summary = export_lerobot(tmp_path / "a.h5", tmp_path / "out", progress=False)
    assert (summary.episodes, summary.frames) == (2, 120)
    out = tmp_path / "out"
    assert sorted(p.relative_to(out).as_posix() for p in (out / "videos").rglob("*.mp4")) == [
        f"videos/{CAM}/chunk-000/file-000.mp4"
    ]
    with LeRobotSource(out) as src:
        assert [e.videos[CAM][1] for e in src.episodes] == [0.0, 2.0]
    info = json.loads((out / "meta/info.json").read_text())["features"][CAM]["info"]
    original = json.loads((av1_dataset / "meta/info.json").read_text())["features"][CAM]["info"]
    assert info == original  # the stream as stored: codec, pix_fmt, size, fps, g, crf, preset
    imported = mp4_packets(av1_dataset)
    with TrajectoryStore(tmp_path / "a.h5") as store:
        for e, exported in enumerate(mp4_packets(out)):
            assert same_packets(exported, store.encoded_episode(CAM, e)), e
            assert same_packets(exported, imported[e]), e
    # the exported folder imports back to the same frames
    import_lerobot(out, tmp_path / "b.h5", progress=False)
    with TrajectoryStore(tmp_path / "a.h5") as a, TrajectoryStore(tmp_path / "b.h5") as b:
        assert a.columns == b.columns
        for e in range(2):
            assert np.array_equal(a.episode(e)[CAM].numpy(), b.episode(e)[CAM].numpy())
    assert pyav_frames(out)[1].shape == (60, H, W, 3)


def test_h264_packets_round_trip_and_another_codec_is_re_encoded(h264_dataset, tmp_path):
    import_lerobot(h264_dataset, tmp_path / "a.h5", progress=False)
    decoded = pyav_frames(h264_dataset)
    with TrajectoryStore(tmp_path / "a.h5") as store:
        assert store.column(CAM).codec.kind == "h264"
        for e, want in enumerate(mp4_packets(h264_dataset)):
            assert same_packets(store.encoded_episode(CAM, e), want)
            assert np.array_equal(store.episode(e)[CAM].numpy(), decoded[e])
    export_lerobot(tmp_path / "a.h5", tmp_path / "same", video_encoder="h264", progress=False)
    for e, exported in enumerate(mp4_packets(tmp_path / "same")):
        assert same_packets(exported, mp4_packets(h264_dataset)[e])
    export_lerobot(tmp_path / "a.h5", tmp_path / "av1", video_encoder="av1", progress=False)
    info = json.loads((tmp_path / "av1/meta/info.json").read_text())["features"][CAM]["info"]
    assert info["video.codec"] == "av1"  # asked for another codec: decoded and re-encoded
    again = pyav_frames(tmp_path / "av1")
    for e in range(2):
        assert np.abs(again[e].astype(np.int16) - decoded[e]).mean() < 6.0


def test_a_native_encoded_store_exports_its_packets_with_its_settings(tmp_path):
    """A column the store's writer encoded (AV1, GOP 32) goes out as it is, info.json
    saying GOP 32."""
    codec = FrameCodec.av1()
    columns = [
        ColumnSpec("cam", "uint8", (H, W, 3), codec=codec),
        ColumnSpec("x", "float32"),
    ]
    with TrajectoryStoreWriter(tmp_path / "s.h5", columns) as w:
        for e, n in enumerate((40, 20)):
            w.add_episode({"cam": camera_frames(n, H, W, episode=e), "x": np.zeros(n, np.float32)})
    export_lerobot(tmp_path / "s.h5", tmp_path / "out", fps=FPS, progress=False)
    info = json.loads((tmp_path / "out/meta/info.json").read_text())["features"]["cam"]["info"]
    assert (info["video.codec"], info["video.pix_fmt"], info["video.fps"]) == (
        "av1",
        "yuv420p",
        FPS,
    )
    assert (info["video.g"], info["video.crf"], info["video.preset"]) == (32, 30, 12)
    with TrajectoryStore(tmp_path / "s.h5") as store, LeRobotSource(tmp_path / "out") as src:
        for e in src.episodes:
            rel, start = e.videos["cam"]
            got = packets_from_mp4(tmp_path / "out" / rel, start, start + e.length / FPS, FPS)
            # the encoder's extradata is AV1's bare sequence header, the MP4's the av1C box
            # around it: the packets are the same bytes
            stored = store.encoded_episode("cam", e.index)
            assert [bytes(p) for p in got.packets] == [bytes(p) for p in stored.packets]
            assert np.array_equal(got.keyframes, stored.keyframes)
    import_lerobot(tmp_path / "out", tmp_path / "back.h5", progress=False)
    with TrajectoryStore(tmp_path / "back.h5") as back:
        assert back.column("cam").codec == codec  # the sidecar's column, the same stream


def _write_mp4_with_b_frames(path: Path, frames: np.ndarray) -> None:
    import av

    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.codec_context.max_b_frames = 2
        stream.codec_context.gop_size = 30
        for k, frame in enumerate(frames):
            video = av.VideoFrame.from_ndarray(frame, format="rgb24")
            video.pts = k
            container.mux(stream.encode(video))
        container.mux(stream.encode(None))


def test_a_stream_with_b_frames_is_decoded_and_says_why(h264_dataset, tmp_path, caplog):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(h264_dataset, root)
    mp4 = root / f"videos/{CAM}/chunk-000/file-000.mp4"
    frames = np.concatenate(
        [camera_frames(n, H, W, episode=e, seed=5) for e, n in enumerate((30, 25))]
    )
    _write_mp4_with_b_frames(mp4, frames)
    with caplog.at_level(logging.WARNING):
        summary = import_lerobot(root, tmp_path / "a.h5", progress=False)
    assert summary.packet_cameras == () and CAM in summary.decoded_cameras
    assert "cannot be kept as packets" in summary.decoded_cameras[CAM]
    assert f"camera {CAM!r} decoded to raw frames" in str(summary)
    assert f"camera {CAM!r} is decoded to raw frames" in caplog.text
    decoded = pyav_frames(root)
    with TrajectoryStore(tmp_path / "a.h5") as store:
        assert store.column(CAM).codec is None
        for e in range(2):
            assert np.array_equal(store.episode(e)[CAM].numpy(), decoded[e])


def test_a_camera_short_of_frames_names_camera_and_episode(av1_dataset, tmp_path):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(av1_dataset, root)
    mp4 = root / f"videos/{CAM}/chunk-000/file-000.mp4"
    head = packets_from_mp4(mp4, 0.0, 100 / FPS, FPS)
    write_mp4(mp4, head, FPS)  # 100 frames where the episodes need 120
    with pytest.raises(
        VideoError, match=rf"episode 1, feature '{CAM}': .*is truncated or too short"
    ):
        import_lerobot(root, tmp_path / "a.h5", progress=False)
    assert not (tmp_path / "a.h5").exists()


def test_video_option_and_cli(av1_dataset, tmp_path, capsys):
    with pytest.raises(ArgumentError, match="video .* must be 'packets'"):
        import_lerobot(av1_dataset, tmp_path / "x.h5", video="raw", progress=False)
    args = ["import", str(av1_dataset), str(tmp_path / "d.h5"), "--format", "lerobot"]
    assert main([*args, "--video", "decode", "--no-progress"]) == 0
    with TrajectoryStore(tmp_path / "d.h5") as store:
        assert store.column(CAM).codec is None
    capsys.readouterr()
    assert (
        main(
            [
                "import",
                str(av1_dataset),
                str(tmp_path / "p.h5"),
                "--format",
                "lerobot",
                "--no-progress",
            ]
        )
        == 0
    )
    with TrajectoryStore(tmp_path / "p.h5") as store:
        assert store.column(CAM).codec.kind == "av1"
    assert (
        main(
            [
                "export",
                str(tmp_path / "p.h5"),
                str(tmp_path / "out"),
                "--to",
                "lerobot",
                "--no-progress",
            ]
        )
        == 0
    )
    for e, exported in enumerate(mp4_packets(tmp_path / "out")):
        assert same_packets(exported, mp4_packets(av1_dataset)[e])


def test_an_episode_that_does_not_start_on_a_keyframe_is_re_encoded(av1_dataset, tmp_path, caplog):
    """A camera file encoded in one piece (not an episode at a time, as LeRobot does): the
    episodes that start on a keyframe keep their packets, the others are decoded and
    encoded into the column with its codec, and the import says so."""
    import shutil

    from torchstore.io.frames.video import EncoderSettings, encode_video

    root = tmp_path / "ds"
    shutil.copytree(av1_dataset, root)
    mp4 = root / f"videos/{CAM}/chunk-000/file-000.mp4"
    frames = np.concatenate(
        [camera_frames(n, H, W, episode=e, seed=5) for e, n in enumerate(LENGTHS)]
    )
    encode_video(mp4, frames, fps=FPS, settings=EncoderSettings(g=50))  # keyframes 0, 50, 100
    with caplog.at_level(logging.WARNING):
        summary = import_lerobot(root, tmp_path / "a.h5", progress=False)
    assert summary.packet_cameras == (CAM,) and summary.reencoded == {CAM: (1,)}
    assert "re-encoded 1 episodes" in str(summary)
    assert "the packets of episode 1 cannot be kept" in caplog.text
    assert "does not start on a keyframe" in caplog.text
    decoded = pyav_frames(root)
    with TrajectoryStore(tmp_path / "a.h5") as store:
        assert same_packets(store.encoded_episode(CAM, 0), packets_from_mp4(mp4, 0, 2.0, FPS))
        assert np.array_equal(store.episode(0)[CAM].numpy(), decoded[0])
        again = store.episode(1)[CAM].numpy()
        assert np.abs(again.astype(np.int16) - decoded[1]).mean() < 6.0  # a second AV1 generation
