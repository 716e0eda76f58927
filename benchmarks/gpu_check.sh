#!/usr/bin/env bash
# The device checks in one call, for a session that is lent a GPU (the device tool's `run`).
# The lent machine has no package registry: carry the wheels torchstore needs that it lacks
# (tensordict, torchrl, h5py, xxhash, hypothesis, ... for its Python) as the device tool's
# README explains, put them on PYTHONPATH, then run `bash benchmarks/gpu_check.sh`.
# Runs the gpu-marked tests, then the device-path benchmark on CUDA, each bounded in time.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 - <<'PY' || exit 1
import importlib, sys
missing = [m for m in ("torch", "tensordict", "torchrl", "h5py", "xxhash", "numpy", "pytest", "hypothesis")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing on this machine: {', '.join(missing)} (carry them as wheels)")
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/samplers/test_device.py
timeout 240 python3 benchmarks/device_sampling.py --no-compile --rows 1000000 --threads 0
