"""Without Ray installed, torchstore imports and the Ray entry points say what to install.

Apart from tests/distributed/test_ray_replay.py (Ray-marked, one test worker for all Ray
tests): this one starts no cluster, and runs where Ray is not installed too.
"""

from __future__ import annotations

import subprocess
import sys


def test_without_ray_the_package_imports_and_says_what_to_install():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import torchstore, torchstore.data, torchstore.distributed as d\n"
        "from torchstore.data import StoreSet\n"
        "try:\n"
        "    d.serve_replay(10, batch_size=2)\n"
        "except d.RayUnavailableError as exc:\n"
        "    assert isinstance(exc, ImportError) and 'pip install -e \".[ray]\"' in str(exc)\n"
        "    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "refused", out.stderr
