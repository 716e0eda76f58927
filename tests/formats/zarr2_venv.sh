#!/usr/bin/env bash
# A small venv with zarr 2 (what diffusion-policy's ReplayBuffer runs on), the other side of
# the zarr v2 tests: tests/formats/make_zarr_fixture.py writes the shipped fixture
# (tests/formats/fixtures/pusht_tiny.*) with it, and tests/formats/test_zarr.py has zarr 2
# read what export_zarr wrote (that test skips where the venv is missing, as in CI).
# Usage, from the repo root:
#   bash tests/formats/zarr2_venv.sh [VENV]
#   VENV/bin/python tests/formats/make_zarr_fixture.py      # rewrite the shipped fixture
#   python -m pytest tests/formats/test_zarr.py -n 0 -q -rs  # the project's python (zarr 3)
# VENV: /tmp/zarr2 by default (test_zarr.py looks there, or at $ZARR2_PYTHON). Python 3.11.
# numcodecs < 0.16: the line zarr 2.18 was released against (0.15.2 used; 0.16 not tried).
# Set PIP_NICE="" to install at normal priority (default: nice -n 19).
set -euo pipefail
V="${1:-/tmp/zarr2}"
if command -v python3.11 >/dev/null && python3.11 -c "" 2>/dev/null; then
    PYTHON=python3.11
elif command -v pyenv >/dev/null; then  # pyenv shims: pick an installed 3.11.x
    export PYENV_VERSION="$(pyenv versions --bare | grep -E '^3\.11\.[0-9]+$' | sort -V | tail -1)"
    PYTHON=python3.11
else
    echo "needs python3.11" >&2
    exit 1
fi
"$PYTHON" -m venv "$V"
NICE=(${PIP_NICE-nice -n 19})
"${NICE[@]}" "$V/bin/pip" install -q "zarr>=2.18,<3" "numcodecs<0.16" numpy
"$V/bin/python" -c "import zarr, numcodecs; print('zarr', zarr.__version__, 'numcodecs', \
numcodecs.__version__)"
