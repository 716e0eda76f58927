#!/usr/bin/env bash
# A self-contained venv with TensorFlow and tensorflow-datasets, the judge of the RLDS importer
# (torchstore/formats/rlds.py), for the tfds-only test in tests/formats/test_rlds.py, the
# fixture generator tests/formats/make_rlds_fixture.py and benchmarks/formats_rlds.py. CI has
# no TensorFlow: those parts skip there. Usage, from the repo root:
#   bash tests/formats/tfds_venv.sh [VENV]
#   VENV/bin/python -m pytest tests/formats/test_rlds.py -n 0 -q -rs
#   VENV/bin/python tests/formats/make_rlds_fixture.py      # rewrite the shipped fixture
#   VENV/bin/python benchmarks/formats_rlds.py
# VENV: /tmp/tfds by default. Python 3.11.
#
# The venv holds tensorflow-cpu, tensorflow-datasets (its writer and builder_from_directory),
# pillow, pytest and pytest-xdist (setup.cfg's pytest options pass -n), and torchstore
# installed editable from this checkout. It is made with --system-site-packages when the
# base python already has torch, so the base's CPU torch is used: the Python package index
# has no CPU-only Linux torch, and torchstore's pin would pull a multi-GB CUDA build.
# Without torch in the base python, pip installs torch into the venv (set TFDS_ISOLATED=1 to
# force that).
# tensorflow-datasets needs no apache-beam, rlds or array_record to write a small dataset:
# its builders write TFRecord shards with TensorFlow's own writer. It does need
# importlib_resources, which tensorflow-datasets 4.9.10 imports (through etils.epath) but
# does not declare: without it builder_from_directory fails with ModuleNotFoundError.
# google-crc32c, simplejpeg and pillow are what import_rlds itself needs.
# Set PIP_NICE="" to install at normal priority (default: nice -n 19).
set -euo pipefail
V="${1:-/tmp/tfds}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TF_VERSION="${TF_VERSION:-2.21.0}"
TFDS_VERSION="${TFDS_VERSION:-4.9.10}"
if command -v python3.11 >/dev/null && python3.11 -c "" 2>/dev/null; then
    PYTHON=python3.11
elif command -v pyenv >/dev/null; then  # pyenv shims: pick an installed 3.11.x
    export PYENV_VERSION="$(pyenv versions --bare | grep -E '^3\.11\.[0-9]+$' | sort -V | tail -1)"
    PYTHON=python3.11
else
    echo "needs python3.11" >&2
    exit 1
fi
SITE=()
if [ -z "${TFDS_ISOLATED:-}" ] && "$PYTHON" -c "import torch" 2>/dev/null; then
    SITE=(--system-site-packages)
fi
"$PYTHON" -m venv "${SITE[@]}" "$V"
NICE=(${PIP_NICE-nice -n 19})
"${NICE[@]}" "$V/bin/python" -m pip install -q --upgrade pip
"${NICE[@]}" "$V/bin/pip" install -q "tensorflow-cpu==$TF_VERSION" \
    "tensorflow-datasets==$TFDS_VERSION" importlib_resources numpy pillow pytest \
    "pytest-xdist>=3.5" google-crc32c simplejpeg
"${NICE[@]}" "$V/bin/pip" install -q -e "$REPO"
SP=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf "$SP/tests"  # a dependency's top-level "tests" package would hide this repo's tests/
"$V/bin/python" -c "import tensorflow as tf, tensorflow_datasets as tfds, importlib_resources, torchstore; \
print('tensorflow', tf.__version__, 'tensorflow_datasets', tfds.__version__)"
echo "ready: $V/bin/python -m pytest tests/formats/test_rlds.py -n 0 -q -rs"
