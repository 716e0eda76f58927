"""``python -m torchstore.cli``: the same as the ``torchstore`` command."""

import sys

from torchstore.cli.main import main

sys.exit(main())
