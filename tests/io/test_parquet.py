"""torchstore.io.records.parquet: complete-file checks and guarded reads, format-neutral errors."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torchstore.errors import LeRobotFormatError, ParquetFormatError, TorchstoreError
from torchstore.io.records.parquet import check_footer, read_table, write_table_atomically


def _table():
    return pa.table({"x": pa.array([1, 2, 3], pa.int64())})


def test_atomic_write_reads_back(tmp_path):
    path = tmp_path / "a" / "t.parquet"
    write_table_atomically(path, [_table(), _table()])
    assert read_table(path).column("x").to_pylist() == [1, 2, 3] * 2
    assert pq.ParquetFile(path).num_row_groups == 2
    assert [p.name for p in path.parent.iterdir()] == ["t.parquet"]  # no temporary left


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda p: p.unlink(), r"t\.parquet is missing"),
        (lambda p: p.write_bytes(b"not parquet at all"), "not a Parquet file .no PAR1 header"),
        (lambda p: p.write_bytes(p.read_bytes()[:-20]), "no Parquet footer.*not finalized"),
    ],
)
def test_broken_files_raise_parquet_format_error_naming_the_file(tmp_path, damage, match):
    path = tmp_path / "t.parquet"
    write_table_atomically(path, _table())
    damage(path)
    for call in (check_footer, read_table):
        with pytest.raises(ParquetFormatError, match=match) as info:
            call(path)
        assert isinstance(info.value, ValueError) and isinstance(info.value, TorchstoreError)
        assert not isinstance(info.value, LeRobotFormatError)  # io knows no dataset format


def test_the_lerobot_layer_raises_lerobot_format_error(tmp_path):
    from torchstore.lerobot.parquet_files import read_table as read_lerobot_table

    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1 and no footer")
    with pytest.raises(LeRobotFormatError, match="no Parquet footer") as info:
        read_lerobot_table(path, what="data/chunk-000/file-000.parquet")
    assert isinstance(info.value.__cause__, ParquetFormatError)
    assert "data/chunk-000/file-000.parquet" in str(info.value)
