"""``python -m torchstore``: the same as the ``torchstore`` command (as ``python -m pip``)."""

import sys

from torchstore.cli.main import main

sys.exit(main())
