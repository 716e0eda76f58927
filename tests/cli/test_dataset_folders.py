"""Folders that are not stores, given where a store is expected: a LeRobot dataset is checked
(``verify``) or described (``info``) as one; another format's dataset or an empty folder
says what it is and how to import it, in one line, instead of "DAMAGED: no store shards"."""

from __future__ import annotations

import json

import pytest

from tests.lerobot.test_lerobot_roundtrip import record
from torchstore.cli import main
from torchstore.data.store import TrajectoryStore, open_store
from torchstore.errors import StoreFormatError
from torchstore.io.dataset_folders import folder_format, not_a_store

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "so101"
    record(root, (5, 7))
    return root


def _one_line(capsys) -> tuple[str, str]:
    captured = capsys.readouterr()
    assert len((captured.out + captured.err).strip().splitlines()) == 1, captured
    return captured.out, captured.err


def test_verify_checks_a_lerobot_folder_as_one(lerobot, capsys):
    assert main(["verify", str(lerobot)]) == 0
    out, _ = _one_line(capsys)
    assert out.startswith(f"{lerobot}: OK as a LeRobot v3.0 dataset (2 episodes, 12 frames;")
    assert "1 data file complete to their Parquet footers, 1 video present" in out
    assert "LeRobot keeps no checksums" in out and f"torchstore import {lerobot} so101.h5" in out
    assert "no store shards" not in out


def test_verify_names_a_damaged_lerobot_folder(lerobot, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(lerobot, broken)
    data = next((broken / "data").rglob("*.parquet"))
    data.write_bytes(data.read_bytes()[:-8])  # the footer cut off, as a killed recorder leaves it
    next((broken / "videos").rglob("*.mp4")).unlink()
    assert main(["verify", str(broken)]) == 1
    _, err = _one_line(capsys)
    assert err.startswith(f"torchstore verify: {broken}: DAMAGED: {data} has no Parquet footer")
    assert ".mp4 is missing" in err
    (broken / "meta" / "info.json").write_text("{not json")
    assert main(["verify", str(broken)]) == 1
    assert "info.json is not valid JSON" in _one_line(capsys)[1]


def test_info_shows_the_robot_type_and_each_cameras_codec_and_gop(lerobot, capsys):
    assert main(["info", str(lerobot)]) == 0
    out = capsys.readouterr().out
    assert "robot type so101_follower" in out and "env id" not in out and "seed" not in out
    front = next(line for line in out.splitlines() if line.startswith("observation.images.front"))
    assert front.split()[1:] == ["video", "48x64x3", "av1", "gop", "2", "crf", "30", "(MP4)"]
    wrist = next(line for line in out.splitlines() if line.startswith("observation.images.wrist"))
    assert wrist.endswith("png (in Parquet)")
    assert main(["info", str(lerobot), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["robot_type"] == "so101_follower" and info["env_id"] is None
    columns = {c["name"]: c for c in info["columns"]}
    assert columns["observation.images.front"]["video"] == {"codec": "av1", "gop": 2, "crf": 30}


def test_a_camera_whose_gop_was_not_recorded_says_so(lerobot, tmp_path, capsys):
    import shutil

    older = tmp_path / "older"
    shutil.copytree(lerobot, older)
    info = json.loads((older / "meta" / "info.json").read_text())
    for key in ("video.g", "video.crf"):  # lerobot before 0.6 recorded no encoder settings
        del info["features"]["observation.images.front"]["info"][key]
    (older / "meta" / "info.json").write_text(json.dumps(info))
    assert main(["info", str(older)]) == 0
    assert "av1 gop not recorded (MP4)" in capsys.readouterr().out


def test_an_empty_folder_holds_no_store(tmp_path, capsys):
    for command in ("verify", "info"):
        assert main([command, str(tmp_path)]) == 1
        _, err = _one_line(capsys)
        assert err == f"torchstore {command}: {tmp_path} is an empty folder: it holds no store\n"


def test_another_formats_folder_says_how_to_import_it(tmp_path, capsys):
    zarr = tmp_path / "pusht.zarr"
    zarr.mkdir()
    (zarr / ".zgroup").write_text('{"zarr_format": 2}')
    assert folder_format(zarr) == "zarr"
    assert main(["verify", str(zarr)]) == 1
    _, err = _one_line(capsys)
    assert err == (
        f"torchstore verify: {zarr} is a zarr dataset, not a store: import it first with "
        f"`torchstore import {zarr} pusht.zarr.h5`\n"
    )


def test_opening_a_lerobot_folder_as_a_store_says_to_import_it(lerobot, tmp_path):
    expected = (
        f"{lerobot} is a LeRobot dataset, not a store: import it first with "
        f"`torchstore import {lerobot} so101.h5`"
    )
    assert not_a_store(lerobot) == expected
    for opener in (TrajectoryStore, open_store):
        with pytest.raises(StoreFormatError) as caught:
            opener(lerobot)
        assert str(caught.value) == expected
    with pytest.raises(StoreFormatError, match="is an empty folder: it holds no store"):
        TrajectoryStore(tmp_path)
    assert not_a_store(tmp_path, empty=False) is None
