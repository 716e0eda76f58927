"""policy.safetensors as a user meets it: what goes in comes back, and bad input is refused
with a message naming what was wrong, before anything is written."""

from __future__ import annotations

import pytest
import torch

from torchstore.errors import ArgumentError, ArgumentTypeError, StoreFormatError
from torchstore.lightning import ColumnStats, Normalizer
from torchstore.training import PolicyFile, read_policy_file, save_policy_file


def _normalizer(mode: str = "mean_std") -> Normalizer:
    stats = ColumnStats(
        torch.tensor([1.0, -2.0], dtype=torch.float64),
        torch.tensor([0.5, 4.0], dtype=torch.float64),
        torch.tensor([0.0, -9.0], dtype=torch.float64),
        torch.tensor([3.0, 5.0], dtype=torch.float64),
        40,
    )
    return Normalizer({"state": stats}, mode)


def test_tensors_normalizer_and_metadata_come_back(tmp_path):
    weights = {"net.0.weight": torch.randn(3, 2), "net.0.bias": torch.randn(3)}
    path = save_policy_file(
        tmp_path / "p.safetensors",
        weights,
        normalizer=_normalizer("min_max"),
        metadata={"recipe": "bc", "step": 12, "lr": 0.5, "complete": False},
    )
    saved = read_policy_file(path)
    assert saved.metadata == {
        "recipe": "bc",
        "step": "12",
        "lr": "0.5",
        "complete": "false",
        "normalization": "min_max",
    }
    assert saved.tensors.keys() == weights.keys()
    assert all(torch.equal(saved.tensors[k], v) for k, v in weights.items())
    x = torch.tensor([[2.0, 0.0]])
    want = _normalizer("min_max").normalize("state", x)
    assert torch.equal(saved.normalizer().normalize("state", x), want)
    assert not list(tmp_path.glob("*.tmp"))


def test_fetched_tensors_rebuild_the_same_normalizer(tmp_path):
    """The file's tensors alone (what fetch_policy_weights returns), the mode from the config."""
    from safetensors.torch import load_file

    path = save_policy_file(tmp_path / "p.st", {"w": torch.ones(1)}, normalizer=_normalizer())
    rebuilt = PolicyFile(load_file(str(path))).normalizer("mean_std")
    x = torch.tensor([[0.0, 1.0]])
    assert torch.equal(rebuilt.unnormalize("state", x), _normalizer().unnormalize("state", x))
    assert PolicyFile({"w": torch.ones(1)}).normalizer() is None


def _state_of(normalizer: Normalizer) -> dict[str, torch.Tensor]:
    s = normalizer.stats["state"]
    parts = {"mean": s.mean, "std": s.std, "min": s.min, "max": s.max}
    out = {f"normalizer.state.{k}": v for k, v in parts.items()}
    out["normalizer.state.count"] = torch.tensor(s.count)
    return out


def test_bad_input_is_refused_and_writes_nothing(tmp_path):
    path = tmp_path / "p.safetensors"
    with pytest.raises(ArgumentTypeError, match=r"tensors\['w'\] is a list, not a tensor"):
        save_policy_file(path, {"w": [1.0]})
    with pytest.raises(ArgumentTypeError, match=r"metadata\['tags'\] \(list\) must be a str"):
        save_policy_file(path, {"w": torch.ones(1)}, metadata={"tags": ["a"]})
    with pytest.raises(ArgumentError, match=r"\['normalizer.x'\] start with 'normalizer.'"):
        save_policy_file(path, {"normalizer.x": torch.ones(1)}, normalizer=_normalizer())
    with pytest.raises(ArgumentError, match=r"metadata\['normalization'\] is written from"):
        save_policy_file(
            path, {"w": torch.ones(1)}, normalizer=_normalizer(), metadata={"normalization": "x"}
        )
    assert not any(tmp_path.iterdir())


def test_a_damaged_or_missing_file_is_refused(tmp_path):
    path = save_policy_file(tmp_path / "p.safetensors", {"w": torch.ones(100)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreFormatError, match="p.safetensors is not a readable safetensors file"):
        read_policy_file(path)
    with pytest.raises(FileNotFoundError, match="no policy file at"):
        read_policy_file(tmp_path / "missing.safetensors")


def test_incomplete_normalizer_statistics_are_named():
    state = _state_of(_normalizer())
    del state["normalizer.state.std"]
    with pytest.raises(StoreFormatError, match=r"column 'state' lack \['std'\]"):
        PolicyFile(state).normalizer()


def test_tied_weights_and_shared_statistics_are_saved(tmp_path):
    """safetensors refuses tensors sharing memory; a tied weight comes back as equal values."""
    embed = torch.randn(4, 3)
    stats = _normalizer().stats["state"]
    shared = Normalizer({"obs": stats, "action": stats})
    path = save_policy_file(
        tmp_path / "p.safetensors", {"embed": embed, "head": embed}, normalizer=shared
    )
    saved = read_policy_file(path)
    assert torch.equal(saved.tensors["embed"], embed) and torch.equal(saved.tensors["head"], embed)
    x = torch.tensor([[1.0, 1.0]])
    assert torch.equal(saved.normalizer().normalize("action", x), shared.normalize("obs", x))
