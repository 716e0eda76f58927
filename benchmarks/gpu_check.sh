#!/usr/bin/env bash
# The CUDA checks in one command: the gpu-marked tests, then the device-path benchmark on
# CUDA (CPU too), each bounded in time.
#
# Needs: a CUDA device, and a Python with torch (CUDA build), tensordict, torchrl, h5py,
# xxhash, numpy, numba, pytest and hypothesis importable (installed, or on PYTHONPATH).
#
# Usage: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 - <<'PY' || exit 1
import importlib.util
import sys

needed = ("torch", "tensordict", "torchrl", "h5py", "xxhash", "numpy", "numba", "pytest",
          "hypothesis")
missing = [m for m in needed if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check.sh needs these Python packages: {', '.join(missing)}")
import torch

if not torch.cuda.is_available():
    sys.exit("gpu_check.sh needs a CUDA device; torch sees none")
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
PY
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/samplers/test_device.py
timeout 240 python3 benchmarks/device_sampling.py --no-compile --rows 1000000 --threads 0
