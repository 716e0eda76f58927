"""Offline-RL datasets in and out: Minari (both formats, both ways) and D4RL-style HDF5.

:func:`import_minari` and :func:`export_minari` need the ``minari`` package
(``pip install -e ".[interop]"``); :func:`import_d4rl` needs only h5py.
"""

from torchstore.minari.d4rl import import_d4rl
from torchstore.minari.exporter import export_minari
from torchstore.minari.importer import import_minari

__all__ = ["import_minari", "export_minari", "import_d4rl"]
