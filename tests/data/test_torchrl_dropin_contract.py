"""Drop-in cases a torchrl user meets, each run on LazyTensorStorage and on StoreReplay.

Column reads (``storage.get(key)``), torchrl's ``Sequence`` sample unit, pytree data:
every case does the same operations on both storages, for ``ndim`` 1 and 2, and asserts
the same observable results.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers import Sequence

from torchstore.data.replay.ring import StoreReplay
from torchstore.errors import ColumnError

logging.getLogger("torchrl").setLevel(logging.WARNING)

STORAGES = {"LazyTensorStorage": LazyTensorStorage, "StoreReplay": StoreReplay}


def data(ndim: int) -> TensorDict:
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[[6, 9, 15]] = True
    td = TensorDict({"obs": torch.arange(20.0), ("next", "done"): done}, [20])
    return td if ndim == 1 else td.reshape(2, 10)


def run_both(fn, ndim):
    return [fn(cls(20, ndim=ndim)) for cls in STORAGES.values()]


@pytest.mark.parametrize("ndim", [1, 2])
def test_get_by_key_returns_the_column(ndim):
    def run(storage):
        rb = TensorDictReplayBuffer(storage=storage)
        rb.extend(data(ndim)[..., :7] if ndim == 2 else data(ndim)[:13])
        return [
            (tuple(storage.get(key).shape), storage.get(key).tolist())
            for key in ("obs", ("next", "done"), "index")
        ]

    torchrl, ours = run_both(run, ndim)
    assert ours == torchrl


def test_get_of_a_missing_key_is_a_key_error():
    rb = TensorDictReplayBuffer(storage=StoreReplay(10))
    rb.extend(data(1)[:4])
    with pytest.raises(KeyError, match="no column 'reward'"):
        rb.storage.get("reward")


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("length", [1, 4])
def test_sequence_sample_unit_gives_the_same_batches(ndim, length):
    def run(storage):
        rb = TensorDictReplayBuffer(
            storage=storage, batch_size=3, sample_unit=Sequence(length=length)
        )
        rb.extend(data(ndim))
        out = []
        for seed in range(4):
            torch.manual_seed(seed)
            sample = rb.sample()
            out.append((tuple(sample.shape), sample["obs"].tolist()))
        return out

    torchrl, ours = run_both(run, ndim)
    assert ours == torchrl
    assert torchrl[0][0] == (3 * length,)


# --------------------------------------------------------------------- pytrees
def _t(ndim: int) -> torch.Tensor:
    t = torch.arange(12.0).reshape(12, 1)
    return t if ndim == 1 else t.reshape(2, 6, 1)


PYTREES = {
    "tuple": lambda t: (t, t.long()),
    "dict-of-list": lambda t: {"a": t, "b": [t * 2]},
    "dict-of-tuple": lambda t: {"a": t, "b": (t * 3,)},
    "non-string-key": lambda t: {"a": t, 30: t + 1},
    "nested-dict": lambda t: {"a": t, "n": {"b": t - 1}},
    "lazy-stack": lambda t: LazyStackedTensorDict(
        *[TensorDict({"x": t.expand(*t.shape[:-1], 2) + i}, t.shape[:-1]) for i in range(3)],
        stack_dim=t.ndim - 1,
    ),
}


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("case", list(PYTREES))
def test_pytrees_come_back_in_the_same_structure(case, ndim):
    def run(storage):
        rb = ReplayBuffer(storage=storage, batch_size=3)
        rb.extend(PYTREES[case](_t(ndim)))
        torch.manual_seed(0)
        reads = [rb.sample(), storage[1], storage[0:2], rb[:]]
        return [(type(r).__name__, str(r)) for r in reads]

    torchrl, ours = run_both(run, ndim)
    assert ours == torchrl


@pytest.mark.parametrize("case", ["tuple", "non-string-key", "lazy-stack"])
def test_pytree_rings_survive_state_dicts_and_checkpoints(case, tmp_path):
    source = StoreReplay(20)
    rb = ReplayBuffer(storage=source)
    rb.extend(PYTREES[case](_t(1)))
    copy = StoreReplay(20)
    copy.load_state_dict(source.state_dict())
    source.dumps(tmp_path / "ckpt")
    loaded = StoreReplay(20)
    loaded.loads(tmp_path / "ckpt")
    for other in (copy, loaded):
        assert str(other[:]) == str(source[:])
        assert str(other[3]) == str(source[3])


def test_a_non_tensor_leaf_is_refused_naming_the_leaf():
    rb = ReplayBuffer(storage=StoreReplay(10))
    with pytest.raises(ColumnError, match=r"leaf \['b'\]\[1\] holds str"):
        rb.extend({"a": torch.zeros(4), "b": (torch.zeros(4), "label")})
    assert not rb.storage.initialized


def test_a_leaf_without_the_row_dim_is_refused_naming_the_leaf():
    rb = ReplayBuffer(storage=StoreReplay(10))
    with pytest.raises(ColumnError, match=r"leaf \[1\] has leading shape \[3\]"):
        rb.extend((torch.zeros(4), torch.zeros(3)))


def test_a_write_with_another_structure_is_refused():
    rb = ReplayBuffer(storage=StoreReplay(10))
    rb.extend((torch.zeros(4), torch.ones(4)))
    with pytest.raises(ColumnError, match="first write's structure"):
        rb.extend({"a": torch.zeros(4), "b": torch.ones(4)})
    assert len(rb) == 4


def test_a_ragged_lazy_stack_is_refused_as_a_column_error():
    ragged = LazyStackedTensorDict(
        TensorDict({"x": torch.zeros(4, 2)}, [4]),
        TensorDict({"x": torch.zeros(4, 3)}, [4]),
        stack_dim=1,
    )
    with pytest.raises(ColumnError, match="lazily stacked"):
        ReplayBuffer(storage=StoreReplay(10)).extend(ragged)


# --------------------------------------------------------------------- late keys, partial writes
def _rows(n: int, start: int = 0, **extra) -> TensorDict:
    td = TensorDict(
        {"obs": torch.arange(start, start + n, dtype=torch.float32), "a": torch.ones(n, 2)}, [n]
    )
    for key, value in extra.items():
        td[key] = value
    return td


@pytest.mark.parametrize("ndim", [1, 2])
def test_a_key_written_later_becomes_a_column_filled_with_zeros(ndim):
    def shaped(td):
        return td if ndim == 1 else td.reshape(2, -1)

    def run(storage):
        rb = TensorDictReplayBuffer(storage=storage)
        rb.extend(shaped(_rows(4)))
        rb.extend(shaped(_rows(4, 10, td_error=torch.full((4,), 5.0))))
        rb.extend(shaped(_rows(4, 20, flag=torch.ones(4, 1, dtype=torch.bool))))
        out = storage[:]
        return [(k, out[k].dtype, out[k].tolist()) for k in ("obs", "td_error", "flag")]

    torchrl, ours = run_both(run, ndim)
    assert ours == torchrl
    td_error = torch.tensor(ours[1][2]).reshape(-1, 4 if ndim == 1 else 6)
    assert (td_error == 0).sum() == 8  # rows written before the key hold its fill value


def test_partial_writes_leave_the_other_columns_as_they_were():
    def run(storage):
        rb = TensorDictReplayBuffer(storage=storage)
        rb.extend(_rows(6))
        storage.set(torch.tensor([0, 1]), TensorDict({"obs": torch.tensor([-1.0, -2.0])}, [2]))
        storage.set(torch.tensor([4]), TensorDict({"a": torch.zeros(1, 2)}, [1]), set_cursor=False)
        out = storage[:6]  # torchrl counts the rewritten rows again: rows 6, 7 never written
        return out["obs"].tolist(), out["a"].tolist(), len(storage), storage._last_cursor_index

    torchrl, ours = run_both(run, 1)
    assert ours == torchrl


def test_a_late_key_whose_dtype_conflicts_is_refused_and_nothing_is_written():
    rb = TensorDictReplayBuffer(storage=StoreReplay(20))
    rb.extend(_rows(4, td_error=torch.zeros(4)))
    with pytest.raises(ColumnError, match="column 'td_error' expects float32"):
        rb.extend(_rows(4, td_error=torch.zeros(4, dtype=torch.float64)))
    assert len(rb) == 4


def test_a_late_end_column_rebuilds_the_episode_index():
    storage = StoreReplay(20)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(_rows(4))
    done = torch.tensor([[False], [True], [False], [False]])
    rb.extend(_rows(4, 4, next=TensorDict({"done": done}, [4])))
    start, length, _ = storage.episode_segments()
    assert start.tolist() == [0, 6] and length.tolist() == [6, 2]


@pytest.mark.parametrize("ndim", [1, 2])
def test_update_if_present_patches_live_records_like_torchrl(ndim):
    from torchrl.data import RoundRobinWriter

    def run(storage):
        rb = ReplayBuffer(
            storage=storage, writer=RoundRobinWriter(track_generations=True), batch_size=3
        )
        td = TensorDict(
            {"obs": torch.arange(20.0), "v": torch.zeros(20, 1, dtype=torch.long)}, [20]
        )
        rb.extend(td if ndim == 1 else td.reshape(2, 10))
        torch.manual_seed(0)
        _, info = rb.sample(return_info=True)
        index = info["index"] if ndim == 1 else torch.stack(info["index"], -1)
        result = rb.update_if_present(
            index=index,
            generation=info["index_generation"],
            patch={"obs": torch.full((3,), -5.0)},
            version_key="v",
            version=3,
        )
        out = storage[:]
        return result.updated_count, out["obs"].tolist(), out["v"].tolist()

    torchrl, ours = run_both(run, ndim)
    assert ours == torchrl
    assert ours[0] == 3


# --------------------------------------------------------------------- state dict interchange
def _through_torch_save(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _episode_data(ndim: int) -> TensorDict:
    done = torch.zeros(16, 1, dtype=torch.bool)
    done[[3, 9, 12]] = True
    td = TensorDict(
        {"obs": torch.arange(16.0), "act": torch.ones(16, 2), ("next", "done"): done}, [16]
    )
    return td if ndim == 1 else td.reshape(2, 8)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("source", list(STORAGES))
@pytest.mark.parametrize("target", list(STORAGES))
@pytest.mark.parametrize("extends", [1, 2])  # 2: the ring is full and has wrapped
def test_state_dicts_load_across_torchrl_and_torchstore(ndim, source, target, extends):
    rb = TensorDictReplayBuffer(storage=STORAGES[source](20, ndim=ndim))
    for _ in range(extends):
        rb.extend(_episode_data(ndim))
    loaded = STORAGES[target](20, ndim=ndim)
    loaded.load_state_dict(_through_torch_save(rb.storage.state_dict()))
    assert len(loaded) == len(rb.storage)
    assert loaded.shape == rb.storage.shape
    for key in ("obs", "act", ("next", "done")):
        assert loaded[:][key].tolist() == rb.storage[:][key].tolist()
    if target == "StoreReplay":  # the episode index comes back (rebuilt from next/done)
        ends = loaded[:]["next", "done"].reshape(loaded.shape)
        starts, lengths, _ = loaded.episode_segments()
        streams = loaded.segment_streams()
        for start, length, env in zip(starts, lengths, streams, strict=True):
            rows = (start + torch.arange(int(length))) % ends.shape[0]
            flags = ends[rows] if ndim == 1 else ends[rows, env]
            assert not flags[:-1].any()


def test_plain_tensor_state_dicts_load_across():
    for source, target in [
        ("LazyTensorStorage", "StoreReplay"),
        ("StoreReplay", "LazyTensorStorage"),
    ]:
        rb = ReplayBuffer(storage=STORAGES[source](10))
        rb.extend(torch.arange(6.0))
        loaded = STORAGES[target](10)
        loaded.load_state_dict(rb.storage.state_dict())
        assert loaded[:].tolist() == list(range(6))


def test_a_torchrl_state_of_another_capacity_is_refused():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12))
    rb.extend(_episode_data(1))
    with pytest.raises(ValueError, match="capacity 12, this one has 20"):
        StoreReplay(20).load_state_dict(rb.storage.state_dict())


def test_a_state_dict_of_something_else_is_refused():
    with pytest.raises(ValueError, match="not a StoreReplay or torchrl TensorStorage"):
        StoreReplay(20).load_state_dict({"weights": torch.zeros(3)})
