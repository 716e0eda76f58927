#!/usr/bin/env bash
# The device checks in one call, for a session that is lent a GPU (device tool `run`):
#   run "bash benchmarks/gpu_check.sh" (timeout_s about 540)
# Installs the project, runs the gpu-marked tests, then the device-path benchmark on CUDA.
# Everything is bounded in time so the lent minutes are not lost to a hang.
set -uo pipefail
cd "$(dirname "$0")/.."
pip install -q torch==2.13.0 -e ".[dev]" 2>&1 | tail -2
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
timeout 240 python -m pytest -m gpu -q -p no:cacheprovider tests/samplers/test_device.py
timeout 240 python benchmarks/device_sampling.py --no-compile --rows 1000000 --threads 0
