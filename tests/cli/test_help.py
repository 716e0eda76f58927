"""``--help`` shows each option's default once, and ``encode`` the settings it falls back to."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from tests.cli.test_every_argument import COMMANDS
from torchstore.cli import main
from torchstore.cli.main import ENCODE_DEFAULTS, build_parser
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.io.frames.codec_types import FrameCodec


def _option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_every_option_shows_its_default_at_most_once(command):
    parser = COMMANDS[command]
    for action in parser._actions:
        text = _option_help(parser, action)
        assert text.count("(default") <= 1, (command, text)


def test_encode_help_shows_each_setting_once_with_the_codecs_defaults():
    encode = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["encode"]
    text = " ".join(encode.format_help().split())
    assert text.count("(default: av1)") == 1
    assert (
        "video quality, lower is better: av1 0-63, h264 0-51 (default: 30 for av1, 23 for h264)"
        in text
    )
    assert "video keyframe spacing in frames (default: 32)" in text
    assert "JPEG quality 1-100 (default: 90)" in text
    # the defaults written out in the help are the codecs' own
    av1, h264, jpeg = FrameCodec("av1"), FrameCodec("h264"), FrameCodec("jpeg")
    assert ENCODE_DEFAULTS == {
        "crf": f"{av1.crf} for av1, {h264.crf} for h264",
        "gop": str(av1.gop),
        "quality": str(jpeg.quality),
    }
    assert av1.gop == h264.gop


def test_encode_passes_a_setting_of_zero_instead_of_the_default(tmp_path, capsys):
    path = tmp_path / "raw.h5"
    rng = np.random.default_rng(0)
    with TrajectoryStoreWriter(path, [ColumnSpec("cam", torch.uint8, (16, 16, 3))]) as writer:
        writer.add_episode({"cam": rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)})
    dest = tmp_path / "h264.h5"
    args = ["encode", str(path), str(dest), "--codec", "h264", "--crf", "0", "--no-progress"]
    assert main(args) == 0
    assert "as h264 crf 0 gop 32 (lossy)" in capsys.readouterr().out
    with TrajectoryStore(dest) as store:
        assert store.column("cam").codec.crf == 0
