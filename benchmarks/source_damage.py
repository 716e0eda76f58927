"""Packets damaged at the source: how many reads raise, and how many decode to other pixels.

An import keeps the packets it was given (LeRobot MP4s, RLDS JPEG / PNG bytes) and computes
the store's checksums over them, so damage already in them passes every checksum: only the
decoder can notice it. For each kind (PNG, JPEG, AV1, H.264) one episode of camera-like
frames (``_camera_frames.py``, 48x64, 24 frames, video GOP 8) is encoded, then damaged in
each way of a fixed set before it is written (:func:`damages`): a byte of four packets
(two keyframes, two others) XORed with 0x01, 0x80 and 0xFF at nine places; each of them
cut to half, cut by 4 bytes, its second half zeroed; and, as damage to the packet table,
a packet boundary moved 4 bytes and a keyframe flag set on a frame that is not one. Each
damaged store is read twice, the whole episode and a slab from mid-GOP (frames 10..20),
and each read is counted as

- caught: FrameCodecError or IntegrityError (naming column, episode and frame);
- same: the pixels of the undamaged packets (the damage did not reach the pixels read);
- silent: other pixels and no error: the failure this counts.

Target: no silent read for PNG, whose chunks carry CRCs (checked: FFmpeg's PNG decoder
skips them unless asked). The other kinds carry no checksum of their own, so their silent
reads are printed, not held to a target: a changed bit can still parse, to other pixels.
JPEG is decoded strictly (libjpeg's warnings raise); H.264's decoder is told to fail on
the damage it notices instead of concealing it, but its CABAC decoder checks that a slice
does not overrun its bytes, not that it uses them all; libdav1d refuses what does not
parse, but a frame header's field changed to another valid value decodes.

Run: ``python benchmarks/source_damage.py [--kinds png jpeg av1 h264]``
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _camera_frames import camera_frames  # noqa: E402

from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter  # noqa: E402
from torchstore.errors import FrameCodecError, IntegrityError  # noqa: E402
from torchstore.io.frames.codec import EncodedFrames, FrameCodec, encode_frames  # noqa: E402

KINDS = ("png", "jpeg", "av1", "h264")
H, W, FRAMES = 48, 64, 24
#: what a read must reach for each kind: the number of silent reads (None: printed only)
TARGETS = {"png": 0, "av1": None, "jpeg": None, "h264": None}
_PACKETS = (0, 3, 8, 13)  # keyframes 0 and 8 at GOP 8, and two frames that are not
_READS = ((0, FRAMES), (10, 20), (14, 20))


def codec_of(kind: str) -> FrameCodec:
    return FrameCodec(kind, gop=8) if kind in ("av1", "h264") else FrameCodec(kind)


def columns(kind: str) -> list[ColumnSpec]:
    return [ColumnSpec("cam", torch.uint8, (H, W, 3), codec=codec_of(kind))]


def episode(kind: str) -> EncodedFrames:
    return encode_frames(codec_of(kind), camera_frames(FRAMES, H, W, episode=0, seed=5))


def damages(encoded: EncodedFrames) -> Iterator[tuple[str, EncodedFrames]]:
    """The damaged copies of ``encoded``, each with its name."""
    packets = [bytes(p) for p in encoded.packets]
    keys = np.asarray(encoded.keyframes, bool)

    def copy(name: str, changed: dict[int, bytes], flags: np.ndarray = keys):
        out = [changed.get(i, p) for i, p in enumerate(packets)]
        return name, EncodedFrames(encoded.codec, encoded.info, out, flags)

    for p in _PACKETS:
        data, n = packets[p], len(packets[p])
        places = sorted(
            {0, 1, 2, 3, 4, 5, 6, 8, 12} | {int(n * f) for f in (0.1, 0.3, 0.5, 0.7, 0.9)}
        )
        for at in (a for a in places if a < n):
            for mask in (0x01, 0x80, 0xFF):
                flipped = bytearray(data)
                flipped[at] ^= mask
                yield copy(f"packet {p} byte {at} ^ {mask:#04x}", {p: bytes(flipped)})
        yield copy(f"packet {p} cut to half", {p: data[: n // 2]})
        yield copy(f"packet {p} cut by 4 bytes", {p: data[:-4]})
        yield copy(f"packet {p} second half zeroed", {p: data[: n // 2] + bytes(n - n // 2)})
        following = packets[p + 1]
        yield copy(f"packet {p} boundary moved", {p: data + following[:4], p + 1: following[4:]})
        if not keys[p]:
            flags = keys.copy()
            flags[p] = True
            yield copy(f"packet {p} flagged a keyframe", {}, flags)


def read_outcomes(path: Path, reference: np.ndarray) -> list[str]:
    """``caught`` / ``same`` / ``silent`` for each of the reads of ``_READS``."""
    outcomes = []
    with TrajectoryStore(path) as store:
        for a, b in _READS:
            try:
                got = store.read_column("cam", a, b)
            except (FrameCodecError, IntegrityError):
                outcomes.append("caught")
            else:
                outcomes.append("same" if np.array_equal(got, reference[a:b]) else "silent")
    return outcomes


def measure(kind: str, folder: Path) -> tuple[collections.Counter, list[str]]:
    """Counts of each outcome over the damage set for ``kind``, and the silent damages."""
    encoded = episode(kind)
    clean = folder / f"{kind}.h5"
    with TrajectoryStoreWriter(clean, columns(kind), overwrite=True) as w:
        w.add_episode({"cam": encoded})
    with TrajectoryStore(clean) as store:
        reference = store.read_column("cam", 0, FRAMES)
    counts, silent = collections.Counter(), []
    for name, damaged in damages(encoded):
        path = folder / f"{kind}-damaged.h5"
        try:
            with TrajectoryStoreWriter(path, columns(kind), overwrite=True) as w:
                w.add_episode({"cam": damaged})
        except FrameCodecError:  # refused when written: as good as caught
            counts["caught"] += len(_READS)
            continue
        outcomes = read_outcomes(path, reference)
        counts.update(outcomes)
        if "silent" in outcomes:
            silent.append(name)
    return counts, silent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args(argv)
    print(f"{'kind':6} {'reads':>6} {'caught':>7} {'same':>5} {'silent':>7}  target")
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            counts, _ = measure(kind, Path(tmp))
            target = TARGETS[kind]
            if target is None:
                verdict = "printed (no checksum in the format)"
            else:
                met = counts["silent"] <= target
                missed += not met
                verdict = f"silent <= {target}: {'met' if met else 'NO'}"
            total = sum(counts.values())
            print(
                f"{kind:6} {total:6} {counts['caught']:7} {counts['same']:5} "
                f"{counts['silent']:7}  {verdict}"
            )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
