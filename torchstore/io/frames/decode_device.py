"""Where video packets are decoded: the CPU (libdav1d, FFmpeg's h264) or NVDEC.

``decode_device="cuda"`` decodes AV1 and H.264 on the GPU's video decoder through FFmpeg's
CUDA hardware acceleration (PyAV's ``HWAccel``), which takes the store's packets as they
are, with the stream's own extradata; the frames come back to host memory and are converted
to RGB (and resized) in the same sws pass as CPU-decoded ones. PyAV's route is the one that
fits the store: the refill decodes runs of bare packets it has already read and verified,
where torchcodec's CUDA decoder opens a container (a file or a byte buffer) of its own.

Where there is no CUDA device, no NVDEC in the loaded FFmpeg, or the codec has no CUDA
decoder, the decode falls back to the CPU with one warning per process that says why: a
config written for a GPU machine still trains on a laptop. PNG, JPEG and raw frames always
decode on the CPU.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from torchstore.errors import ArgumentError

__all__ = ["DECODE_DEVICES", "HARDWARE_DECODERS", "check_decode_device", "hardware_decode"]

#: what ``decode_device`` may be
DECODE_DEVICES = ("cpu", "cuda")
#: codec kind -> the FFmpeg decoder that runs on CUDA hardware acceleration (FFmpeg's own
#: AV1 decoder decodes only through a hardware accelerator; libdav1d has none)
HARDWARE_DECODERS = {"av1": "av1", "h264": "h264"}

_WARNED: set[str] = set()
_LOCK = threading.Lock()


def check_decode_device(value: Any) -> str:
    """``value`` as a decode device name (``"cpu"`` or ``"cuda"``; ``"cuda:N"`` names a
    GPU), or ArgumentError."""
    text = str(value)
    if text in DECODE_DEVICES or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise ArgumentError(f"decode_device ({value!r}) must be 'cpu' or 'cuda' (or 'cuda:N')")


def _why_not_cuda(kind: str) -> str | None:
    """Why ``kind`` cannot be decoded on CUDA here, or None when it can."""
    if kind not in HARDWARE_DECODERS:
        return f"{kind} frames have no hardware decoder"
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is visible"
    except ImportError:  # the io layer does not need torch; without it, no GPU either
        return "torch is not installed"
    try:
        from av.codec.hwaccel import hwdevices_available
    except ImportError:
        return "this PyAV has no hardware acceleration (PyAV 14 or later has)"
    if "cuda" not in hwdevices_available():
        return "the FFmpeg PyAV loads has no CUDA hardware acceleration"
    return None


def hardware_decode(kind: str, device: str) -> Any:
    """The PyAV ``HWAccel`` that decodes ``kind`` on ``device``, or None to decode on the
    CPU: for ``device="cpu"``, and (after one warning per reason, per process) where the
    GPU cannot decode it."""
    device = check_decode_device(device)
    if device == "cpu":
        return None
    reason = _why_not_cuda(kind)
    if reason is not None:
        with _LOCK:
            first = reason not in _WARNED
            _WARNED.add(reason)
        if first:
            warnings.warn(
                f"decode_device={device!r}: {reason}; decoding on the CPU",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    from av.codec.hwaccel import HWAccel

    index = device.partition(":")[2] or None
    # no software fallback: FFmpeg's AV1 decoder has none, and a silent one would hide
    # that the GPU is not decoding
    return HWAccel("cuda", device=index, allow_software_fallback=False)
