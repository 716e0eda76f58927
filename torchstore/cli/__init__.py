"""The ``torchstore`` command line: ``main.py`` parses and dispatches, one module per group."""

from torchstore.cli.main import main

__all__ = ["main"]
