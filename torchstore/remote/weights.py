"""Fetch a promoted policy's weights: safetensors only, sha256-verified, as a state dict.

Pickle-based formats (``.pt``, ``.pth``, ``.bin``, ``.pkl``, ``.ckpt``) run code when
loaded, so they are refused: publish weights with ``safetensors.torch.save_file``.
Sharded weights (several ``.safetensors`` files) are merged into one state dict.

:func:`check_safetensors` checks a file the way a loader will read it, without loading
it: the header parses, every tensor's byte range has exactly ``itemsize(dtype) x
prod(shape)`` bytes, the ranges tile the data section with no gap or overlap, and the
data ends exactly at the end of the file. ``push --kind policy`` runs it on every
``.safetensors`` file and refuses a policy with none.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from torchstore.errors import DeviceError, StoreFormatError
from torchstore.extras import install_hint
from torchstore.remote.cache import pull_entry

__all__ = [
    "fetch_policy_weights",
    "check_safetensors",
    "check_policy_files",
    "DeviceError",
    "PICKLE_SUFFIXES",
]

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
_MAX_HEADER = 100 << 20
#: bytes per element of each safetensors dtype
_ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


def check_safetensors(path: str | os.PathLike) -> None:
    """Raise :class:`StoreFormatError` unless ``path`` is a complete, sound safetensors file."""
    path = Path(path)

    def bad(why: str) -> StoreFormatError:
        return StoreFormatError(f"{path} is not a valid safetensors file: {why}")

    header, data = _read_safetensors_header(path, bad)
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise bad("__metadata__ must map strings to strings")
            continue
        ranges.append(_tensor_range(name, info, bad))
    _check_tensor_layout(ranges, data, bad)


def _read_safetensors_header(path: Path, bad: Callable[[str], Exception]) -> tuple[dict, int]:
    """The header object and the byte count of the data after it."""
    size = path.stat().st_size
    if size < 8:
        raise bad(f"{size} bytes, too short for the header length")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > size - 8 or n > _MAX_HEADER:
            raise bad(f"the header claims {n} bytes, the file has {size - 8} after its length")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise bad(f"the header is not JSON ({str(exc)[:80]})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    return header, size - 8 - n


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_range(name: str, info: Any, bad: Callable[[str], Exception]) -> tuple[int, int, str]:
    """``(begin, end, name)`` of one tensor's bytes, once its description is checked."""
    if not isinstance(info, dict):
        raise bad(f"tensor {name!r} is not described by an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _ITEMSIZE:
        raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise bad(f"tensor {name!r} has shape {shape!r}, not a list of ints >= 0")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise bad(
            f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with begin <= end"
        )
    want = _ITEMSIZE[dtype] * math.prod(shape)
    if offsets[1] - offsets[0] != want:
        raise bad(
            f"tensor {name!r} ({dtype} x {shape}) needs {want} bytes, its data_offsets span "
            f"{offsets[1] - offsets[0]}"
        )
    return offsets[0], offsets[1], name


def _check_tensor_layout(
    ranges: list[tuple[int, int, str]], data: int, bad: Callable[[str], Exception]
) -> None:
    """The tensors' byte ranges tile the data exactly: no overlap, no gap, nothing after."""
    ranges = sorted(ranges)
    for (_, prev_stop, prev), (begin, stop, name) in zip(ranges, ranges[1:], strict=False):
        if begin < prev_stop:
            raise bad(f"tensor {name!r} (bytes {begin}..{stop}) overlaps tensor {prev!r}")
    end = 0
    for begin, stop, name in ranges:
        if begin != end:
            raise bad(f"tensor {name!r} (bytes {begin}..{stop}) leaves a gap at byte {end}")
        end = stop
    if end != data:
        raise bad(f"the tensors end at data byte {end}, the file's data has {data} bytes")


def check_policy_files(files: Iterable[tuple[str, Path]], *, subject: str) -> None:
    """A policy entry: one ``.safetensors`` file or more, each passing :func:`check_safetensors`."""
    files = list(files)
    weights = [(rel, path) for rel, path in files if rel.endswith(".safetensors")]
    if not weights:
        pickled = [rel for rel, _ in files if rel.lower().endswith(PICKLE_SUFFIXES)]
        hint = f" (only pickle-based {pickled[:3]}, which run code when loaded)" if pickled else ""
        raise StoreFormatError(
            f"{subject}: a policy entry needs at least one .safetensors file{hint}; save weights "
            "with safetensors.torch.save_file"
        )
    for _rel, path in weights:
        check_safetensors(path)


def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise DeviceError(f"device {device!r} is not a torch device ({exc})") from None
    if dev.type == "cpu" or dev.type == "meta":
        return dev
    backend = getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is not None and not available():
        why = (
            "this torch build has no CUDA"
            if dev.type == "cuda" and not torch.backends.cuda.is_built()
            else f"no {dev.type} device is available"
        )
        raise DeviceError(
            f"device {str(device)!r} cannot be used here ({why}); load with device='cpu' and "
            "move the tensors later"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(
            f"device {str(device)!r} does not exist: {torch.cuda.device_count()} CUDA device(s) "
            "here"
        )
    return dev


def _require_safetensors():
    try:
        import safetensors.torch
    except ImportError as exc:
        raise ImportError(
            f"fetching policy weights needs safetensors: {install_hint('hub')}"
        ) from exc
    return safetensors.torch


def fetch_policy_weights(
    location: str | os.PathLike,
    name: str,
    *,
    filename: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    revision: str | None = None,
    offline: bool | None = None,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Pull entry ``name``'s safetensors weights (verified) and load them as a state dict.

    Args:
        filename: the weights file in the entry; default: every ``*.safetensors`` file.
        device: where the tensors land; checked before anything is fetched.

    Raises:
        StoreFormatError: the entry has no safetensors weights, only pickle-based ones, or
            ``filename`` is not a (valid) safetensors file.
        DeviceError: ``device`` cannot be used here (``"cuda"`` without CUDA).

    Examples:
        >>> state = fetch_policy_weights("hf://models/lab", "reach-policy")  # doctest: +SKIP
        >>> policy.load_state_dict(state)  # doctest: +SKIP
    """
    st = _require_safetensors()
    dev = _check_device(device)
    if filename is not None and not filename.endswith(".safetensors"):
        rule = (
            "pickle-based weights run code when loaded and are refused"
            if filename.lower().endswith(PICKLE_SUFFIXES)
            else "only .safetensors weights are loaded"
        )
        raise StoreFormatError(
            f"weights file {filename!r} of {name!r}: {rule}; publish it as .safetensors"
        )

    def wanted(path: str) -> bool:
        return path == filename if filename is not None else path.endswith(".safetensors")

    root, entry = pull_entry(
        location,
        name,
        cache_dir=cache_dir,
        revision=revision,
        offline=offline,
        progress=progress,
        select=wanted,
    )
    paths = [f.path for f in entry.files if wanted(f.path)]
    if not paths:
        pickled = [f.path for f in entry.files if f.path.lower().endswith(PICKLE_SUFFIXES)]
        if pickled:
            raise StoreFormatError(
                f"{name!r} at {location} has only pickle-based weights ({pickled[:3]}); they run "
                "code when "
                "loaded and are refused: publish them as .safetensors"
            )
        what = f"no file {filename!r}" if filename else "no .safetensors file"
        raise StoreFormatError(
            f"{name!r} at {location} has {what}; files: {[f.path for f in entry.files][:10]}"
        )
    state: dict[str, torch.Tensor] = {}
    for path in sorted(paths):
        try:
            check_safetensors(root / path)
        except StoreFormatError as exc:
            raise StoreFormatError(f"{path!r} of {name!r}: {exc}") from None
        try:
            part = st.load_file(str(root / path), device=str(dev))
        except Exception as exc:  # the file checked out: what failed is the loading
            raise DeviceError(
                f"loading {path!r} of {name!r} onto {str(dev)!r} failed: {exc}"
            ) from exc
        clash = state.keys() & part.keys()
        if clash:
            raise StoreFormatError(
                f"{path!r} of {name!r} repeats tensors of another shard: {sorted(clash)[:5]}"
            )
        state.update(part)
    return state
