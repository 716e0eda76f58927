"""A LeRobot MP4 whose sample entry names a codec FFmpeg does not know: one clear error
naming the file, from the packet reader, the frame reader and ``torchstore import`` (one
line, exit 1, nothing written), instead of an AttributeError from deep inside the demuxer."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("av")
pytest.importorskip("pyarrow")

from tests.formats.refused_import import refused_import  # noqa: E402
from tests.lerobot.test_lerobot_hostile import (  # noqa: E402
    FEATURES,
    FPS,
    LENGTHS,
    VIDEO,
    assert_refused,
    episode_rows,
)
from torchstore.errors import VideoError  # noqa: E402
from torchstore.io.frames.codec import packets_from_mp4  # noqa: E402
from torchstore.io.frames.video import VideoFrameReader  # noqa: E402
from torchstore.lerobot import LeRobotWriter  # noqa: E402

UNKNOWN = "codec FFmpeg does not know"


@pytest.fixture(scope="module")
def unknown_codec(tmp_path_factory):
    """A LeRobot dataset whose camera MP4's sample entry says ``zz01`` instead of ``av01``."""
    root = tmp_path_factory.mktemp("unknown") / "ds"
    with LeRobotWriter(root, fps=FPS, features=FEATURES) as w:
        for seed, n in enumerate(LENGTHS):
            w.add_episode(episode_rows(n, seed), task="pick")
    video = root / VIDEO
    data = video.read_bytes()
    entry = data.index(b"av01", data.index(b"stsd"))  # the sample entry, not the ftyp brand
    video.write_bytes(data[:entry] + b"zz01" + data[entry + 4 :])
    return root


@pytest.fixture
def ds(unknown_codec, tmp_path):
    root = tmp_path / "src" / "ds"
    shutil.copytree(unknown_codec, root)
    return root


def test_the_packet_reader_names_the_file(ds):
    with pytest.raises(VideoError, match=f"file-000.mp4: its video stream is in a {UNKNOWN}"):
        packets_from_mp4(ds / VIDEO, 0.0, LENGTHS[0] / FPS, FPS)


def test_the_frame_reader_names_the_file(ds):
    with pytest.raises(VideoError, match=f"file-000.mp4: its video stream is in a {UNKNOWN}"):
        VideoFrameReader(ds / VIDEO, fps=FPS)


@pytest.mark.parametrize("video", ["packets", "decode"])
def test_an_import_is_refused_naming_the_file(ds, tmp_path, video):
    from torchstore.lerobot import import_lerobot

    assert_refused(ds, tmp_path, VideoError, f"{VIDEO}: its video stream is in a {UNKNOWN}")
    with pytest.raises(VideoError, match=UNKNOWN):
        import_lerobot(ds, tmp_path / "other.h5", video=video, progress=False)
    assert not (tmp_path / "other.h5").exists()


def test_the_cli_import_prints_one_line_and_exits_1(ds, tmp_path):
    line = refused_import(ds, tmp_path / "out.h5")
    assert UNKNOWN in line and "file-000.mp4" in line and "episode 0, feature 'cam'" in line
