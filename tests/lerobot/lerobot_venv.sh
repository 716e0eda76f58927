#!/usr/bin/env bash
# A self-contained venv with the real lerobot for tests/lerobot/test_lerobot_interop.py,
# which CI skips (lerobot is not a dependency). Usage, from the repo root:
#   bash tests/lerobot/lerobot_venv.sh [VERSION] [VENV]
#   VENV/bin/python -m pytest tests/lerobot/test_lerobot_interop.py -q -rs
# VERSION: a lerobot release, 0.6.1 by default (0.6.x needs Python 3.12; 0.4.4 runs on 3.11).
# VENV: /tmp/lr06 for 0.6.x, /tmp/lr044 for 0.4.x by default.
# The venv holds its own torch (lerobot's pin, from the package index: a large download),
# lerobot[dataset] (datasets, pyarrow, av, torchcodec), safetensors, pytest, and torchstore
# installed editable from this checkout with its dependencies.
#
# Work-arounds, each for a measured reason:
# - draccus ships a top-level "tests" package that hides this repo's tests/: removed.
# - numpy < 2.4 for lerobot 0.4.x: its save_episode fails on shape-[1] features with numpy 2.4.
# - torchcodec needs FFmpeg shared libraries matching its build (e.g. libavutil.so.60 for
#   torchcodec 0.11); without them its tests skip and lerobot's "pyav" backend is tested.
# Set PIP_NICE="" to install at normal priority (default: nice -n 19).
set -euo pipefail
VERSION="${1:-0.6.1}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
case "$VERSION" in
    0.4.*) PY=3.11; V="${2:-/tmp/lr044}"; EXTRA=("numpy<2.4") ;;
    *) PY=3.12; V="${2:-/tmp/lr06}"; EXTRA=() ;;
esac
if command -v "python$PY" >/dev/null && "python$PY" -c "" 2>/dev/null; then
    PYTHON="python$PY"
elif command -v pyenv >/dev/null; then  # pyenv shims: pick an installed $PY.x
    export PYENV_VERSION="$(pyenv versions --bare | grep -E "^$PY\.[0-9]+$" | sort -V | tail -1)"
    PYTHON="python$PY"
else
    echo "needs python$PY for lerobot $VERSION" >&2
    exit 1
fi
"$PYTHON" -m venv "$V"
NICE=(${PIP_NICE-nice -n 19})
"${NICE[@]}" "$V/bin/python" -m pip install -q --upgrade pip
"${NICE[@]}" "$V/bin/pip" install -q "lerobot[dataset]==$VERSION" safetensors pytest "${EXTRA[@]}" \
    -e "$REPO"
SP=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf "$SP/tests"
"$V/bin/python" -c "import lerobot.datasets.lerobot_dataset, torch, torchstore.lerobot, safetensors; \
from importlib.metadata import version; print('lerobot', version('lerobot'), 'torch', torch.__version__)"
echo "ready: $V/bin/python -m pytest tests/lerobot/test_lerobot_interop.py -q -rs"
