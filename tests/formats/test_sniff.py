"""``torchstore import SRC DEST`` tells all seven formats apart, and ``export --to`` writes four."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.formats.robomimic_files import write_robomimic
from tests.minari_datasets.test_d4rl import _d4rl_file
from tests.motion.lafan_fixtures import LinearMotion, frames_of, write_csv
from torchstore import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.cli import main
from torchstore.demo import write_demo_store
from torchstore.errors import DatasetFormatError
from torchstore.formats.sniff import FORMATS, sniff_format

FIXTURES = Path(__file__).parent / "fixtures"


def _robomimic(tmp: Path) -> Path:
    return write_robomimic(tmp / "lift.hdf5", lengths=(3, 4))


def _d4rl(tmp: Path) -> Path:
    _d4rl_file(tmp / "hopper.hdf5")
    return tmp / "hopper.hdf5"


def _zarr(tmp: Path) -> Path:
    return shutil.copytree(FIXTURES / "pusht_tiny.zarr", tmp / "pusht.zarr")


def _zarr_zip(tmp: Path) -> Path:
    return Path(shutil.copy(FIXTURES / "pusht_tiny.zarr.zip", tmp / "pusht.zarr.zip"))


def _rlds(tmp: Path) -> Path:
    return shutil.copytree(FIXTURES / "rlds_tiny", tmp / "rlds_tiny")


def _lafan(tmp: Path) -> Path:
    return write_csv(tmp / "walk1_subject1.csv", frames_of(LinearMotion(), 12))


def _demo_store(tmp: Path) -> Path:
    return write_demo_store(tmp / "pendulum.h5", episodes=3, steps=10)


def _lerobot(tmp: Path) -> Path:
    from torchstore.lerobot import export_lerobot

    return export_lerobot(_demo_store(tmp), tmp / "lerobot", fps=10, progress=False).path


def _minari(tmp: Path) -> Path:
    pytest.importorskip("minari")
    from torchstore.minari import export_minari

    cols = [
        ColumnSpec("obs", "float32", (3,)),
        ColumnSpec("next/obs", "float32", (3,)),
        ColumnSpec("action", "float32", (1,)),
        ColumnSpec("reward", "float64"),
        ColumnSpec("terminated", "bool"),
        ColumnSpec("truncated", "bool"),
    ]
    with TrajectoryStoreWriter(tmp / "s.h5", cols, env_id="Pendulum-v1") as w:
        for n in (4, 5):
            w.add_episode(
                {
                    "obs": np.ones((n, 3), np.float32),
                    "next": {"obs": np.ones((n, 3), np.float32)},
                    "action": np.zeros((n, 1), np.float32),
                    "reward": np.ones(n),
                    "terminated": np.arange(n) == n - 1,
                    "truncated": np.zeros(n, bool),
                }
            )
    return export_minari(tmp / "s.h5", "pendulum/demo-v0", root=tmp / "minari", progress=False)


SOURCES = {
    "robomimic": _robomimic,
    "d4rl": _d4rl,
    "zarr": _zarr,
    "zarr zip": _zarr_zip,
    "rlds": _rlds,
    "lerobot": _lerobot,
    "minari": _minari,
    "lafan": _lafan,
}


@pytest.mark.parametrize("case", SOURCES)
def test_import_sniffs_the_format_and_writes_a_store(case, tmp_path, capsys):
    src = SOURCES[case](tmp_path)
    fmt = case.split()[0]
    assert sniff_format(src) == fmt
    dest = tmp_path / "out" / "store.h5"
    assert main(["import", str(src), str(dest), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"reading {src} as {fmt}" in out and str(dest) in out  # "wrote" or "imported"
    assert TrajectoryStore(dest).num_episodes > 0


def test_every_format_is_covered():
    assert {c.split()[0] for c in SOURCES} == set(FORMATS)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p.write_text("hello") and p, "no format torchstore knows"),
        (lambda p: (p.mkdir(), p)[1], "a folder of no format"),
        (lambda p: _h5(p), "no format torchstore knows"),
    ],
)
def test_what_it_cannot_identify_is_one_line_naming_the_formats(make, words, tmp_path, capsys):
    src = make(tmp_path / "thing")
    with pytest.raises(DatasetFormatError, match=words):
        sniff_format(src)
    assert main(["import", str(src), str(tmp_path / "s.h5")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(f in err[0] for f in FORMATS)
    assert not (tmp_path / "s.h5").exists()


def _csv_folder(path: Path, *texts: str) -> Path:
    path.mkdir()
    for i, text in enumerate(texts):
        (path / f"table{i}.csv").write_text(text)
    return path


G1_ROW = ",".join(["0.5"] * 3 + ["0", "0", "0", "1"] + ["0.1"] * 29) + "\n"


@pytest.mark.parametrize(
    ("texts", "why"),
    [
        (("id,name,score\n1,ada,3\n",), "table0.csv line 1: 3 comma-separated columns"),
        (("\n\n1,2,3,4,5\n",), "table0.csv line 3: 5 comma-separated columns, not 36"),
        ((G1_ROW * 3, "x,y\n1,2\n"), "table1.csv line 1: 2 comma-separated columns"),
        (("joint," * 35 + "joint\n" + G1_ROW,), "table0.csv line 1: 'joint', not a number"),
        ((G1_ROW * 2 + ",".join(["1"] * 35) + "\n",), "table0.csv line 3: 35 comma-separated"),
        (("",), "table0.csv holds no rows"),
    ],
    ids=["other-table", "blank-lines-first", "one-of-two", "header-row", "third-line", "empty"],
)
def test_csv_files_are_lafan_only_when_every_one_has_the_g1_layout(texts, why, tmp_path, capsys):
    src = _csv_folder(tmp_path / "tables", *texts)
    with pytest.raises(DatasetFormatError) as info:
        sniff_format(src)
    message = str(info.value)
    assert "a folder of no format torchstore knows" in message and why in message
    assert "G1 column" not in message  # not the LAFAN1 importer's own refusal
    single = sorted(src.iterdir())[-1]
    with pytest.raises(DatasetFormatError, match="a file of no format torchstore knows"):
        sniff_format(single)
    dest = tmp_path / "out" / "s.h5"
    assert main(["import", str(src), str(dest)]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and why in err[0] and all(f in err[0] for f in FORMATS)
    assert "reading" not in captured.out and not dest.parent.exists()


def test_a_folder_of_g1_csv_files_is_lafan(tmp_path):
    src = _csv_folder(tmp_path / "g1", G1_ROW * 4, "\ufeff" + G1_ROW.replace("\n", "\r\n") * 2)
    assert sniff_format(src) == "lafan"
    assert sniff_format(src / "table1.csv") == "lafan"


def _h5(path: Path) -> Path:
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros(3)
    return path


def test_a_store_is_not_imported_again(tmp_path, capsys):
    store = _demo_store(tmp_path)
    assert main(["import", str(store), str(tmp_path / "s.h5")]) == 1
    assert "already a torchstore store" in capsys.readouterr().err


@pytest.mark.parametrize("to", ["robomimic", "zarr", "lerobot"])
def test_export_writes_each_format_and_import_reads_it_back(to, tmp_path, capsys):
    src = write_robomimic(tmp_path / "lift.hdf5", lengths=(3, 4))
    store = tmp_path / "s.h5"
    assert main(["import", str(src), str(store), "--no-progress"]) == 0
    dest = tmp_path / {"robomimic": "out.hdf5", "zarr": "out.zarr", "lerobot": "out_lerobot"}[to]
    args = ["--fps", "10"] if to == "lerobot" else []
    assert main(["export", str(store), str(dest), "--to", to, "--no-progress", *args]) == 0
    back = tmp_path / "back.h5"
    assert main(["import", str(dest), str(back), "--no-progress"]) == 0
    assert f"as {to}" in capsys.readouterr().out
    a, b = TrajectoryStore(store), TrajectoryStore(back)
    assert b.num_rows == a.num_rows and b.num_episodes == a.num_episodes


def _empty_data(tmp: Path) -> Path:
    with h5py.File(tmp / "empty.hdf5", "w") as f:
        f.create_group("data")
    return tmp / "empty.hdf5"


def _zarr_without_ends(tmp: Path) -> Path:
    src = _zarr(tmp)
    shutil.rmtree(src / "meta" / "episode_ends")
    return src


def _rlds_without_features(tmp: Path) -> Path:
    src = _rlds(tmp)
    (src / "1.0.0" / "features.json").unlink()
    return src


def _zero_bytes(tmp: Path) -> Path:
    (tmp / "cut.hdf5").write_bytes(b"")
    return tmp / "cut.hdf5"


@pytest.mark.parametrize(
    ("make", "fmt", "words"),
    [
        (_empty_data, "robomimic", "holds no demos"),
        (_zarr_without_ends, "zarr", "episode_ends"),
        (_rlds_without_features, "rlds", "features.json"),
        (_zero_bytes, None, "not readable HDF5"),
    ],
)
def test_a_source_with_a_formats_marker_gets_that_importers_own_refusal(
    make, fmt, words, tmp_path, capsys
):
    src = make(tmp_path)
    dest = tmp_path / "out" / "s.h5"
    assert main(["import", str(src), str(dest), "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert words in captured.err and len(captured.err.strip().splitlines()) == 1
    if fmt is not None:
        assert f"as {fmt}" in captured.out
    assert not dest.parent.exists()


def test_a_zip_holding_one_zarr_folder_is_sniffed(tmp_path):
    import zipfile

    src = _zarr(tmp_path)
    zipped = tmp_path / "folder.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        for path in sorted(src.rglob("*")):
            if path.is_file():
                z.write(path, f"pusht.zarr/{path.relative_to(src)}")
    assert sniff_format(zipped) == "zarr"
    assert TrajectoryStore(main_import(zipped, tmp_path / "s.h5")).num_episodes == 3


def main_import(src: Path, dest: Path) -> Path:
    assert main(["import", str(src), str(dest), "--no-progress"]) == 0
    return dest


def test_options_of_another_format_and_an_existing_dest_are_refused_first(tmp_path, capsys):
    src = _robomimic(tmp_path)
    assert main(["import", str(src), str(tmp_path / "a.h5"), "--split", "val"]) == 1
    assert "--split applies to rlds sources" in capsys.readouterr().err
    assert main(["import", str(src), str(tmp_path / "a.h5"), "--env-id", "X-v0"]) == 1
    assert "--env-id applies to d4rl" in capsys.readouterr().err
    main_import(src, tmp_path / "a.h5")
    capsys.readouterr()
    assert main(["import", str(src), str(tmp_path / "a.h5")]) == 1
    captured = capsys.readouterr()
    assert "already exists" in captured.err and "reading" not in captured.out
