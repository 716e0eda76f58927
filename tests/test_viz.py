from __future__ import annotations

import numpy as np
import pytest
import torch

from torchstore import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter
from torchstore.cli import main
from torchstore.demo import write_demo_store
from torchstore.tasks import write_demo_data
from torchstore.viz import default_out, image_columns, plot_frames, plot_metrics, plot_store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("episode_lengths.png", "traces.png", "frames_pixels.png")


def _png(path, min_bytes=8_000):
    """The image as an array, after checking the file is a non-trivial PNG."""
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > min_bytes, path
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank canvas
    return image


def test_plot_store_writes_lengths_traces_and_frames(tmp_path):
    store_path = write_demo_data(tmp_path / "reach.h5", episodes=5)
    written = plot_store(store_path, tmp_path / "viz", episodes=2)
    assert [p.name for p in written] == ["episode_lengths.png", "traces.png", "frames_pixels.png"]
    for path in written:
        _png(path)
    # one panel per scalar/vector column: the traces figure grows with the column count
    assert _png(written[1]).shape[0] > 3 * _png(written[0]).shape[0]


def test_plot_store_without_image_columns_and_with_a_column_subset(tmp_path):
    path = write_demo_store(tmp_path / "pendulum.h5", episodes=3, steps=40)
    written = plot_store(path, tmp_path / "all")
    assert [p.name for p in written] == ["episode_lengths.png", "traces.png"]
    with TrajectoryStore(path) as store:
        subset = plot_store(store, tmp_path / "subset", columns=["obs", "reward"])
        assert store.num_rows == 120  # an open store stays open
    assert _png(subset[1]).shape[0] < _png(written[1]).shape[0]


def test_frames_of_grayscale_and_raw_uint8_columns(tmp_path):
    columns = [
        ColumnSpec("depth", torch.float32, (16, 16, 1)),
        ColumnSpec("rgba", torch.uint8, (16, 16, 4)),
        ColumnSpec("reward", torch.float32),
    ]
    rng = np.random.default_rng(0)
    with TrajectoryStoreWriter(tmp_path / "img.h5", columns) as writer:
        for _ in range(2):
            writer.add_episode(
                {
                    "depth": rng.random((6, 16, 16, 1), dtype=np.float32) * 5.0,
                    "rgba": rng.integers(0, 256, (6, 16, 16, 4), dtype=np.uint8),
                    "reward": np.zeros(6, dtype=np.float32),
                }
            )
    with TrajectoryStore(tmp_path / "img.h5") as store:
        assert [c.name for c in image_columns(store.columns)] == ["depth", "rgba"]
        _png(plot_frames(store, "depth", tmp_path / "depth.png", per_episode=4))
        _png(plot_frames(store, "rgba", tmp_path / "rgba.png"))
        with pytest.raises(
            ValueError, match=r"column 'reward' has per-row shape \[\]; frames need \[H, W, C\]"
        ):
            plot_frames(store, "reward", tmp_path / "nope.png")


def test_plot_metrics_draws_curves_and_final_values(tmp_path):
    csv = tmp_path / "metrics.csv"
    lines = ["step,time_s,train/loss,val/loss,eval/success_rate"]
    lines += [f"{i},{i / 10},{1.0 / (i + 1)},," for i in range(100)]
    lines += ["50,5,,0.4,", "99,9.9,,0.3,0.95"]
    csv.write_text("\n".join(lines) + "\n")
    _png(plot_metrics(csv, tmp_path / "loss.png"))
    csv.write_text("step,time_s\n")
    assert plot_metrics(csv, tmp_path / "empty.png").exists()


def test_viz_command(tmp_path, capsys):
    store_path = write_demo_data(tmp_path / "reach.h5", episodes=3)
    assert main(["viz", str(store_path), "--out", str(tmp_path / "out"), "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("wrote ") == 3 and "frames_pixels.png" in out
    assert main(["viz", str(tmp_path / "missing.h5"), "--out", str(tmp_path / "x")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_viz_writes_beside_the_store_by_default_not_where_it_is_run(tmp_path, capsys, monkeypatch):
    store_path = write_demo_data(tmp_path / "runs" / "reach.h5", episodes=2)
    elsewhere = tmp_path / "checkout"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert default_out(store_path) == tmp_path / "runs" / "reach_viz"
    assert main(["viz", str(store_path), "--episodes", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"wrote {tmp_path / 'runs' / 'reach_viz' / name}" for name in PLOTS]
    assert sorted(p.name for p in (tmp_path / "runs" / "reach_viz").iterdir()) == sorted(PLOTS)
    assert list(elsewhere.iterdir()) == []  # nothing in the folder it was run from
    assert [p.name for p in plot_store(store_path, episodes=1)] == list(PLOTS)  # the library too


def test_viz_with_zero_episodes_writes_nothing_and_says_why(tmp_path, capsys):
    store_path = write_demo_data(tmp_path / "reach.h5", episodes=2)
    out = tmp_path / "out"
    assert main(["viz", str(store_path), "--out", str(out), "--episodes", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        "--episodes: must be an integer in [1, 1000], got '0'" in err and len(err.splitlines()) == 1
    )
    assert not out.exists()
    with pytest.raises(ValueError, match="nothing was drawn"):
        plot_store(store_path, out, episodes=0)
    assert not out.exists()


def test_viz_and_info_of_a_lerobot_folder_read_it_only(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    from torchstore.lerobot import export_lerobot

    store_path = write_demo_data(tmp_path / "reach.h5", episodes=2)
    folder = tmp_path / "lerobot"
    export_lerobot(store_path, folder, fps=10, task="reach", cameras="image", progress=False)
    before = sorted((p, p.stat().st_mtime_ns) for p in folder.rglob("*"))
    assert main(["viz", str(folder), "--out", str(tmp_path / "out")]) == 0
    assert "traces.png" in capsys.readouterr().out
    _png(tmp_path / "out" / "traces.png")
    assert default_out(folder) == tmp_path / "lerobot_viz"  # a folder's whole name
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "LeRobot dataset v3.0" in out and "episodes   2" in out
    assert sorted((p, p.stat().st_mtime_ns) for p in folder.rglob("*")) == before
    (tmp_path / "plain").mkdir()
    assert main(["viz", str(tmp_path / "plain"), "--out", str(tmp_path / "o2")]) == 1
    err = capsys.readouterr().err
    assert "not a LeRobot dataset" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o2").exists()
