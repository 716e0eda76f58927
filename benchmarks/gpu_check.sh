#!/usr/bin/env bash
# The CUDA checks in one command, from a machine that has only this repository, a CUDA GPU
# with its driver, and a Python with pip:
#
#   1. installs what is missing (this package with its video extra, without touching an
#      installed CUDA torch, plus simplejpeg, pytest and hypothesis), from the package index
#      or, with --wheels DIR, from wheels in DIR alone (for a machine without an index);
#   2. runs the gpu-marked tests;
#   3. runs benchmarks/device_sampling.py on CUDA: graph-replayed sample_into against
#      torchrl's eager rb.sample() on the same GPU (target >= 10x), and the other device cases;
#   4. runs benchmarks/gpu_decode.py: video decoded on the GPU's decoder (decode_device="cuda")
#      against the CPU's decoders on the same packets.
#
# Every step is bounded in time (the whole run takes under 5 minutes once installed) and the
# run ends with the wall time of each step.
#
# Usage: bash benchmarks/gpu_check.sh [--wheels DIR] [--rows N]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
WHEELS=""
ROWS=1000000
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="$2"; shift 2 ;;
        --rows) ROWS="$2"; shift 2 ;;
        *) echo "gpu_check.sh: unknown argument $1 (takes --wheels DIR, --rows N)" >&2; exit 2 ;;
    esac
done
START=$SECONDS
STEPS=()
step_done() { STEPS+=("$1: $2 ($(( SECONDS - $3 )) s)"); }

# 1. what is missing, installed; a CUDA torch already there is kept (--no-deps for torch's
# dependents would be wrong, so torch itself is pinned to the installed version).
t=$SECONDS
missing=$("$PY" - <<'PY'
import importlib.util
needed = {"torch": "torch", "tensordict": "tensordict", "torchrl": "torchrl", "h5py": "h5py",
          "xxhash": "xxhash", "numpy": "numpy", "numba": "numba", "pytest": "pytest",
          "hypothesis": "hypothesis", "av": "av", "simplejpeg": "simplejpeg",
          "torchstore": "torchstore"}
print(" ".join(pkg for mod, pkg in needed.items() if importlib.util.find_spec(mod) is None))
PY
)
if [ -n "$missing" ]; then
    echo "installing: $missing"
    pins=()
    if "$PY" -c "import torch" 2>/dev/null; then
        pins+=("torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')")
    fi
    source_args=()
    if [ -n "$WHEELS" ]; then source_args=(--no-index --find-links "$WHEELS"); fi
    if ! timeout 600 "$PY" -m pip install -q "${source_args[@]}" -e ".[video]" simplejpeg pytest \
        hypothesis "${pins[@]}"; then
        echo "gpu_check.sh: installing $missing failed (see pip's message above)" >&2
        exit 1
    fi
fi
step_done "install" "${missing:-nothing missing}" "$t"

"$PY" - <<'PY' || exit 1
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("gpu_check.sh needs a CUDA device; torch sees none")
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
PY

# 2. the gpu-marked tests
t=$SECONDS
timeout 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider -p no:randomly -o addopts="" \
    tests/samplers/test_device.py tests/io/test_decode_device.py
step_done "gpu tests" "exit $?" "$t"

# 3. graph-replayed sampling against torchrl eager, on the GPU (and the CPU cases beside it)
t=$SECONDS
timeout 150 "$PY" benchmarks/device_sampling.py --no-compile --rows "$ROWS" --threads 0 \
    --repeats 21
step_done "device_sampling.py" "exit $?" "$t"

# 4. video decode on the GPU's decoder against the CPU's, same packets
t=$SECONDS
timeout 150 "$PY" benchmarks/gpu_decode.py --frames 240 --repeats 3
step_done "gpu_decode.py" "exit $?" "$t"

echo
echo "gpu_check.sh: $(( SECONDS - START )) s in all"
for line in "${STEPS[@]}"; do echo "  $line"; done
