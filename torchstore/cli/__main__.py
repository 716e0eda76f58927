"""``python -m torchstore.cli``: the same as the ``torchstore`` command."""

import signal
import sys

from torchstore.cli.main import EXIT_INTERRUPTED, main

status = main()
try:
    # a Ctrl-C after the command's last line would otherwise print a traceback on the way out
    signal.signal(signal.SIGINT, signal.SIG_IGN)
except KeyboardInterrupt:  # one already pending runs as the handler is replaced
    print("interrupted", file=sys.stderr)
    status = EXIT_INTERRUPTED
sys.exit(status)
