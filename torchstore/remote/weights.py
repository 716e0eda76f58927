"""Fetch a promoted policy's weights: safetensors only, sha256-verified, as a state dict.

Pickle-based formats (``.pt``, ``.pth``, ``.bin``, ``.pkl``, ``.ckpt``) run code when
loaded, so they are refused: publish weights with ``safetensors.torch.save_file``.
Sharded weights (several ``.safetensors`` files) are merged into one state dict.
"""

from __future__ import annotations

import os

import torch

from torchstore.errors import StoreFormatError
from torchstore.remote.cache import pull_entry

__all__ = ["fetch_policy_weights", "PICKLE_SUFFIXES"]

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


def _require_safetensors():
    try:
        import safetensors.torch
    except ImportError as exc:
        raise ImportError(
            "fetching policy weights needs safetensors: pip install 'torchstore[hub]'"
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
        device: where the tensors land.

    Raises:
        StoreFormatError: the entry has no safetensors weights, only pickle-based ones, or
            ``filename`` is not a safetensors file.

    Examples:
        >>> state = fetch_policy_weights("hf://models/lab", "reach-policy")  # doctest: +SKIP
        >>> policy.load_state_dict(state)  # doctest: +SKIP
    """
    st = _require_safetensors()
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
                f"{name!r} at {location} has only pickle-based weights ({pickled[:3]}); they run code when "
                "loaded and are refused: publish them as .safetensors"
            )
        what = f"no file {filename!r}" if filename else "no .safetensors file"
        raise StoreFormatError(
            f"{name!r} at {location} has {what}; files: {[f.path for f in entry.files][:10]}"
        )
    state: dict[str, torch.Tensor] = {}
    for path in sorted(paths):
        try:
            part = st.load_file(str(root / path), device=str(device))
        except Exception as exc:  # SafetensorError is not importable by a stable name
            raise StoreFormatError(
                f"{path!r} of {name!r} is not a valid safetensors file: {exc}"
            ) from exc
        clash = state.keys() & part.keys()
        if clash:
            raise StoreFormatError(
                f"{path!r} of {name!r} repeats tensors of another shard: {sorted(clash)[:5]}"
            )
        state.update(part)
    return state
