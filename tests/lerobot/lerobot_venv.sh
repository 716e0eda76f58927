#!/usr/bin/env bash
# A self-contained venv with the real lerobot for tests/lerobot/test_lerobot_interop.py,
# which CI skips (lerobot is not a dependency). Usage, from the repo root:
#   bash tests/lerobot/lerobot_venv.sh [VERSION] [VENV]
#   VENV/bin/python -m pytest tests/lerobot/test_lerobot_interop.py -q -rs
# VERSION: a lerobot release, 0.6.1 by default (0.6.x needs Python 3.12; 0.4.4 runs on 3.11).
# VENV: /tmp/lr06 for 0.6.x, /tmp/lr044 for 0.4.x by default.
# The venv holds its own torch (lerobot's pin), lerobot[dataset] (datasets, pyarrow, av,
# torchcodec), safetensors, pytest and pytest-xdist (setup.cfg's pytest options pass -n),
# hypothesis (tests/conftest.py imports it), lightning (the DataModule interop cases), and
# torchstore installed editable from this checkout with its dependencies.
#
# torch: the Python package index has no CPU-only Linux build of torch, so lerobot's pin
# resolves to a CUDA build there (measured: the 0.6.1 venv is 5.7 GB, 3.9 GB of it torch
# 2.11 and its nvidia-* wheels; the 0.4.4 one 8.6 GB, 6.1 GB of it torch 2.10's; nothing
# here uses a GPU).
# Where PyTorch's CPU wheel index is reachable, point TORCH_INDEX_URL at it
# (TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu): it is added as an extra index,
# and its "+cpu" builds of the pinned versions rank above the CUDA ones.
#
# Work-arounds, each for a measured reason:
# - draccus ships a top-level "tests" package that hides this repo's tests/: removed.
# - numpy < 2.4 for lerobot 0.4.x: its save_episode fails on shape-[1] features with numpy 2.4.
# - torchcodec loads FFmpeg's shared libraries (libavutil, libavcodec, ... of FFmpeg 4 to 8
#   for torchcodec 0.10/0.11); without them its tests skip (the reason says so) and only
#   lerobot's "pyav" backend is tested. Debian 12's `apt-get install ffmpeg` (FFmpeg 5.1)
#   is enough; the script says when they are missing.
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
INDEX=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    INDEX=(--extra-index-url "$TORCH_INDEX_URL")
fi
"${NICE[@]}" "$V/bin/python" -m pip install -q --upgrade pip
"${NICE[@]}" "$V/bin/pip" install -q "${INDEX[@]}" "lerobot[dataset]==$VERSION" safetensors pytest \
    "pytest-xdist>=3.5" "hypothesis>=6.100" "lightning>=2.4,<3" "${EXTRA[@]}" -e "$REPO"
SP=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf "$SP/tests"
"$V/bin/python" -c "import lerobot.datasets.lerobot_dataset, torch, torchstore.lerobot, safetensors; \
from importlib.metadata import version; print('lerobot', version('lerobot'), 'torch', torch.__version__)"
if ! "$V/bin/python" -c "from torchcodec.decoders import VideoDecoder" 2>/dev/null; then
    # PyAV's wheel carries FFmpeg's libraries under hashed names (av.libs/libavutil-1a2b.so.59):
    # linked under their sonames in $V/ffmpeg-libs, torchcodec loads them from there
    # (benchmarks/cameras.py puts that folder on LD_LIBRARY_PATH for LeRobot's side)
    LIBS="$SP/av.libs"
    mkdir -p "$V/ffmpeg-libs"
    for f in "$LIBS"/libav*.so.* "$LIBS"/libsw*.so.*; do
        b=$(basename "$f")
        ln -sf "$f" "$V/ffmpeg-libs/${b%%-*}.so.$(echo "$b" | sed -E 's/.*\.so\.([0-9]+).*/\1/')"
    done
    if LD_LIBRARY_PATH="$V/ffmpeg-libs" "$V/bin/python" -c \
        "import torch; from torchcodec.decoders import VideoDecoder" 2>/dev/null; then
        echo "torchcodec loads PyAV's FFmpeg from $V/ffmpeg-libs (LD_LIBRARY_PATH=$V/ffmpeg-libs)"
    else
        echo "torchcodec cannot load FFmpeg's shared libraries: its tests will skip" \
            "(apt-get install ffmpeg, or FFmpeg 4-8 libraries on the library path, runs them)" >&2
    fi
fi
echo "ready: $V/bin/python -m pytest tests/lerobot/test_lerobot_interop.py -q -rs"
