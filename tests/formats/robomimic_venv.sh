#!/usr/bin/env bash
# A venv with the real robomimic 0.3.0 for tests/formats/test_robomimic_interop.py, which CI
# skips (robomimic is not a dependency). Usage, from the repo root:
#   bash tests/formats/robomimic_venv.sh [VENV]        # VENV: /tmp/robomimic by default
#   VENV/bin/python -m pytest tests/formats/test_robomimic_interop.py -q -n 0
# robomimic 0.3.0's own requirements pull egl_probe (a CMake build) and tensorboard, which
# its dataset and file modules never use: it is installed --no-deps with what those modules
# import. Its models import torchvision; PyPI's torchvision needs the torch it was built
# with, so the venv takes torch 2.14.1 with torchvision 0.29.1 (a CUDA build of several GB
# on Linux; nothing here uses a GPU).
set -euo pipefail
V="${1:-/tmp/robomimic}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python3.11 -m venv "$V"
"$V/bin/pip" install -q torch==2.14.1 torchvision==0.29.1 h5py numpy tqdm termcolor psutil \
    imageio six matplotlib pytest "pytest-xdist>=3.5" pytest-timeout hypothesis
"$V/bin/pip" install -q --no-deps robomimic==0.3.0
"$V/bin/pip" install -q -e "$REPO"
"$V/bin/python" -c "import robomimic.utils.dataset, robomimic.utils.file_utils, torchstore.formats; print('robomimic ready')"
