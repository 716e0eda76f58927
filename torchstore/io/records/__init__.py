"""Record formats read and written as bytes: TFRecord files of ``tf.train.Example`` and Parquet.

:mod:`.tfrecord` frames records and parses Examples without TensorFlow (:mod:`._varints`
decodes packed varints in a compiled loop); :mod:`.parquet` reads and writes Parquet files
through pyarrow with complete-file checks and atomic replaces.

It knows record framing, CRCs and tables; it must not know what the records mean (RLDS
episodes and LeRobot frames are ``torchstore.formats`` and ``torchstore.lerobot``), nor HDF5,
frames or HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.io.records.parquet import read_table, write_table_atomically
    from torchstore.io.records.tfrecord import iter_records, parse_example, write_records

_EXPORTS = {
    "iter_records": ".tfrecord",
    "parse_example": ".tfrecord",
    "write_records": ".tfrecord",
    "read_table": ".parquet",
    "write_table_atomically": ".parquet",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "iter_records",
    "parse_example",
    "write_records",
    "read_table",
    "write_table_atomically",
]
