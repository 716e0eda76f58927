"""robomimic 0.3.0 itself loads our export: its SequenceDataset, filter keys and env metadata.

Runs where robomimic imports (``bash tests/formats/robomimic_venv.sh``, then
``/tmp/robomimic/bin/python -m pytest tests/formats/test_robomimic_interop.py``); skipped
elsewhere, CI included (robomimic is not a dependency)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.formats.robomimic_files import write_robomimic
from torchstore import TrajectoryStore
from torchstore.formats import export_robomimic, import_robomimic
from torchstore.samplers.windows import choose_windows

dataset = pytest.importorskip(
    "robomimic.utils.dataset", reason="needs robomimic (tests/formats/robomimic_venv.sh)"
)
file_utils = pytest.importorskip("robomimic.utils.file_utils")

OBS = ("robot0_eef_pos", "object", "agentview_image")
KEYS = ("actions", "rewards", "dones", "states")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rmi")
    src = write_robomimic(tmp / "src.hdf5")
    store = import_robomimic(src, tmp / "s.h5", progress=False)
    return src, store, export_robomimic(store, tmp / "out.hdf5", progress=False)


def _sequences(path, seq_length, **kwargs):
    return dataset.SequenceDataset(
        hdf5_path=str(path),
        obs_keys=OBS,
        dataset_keys=KEYS,
        seq_length=seq_length,
        frame_stack=1,
        pad_seq_length=False,
        pad_frame_stack=False,
        hdf5_cache_mode=None,
        **kwargs,
    )


@pytest.mark.parametrize("seq_length", [1, 3])
def test_sequence_dataset_gives_the_store_windows(exported, seq_length):
    _, store_path, out = exported
    seqs = _sequences(out, seq_length)
    store = TrajectoryStore(store_path)
    view = store.resident()
    start, length, episode = view.episode_segments()
    counts = (length - seq_length + 1).clamp(min=0)
    assert len(seqs) == int(counts.sum())
    draws = torch.arange(len(seqs))
    windows = choose_windows(start, length, episode, draws, capacity=store.num_rows, T=seq_length)
    for g in range(len(seqs)):
        item = seqs[g]
        rows = view.gather(windows.index[g])
        for k in OBS:
            assert np.array_equal(item["obs"][k], rows["obs", k].numpy()), (g, k)
            assert np.array_equal(item["next_obs"][k], rows["next", "obs", k].numpy()), (g, k)
        assert np.array_equal(item["actions"], rows["action"].numpy())
        assert np.array_equal(item["rewards"], rows["reward"].numpy())
        assert np.array_equal(item["dones"], rows["done"].numpy().astype(np.int64))
        assert np.array_equal(item["states"], rows["states"].numpy())


def test_filter_keys_and_env_metadata_load(exported):
    src, _, out = exported
    assert file_utils.get_env_metadata_from_dataset(
        str(out)
    ) == file_utils.get_env_metadata_from_dataset(str(src))
    for key in ("train", "valid"):
        ours, theirs = (
            _sequences(out, 1, filter_by_attribute=key),
            _sequences(src, 1, filter_by_attribute=key),
        )
        assert ours.demos == theirs.demos and len(ours) == len(theirs)


def test_a_filter_key_written_by_robomimic_is_imported(tmp_path):
    src = write_robomimic(tmp_path / "src.hdf5", lengths=(3, 4, 5, 6))
    file_utils.create_hdf5_filter_key(str(src), ["demo_3", "demo_1"], "picked")
    store = TrajectoryStore(import_robomimic(src, tmp_path / "s.h5", progress=False))
    assert store.manifest.metadata["episode_sets"]["picked"] == [3, 1]
    out = export_robomimic(store, tmp_path / "out.hdf5", progress=False)
    assert _sequences(out, 1, filter_by_attribute="picked").demos == ["demo_1", "demo_3"]
    assert (
        json.loads(json.dumps(file_utils.get_env_metadata_from_dataset(str(out))))["env_name"]
        == "Lift"
    )
