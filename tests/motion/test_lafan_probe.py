"""The LAFAN1 sniff (torchstore/motion/lafan_probe.py): positive evidence of the G1 layout."""

from __future__ import annotations

import numpy as np

from tests.motion.lafan_fixtures import LinearMotion, frames_of, write_csv
from torchstore.formats.sniff import sniff_format
from torchstore.motion import lafan, lafan_probe
from torchstore.motion.lafan_probe import not_lafan


def test_the_probe_reads_the_layout_the_importer_reads():
    assert lafan_probe.G1_CSV_COLUMNS == len(lafan._FILE_COLUMNS) == lafan._NUM_COLUMNS


def test_a_long_file_is_probed_from_its_first_bytes(tmp_path):
    """A file far longer than PROBE_BYTES: the line the read cuts is not judged; a bad
    line past the probe is the importer's to name."""
    frames = frames_of(LinearMotion(), 400)
    path = write_csv(tmp_path / "walk1_subject1.csv", frames)
    assert path.stat().st_size > 4 * lafan_probe.PROBE_BYTES
    assert not_lafan(path) is None
    with open(path, "a") as fh:
        fh.write("1,2,3\n")
    assert not_lafan(tmp_path) is None and sniff_format(tmp_path) == "lafan"


def test_what_is_not_g1_is_named(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"\xff\xfe" + b"1,2\n")
    assert not_lafan(tmp_path / "a.csv") == "a.csv is not UTF-8 text"
    nan = ",".join(["nan"] + ["0"] * 35)
    (tmp_path / "a.csv").write_text(nan + "\n")
    assert not_lafan(tmp_path) == "a.csv line 1: 'nan', not a finite number"
    (tmp_path / "a.csv").unlink()
    (tmp_path / "notes.txt").write_text("1,2")
    assert not_lafan(tmp_path) == "no .csv files"


def test_frames_written_as_the_files_are_pass(tmp_path):
    frames = np.asarray(frames_of(LinearMotion(), 3))
    assert frames.shape[1] == lafan_probe.G1_CSV_COLUMNS
    write_csv(tmp_path / "a.csv", frames)
    write_csv(tmp_path / "b.CSV", frames)
    assert [p.name for p in lafan_probe.csv_files(tmp_path)] == ["a.csv", "b.CSV"]
    assert not_lafan(tmp_path) is None
