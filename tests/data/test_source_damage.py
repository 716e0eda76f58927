"""Packets damaged before the store computed their checksums (an import of files that were
already damaged): the checksums hold, so the decoder must notice, and a read raises
FrameCodecError naming column, episode and frame instead of returning other pixels.

The damage set is ``benchmarks/source_damage.py``'s, which prints the counts for every kind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.file_module import load_module
from torchstore.data import TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import FrameCodecError
from torchstore.io.frames.codec import EncodedFrames

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "source_damage.py"


@pytest.fixture(scope="module")
def damage():
    return load_module(BENCHMARK, "source_damage_benchmark")


def _store_with(damage, tmp_path, kind: str, frame: int, change) -> Path:
    """A store of two episodes of ``kind``; in the second, packet ``frame`` is ``change``d
    before it is written (so its checksum covers the damaged bytes)."""
    encoded = damage.episode(kind)
    packets = [bytes(p) for p in encoded.packets]
    packets[frame] = change(packets[frame])
    damaged = EncodedFrames(encoded.codec, encoded.info, packets, encoded.keyframes)
    path = tmp_path / f"{kind}.h5"
    with TrajectoryStoreWriter(path, damage.columns(kind)) as w:
        w.add_episode({"cam": encoded})
        w.add_episode({"cam": damaged})
    return path


def test_a_png_cut_short_and_padded_with_zeros_names_column_episode_and_frame(damage, tmp_path):
    # its pixels decoded (the rows after the cut black) before the decoder checked CRCs
    path = _store_with(
        damage, tmp_path, "png", 5, lambda p: p[: len(p) // 2] + bytes(len(p) - len(p) // 2)
    )
    n = damage.FRAMES
    with TrajectoryStore(path) as store:
        with pytest.raises(FrameCodecError, match="column 'cam' episode 1: frame 5: the PNG") as e:
            store.read_column("cam", n, 2 * n)
        assert e.value.frame == 5
        assert np.array_equal(store.read_column("cam", 0, 5), store.read_column("cam", n, n + 5))


def test_a_png_chunk_whose_crc_does_not_match_is_refused(damage, tmp_path):
    def flip_ihdr_crc(png: bytes) -> bytes:
        at = 8 + 8 + 13  # signature, IHDR length and type, IHDR data: its CRC
        return png[:at] + bytes([png[at] ^ 0x01]) + png[at + 1 :]

    path = _store_with(damage, tmp_path, "png", 0, flip_ihdr_crc)
    with TrajectoryStore(path) as store:
        with pytest.raises(FrameCodecError, match="column 'cam' episode 1: frame 0"):
            store.read_column("cam", damage.FRAMES, damage.FRAMES + 1)


def test_h264_damage_the_decoder_notices_is_refused_not_concealed(damage, tmp_path):
    # packet 0 opens with x264's SEI; a changed size field makes it overrun its NAL unit
    path = _store_with(damage, tmp_path, "h264", 0, lambda p: p[:6] + bytes([p[6] ^ 0xFF]) + p[7:])
    with TrajectoryStore(path) as store:
        with pytest.raises(FrameCodecError, match="column 'cam' episode 1: frame 0"):
            store.read_column("cam", damage.FRAMES, damage.FRAMES + 4)


def test_no_damage_of_the_set_decodes_a_png_to_other_pixels(damage, tmp_path):
    counts, silent = damage.measure("png", tmp_path)
    assert counts["caught"] > 0 and counts["same"] > 0  # the set reaches pixels, and misses some
    assert silent == [], f"decoded to other pixels with no error: {silent}"


@pytest.mark.parametrize("kind", ["av1", "h264"])
def test_a_packet_flagged_a_keyframe_that_is_not_one_is_refused(damage, tmp_path, kind):
    """Damage to the packet table at the source: a read that starts at the false keyframe."""
    encoded = damage.episode(kind)
    keys = np.asarray(encoded.keyframes, bool).copy()
    assert not keys[13]
    keys[13] = True
    damaged = EncodedFrames(encoded.codec, encoded.info, list(encoded.packets), keys)
    with TrajectoryStoreWriter(tmp_path / "s.h5", damage.columns(kind)) as w:
        w.add_episode({"cam": damaged})
    with TrajectoryStore(tmp_path / "s.h5") as store:
        with pytest.raises(FrameCodecError, match=r"column 'cam' episode 0: frame \d+"):
            store.read_column("cam", 14, 20)
