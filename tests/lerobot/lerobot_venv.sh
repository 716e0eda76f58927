#!/usr/bin/env bash
# A venv with the real lerobot 0.4.4 (the newest that installs on Python 3.11; format
# v3.0) for tests/lerobot/test_lerobot_interop.py, which CI skips (lerobot is not a
# dependency). Usage, from the repo root:  bash tests/lerobot/lerobot_venv.sh [VENV]
# It sees the system torch 2.13 CPU, pyarrow, av and torchstore (--system-site-packages).
#
# Work-arounds, each for a measured reason:
# - torchvision 0.25.0: inside lerobot's pin and still has torchvision.io.VideoReader,
#   which lerobot's "pyav" backend needs. Every torchvision wheel on the registry is a
#   CUDA build whose _C fails to load against the CPU torch, and torchvision then dies
#   registering a fake kernel for an undefined op; the shim below defines the op schemas
#   (no kernels) first, so the pure-Python part of torchvision imports.
# - draccus ships a top-level "tests" package that hides this repo's tests/: removed.
# - numpy < 2.4: lerobot 0.4.4's save_episode fails on shape-[1] features with numpy 2.4.
# - torchcodec 0.13.0 loads against the CPU torch when FFmpeg 5.1 shared libraries are
#   installed (Debian: libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4
#   libavfilter8 libavdevice59); without them its tests skip and PyAV is used.
set -euo pipefail
V="${1:-/tmp/lrvenv}"
python3.11 -m venv --system-site-packages "$V"
P="$V/bin/pip"
$P install -q --no-deps lerobot==0.4.4
$P install -q datasets draccus==0.10.0 jsonlines einops deepdiff termcolor pandas
$P install -q --no-deps "accelerate>=1.10,<2" torchvision==0.25.0 torchcodec==0.13.0 "numpy<2.4"
SP=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf "$SP/tests"
cat > "$SP/_torchvision_cpu_shim.py" <<'PY'
import importlib.abc
import sys

_KEEP = []


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision._meta_registrations":
            return None
        sys.meta_path.remove(self)
        import torch
        import torchvision.extension

        if not torchvision.extension._has_ops():
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
            _KEEP.append(lib)
        return None


sys.meta_path.insert(0, _Finder())
PY
echo "import _torchvision_cpu_shim" > "$SP/_torchvision_cpu_shim.pth"
echo "ready: $V/bin/python -m pytest tests/lerobot/test_lerobot_interop.py -q"
