"""torchrl's own C++ segment trees, built from the sources its wheel ships for the torch here.

The prebuilt ``torchrl._torchrl`` extension may not load with the installed torch (an ABI
mismatch), which leaves ``torchrl.data.PrioritizedSampler`` without its trees. This module
compiles the wheel's ``torchrl/csrc`` (``pybind.cpp`` and ``utils.cpp``, CPU only) with
``torch.utils.cpp_extension.load`` into a cache directory, and installs the trees into
torchrl's prioritized sampler module, so torchrl's sampler runs on its own C++ code. The first
build takes minutes (about 6 on 2 cores); a cached build loads in seconds.

Usage: python benchmarks/_torchrl_tree.py   (builds, or loads the cached build, and reports)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TREE_NAMES = (
    "MinSegmentTreeFp32",
    "MinSegmentTreeFp64",
    "SumSegmentTreeFp32",
    "SumSegmentTreeFp64",
)


def build_directory() -> Path:
    import torch

    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    tag = torch.__version__.replace("+", "_")
    return base / "torchstore-benchmarks" / f"torchrl-csrc-torch{tag}"


def torchrl_sources() -> list[Path]:
    import torchrl

    csrc = Path(torchrl.__file__).resolve().parent / "csrc"
    sources = [csrc / "pybind.cpp", csrc / "utils.cpp"]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"torchrl's wheel ships no C++ sources at {', '.join(missing)}")
    return sources


def load_torchrl_tree(*, verbose: bool = False):
    """Build (or load the cached build of) torchrl's csrc; install its trees into torchrl.

    Returns the extension module. After this, ``torchrl.data.PrioritizedSampler`` constructs
    its C++ ``SumSegmentTreeFp32`` / ``MinSegmentTreeFp32`` as it would from its wheel.
    """
    from torch.utils.cpp_extension import load
    from torchrl.data.replay_buffers.samplers import prioritized as trl_prioritized

    out = build_directory()
    out.mkdir(parents=True, exist_ok=True)
    cached = (out / "_torchrl.so").is_file()
    print(f"torchrl's C++ trees: {'loading the cached build' if cached else 'building'} in {out}")
    t0 = time.perf_counter()
    ext = load(
        name="_torchrl",
        sources=[str(p) for p in torchrl_sources()],
        extra_cflags=["-O3"],
        build_directory=str(out),
        verbose=verbose,
    )
    for name in TREE_NAMES:
        setattr(trl_prioritized, name, getattr(ext, name))
    print(f"torchrl's C++ trees ready in {time.perf_counter() - t0:.1f} s ({ext.__file__})")
    return ext


def main() -> None:
    load_torchrl_tree(verbose=True)


if __name__ == "__main__":
    main()
