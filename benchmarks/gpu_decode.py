"""Video decode on the GPU's decoder (``decode_device="cuda"``) against the CPU, same packets.

Camera-like frames (``benchmarks/_camera_frames.py``) at the ALOHA-like sizes, 480x640 and
240x320, encoded as AV1 at LeRobot's settings (GOP 2) and as H.264; each stream decoded
into RGB by the store's decoders on the CPU (one thread, then every core as the refill
does: runs cut at keyframes over the decode threads) and on CUDA (NVDEC, one thread, then
the same threads), timed in turn; frames/s medians and the GPU/CPU ratios printed, with the
mean absolute difference of the frames (colour conversion rounding, never a frame off).

Needs a CUDA GPU and a PyAV whose FFmpeg has CUDA hardware acceleration; without them it
says which is missing and exits 1.

Usage: python benchmarks/gpu_decode.py [--frames 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _camera_frames import camera_frames  # noqa: E402
from _timing import print_table  # noqa: E402

from torchstore.data.file.encoded import decode_threads  # noqa: E402
from torchstore.io.frames.codec import FrameCodec, FrameDecoder, encode_frames  # noqa: E402
from torchstore.io.frames.decode_device import _why_not_cuda  # noqa: E402

SIZES = [(480, 640), (240, 320)]


def pieces(encoded, frames: int) -> list[tuple[int, int]]:
    """The keyframe-to-keyframe runs of a stream: what decode threads take one at a time."""
    keys = [i for i, k in enumerate(encoded.keyframes) if k] + [frames]
    return list(zip(keys[:-1], keys[1:], strict=True))


def decode_all(codec, encoded, device: str, threads: int, out: np.ndarray) -> None:
    from concurrent.futures import ThreadPoolExecutor

    runs = pieces(encoded, len(encoded.packets))

    def work(part: list[tuple[int, int]]) -> None:
        decoder = FrameDecoder(codec, encoded.info, device=device)
        for a, b in part:
            decoder.decode(encoded.packets[a:b], out[a:b])

    if threads == 1:
        work(runs)
        return
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, [runs[k::threads] for k in range(threads)]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    why = _why_not_cuda("av1")
    if why is not None:
        print(f"gpu_decode.py needs the GPU's video decoder: {why}", file=sys.stderr)
        return 1
    threads = decode_threads()
    rows = []
    for kind, codec in (("av1", FrameCodec.lerobot_av1()), ("h264", FrameCodec("h264"))):
        for h, w in SIZES:
            encoded = encode_frames(codec, camera_frames(args.frames, h, w))
            cases = [("cpu", 1), ("cpu", threads), ("cuda", 1), ("cuda", threads)]
            outs = [np.empty((args.frames, h, w, 3), np.uint8) for _ in cases]
            times: list[list[float]] = [[] for _ in cases]
            for r in range(args.repeats + 1):
                for k, (device, n) in enumerate(cases):
                    t0 = time.perf_counter()
                    decode_all(codec, encoded, device, n, outs[k])
                    if r:
                        times[k].append(time.perf_counter() - t0)
            fps = [args.frames / statistics.median(t) for t in times]
            diff = np.abs(outs[2].astype(np.int16) - outs[0].astype(np.int16)).mean()
            rows.append((
                f"{kind} {h}x{w}", *(f"{f:,.0f}" for f in fps),
                f"{fps[2] / fps[0]:.2f}x", f"{fps[3] / fps[1]:.2f}x", f"{diff:.2f}",
            ))  # fmt: skip
    print_table(
        f"decode to RGB, frames/s ({args.frames} frames, median of {args.repeats}; "
        f"{threads} threads = the cores the refill decodes on)",
        ("stream", "cpu 1 thread", f"cpu {threads}", "cuda 1 thread", f"cuda {threads}",
         "cuda/cpu, 1", f"cuda/cpu, {threads}", "mean |diff|"),
        rows,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
