"""Drop-in cases a torchrl user meets, each run on LazyTensorStorage and on StoreReplay.

Column reads (``storage.get(key)``), torchrl's ``Sequence`` sample unit, pytree data, lazy
stacks of differing entries, item assignment (``rb[key] = v``, ``rb[i, j] = v``), lists of
rows, compiled writes of bare tensors: every case does the same operations on both
storages, for ``ndim`` 1 and 2, and asserts the same observable results. Where torchrl
loses a write (an assignment to a ``rb[:]`` that is not its storage), the ring writes it.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers import Sequence

from torchstore.data.replay.ring import StoreReplay
from torchstore.errors import ColumnError, UnsupportedError

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
        return [(_kind(r), str(r)) for r in reads]

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


def _kind(read) -> str:
    """The tensordict class a read is (a full read of a ring is a TensorDict subclass)."""
    for cls in type(read).__mro__:
        if cls.__module__.startswith("tensordict."):
            return cls.__name__
    return type(read).__name__


# --------------------------------------------------------------------- lazy stacks
def _ragged(n: int = 5, offset: float = 0.0, *, keys: bool = False, dim: int = 1):
    """Two entries whose ``a`` differ in shape (and in keys with ``keys``), stacked at ``dim``."""
    first = TensorDict({"a": torch.arange(n * 8.0).reshape(n, 4, 2) + offset}, [n])
    second = TensorDict({"a": torch.arange(n * 6.0).reshape(n, 3, 2) + 100 + offset}, [n])
    if keys:
        second["b"] = torch.ones(n, dtype=torch.bool)
    if dim == 2:
        first, second = first.unsqueeze(1).expand(n, 2).clone(), second.unsqueeze(1).expand(n, 2)
        second = second.clone()
    return LazyStackedTensorDict(first, second, stack_dim=dim)


def _described(read):
    if isinstance(read, LazyStackedTensorDict):
        return (
            "lazy",
            tuple(read.shape),
            read.stack_dim,
            [_described(t) for t in read.tensordicts],
        )
    return (
        "td",
        tuple(read.shape),
        {k: (v.dtype, v.tolist()) for k, v in read.items(include_nested=True, leaves_only=True)},
    )


@pytest.mark.parametrize("case", ["shapes", "keys", "stack dim 2", "wrapped"])
def test_ragged_lazy_stacks_are_stored_and_read_as_torchrl_stores_them(case):
    def run(storage):
        rb = ReplayBuffer(storage=storage, batch_size=3)
        rb.extend(_ragged(keys=case == "keys", dim=2 if case == "stack dim 2" else 1))
        if case == "wrapped":  # 3 more rows: rows 0..1 overwritten, the cursor at 2
            rb.extend(_ragged(3, 1000.0))
        torch.manual_seed(0)
        reads = [rb[:], storage[1], storage[torch.tensor([0, 4])], rb.sample()]
        return len(rb), [_described(r) for r in reads]

    torchrl, ours = [run(cls(6)) for cls in STORAGES.values()]
    assert ours == torchrl
    assert ours[1][0][0] == "lazy"


def _multi_env_ragged(steps: int = 3, offset: float = 0.0) -> LazyStackedTensorDict:
    """[n_envs=2, steps] rows of two entries whose ``a`` differ in shape, stacked at dim 2."""
    return LazyStackedTensorDict(
        *[
            TensorDict(
                {"a": torch.arange(2.0 * steps * k).reshape(2, steps, k) + offset + k}, [2, steps]
            )
            for k in (1, 2)
        ],
        stack_dim=2,
    )


def test_ragged_lazy_stacks_of_several_envs_are_stored_as_torchrl_stores_them():
    def run(storage):
        rb = ReplayBuffer(storage=storage, batch_size=3)
        rb.extend(_multi_env_ragged())
        torch.manual_seed(0)
        coordinates = (torch.tensor([0, 2]), torch.tensor([1, 0]))
        reads = [rb[:], rb.sample(), storage[coordinates], storage[1], storage[1, 0]]
        return len(rb), [_described(r) for r in reads]

    torchrl, ours = [run(cls(6, ndim=2)) for cls in STORAGES.values()]
    assert ours == torchrl
    # wrapped (torchrl's own storage fails to read this one back): time rows 0, 1 rewritten
    rb = ReplayBuffer(storage=StoreReplay(6, ndim=2))
    rb.extend(_multi_env_ragged())
    rb.extend(_multi_env_ragged(2, 100.0))
    first = rb[:].tensordicts[0]["a"][..., 0]  # [n_envs, time rows]
    assert first.tolist() == [[101.0, 102.0, 3.0], [103.0, 104.0, 6.0]]
    with pytest.raises(ColumnError, match="lazily stacked"):  # a rewrite of rows: refused
        rb[0] = _multi_env_ragged(1)
    assert rb[:].tensordicts[0]["a"][..., 0].tolist() == first.tolist()
    copy = StoreReplay(6, ndim=2)  # torchrl's own state dict of it fails to stack
    copy.load_state_dict(_through_torch_save(rb.storage.state_dict()))
    assert _described(copy[:, :]) == _described(rb.storage[:, :]) and copy.cursor == 4


def test_a_lazy_stack_whose_entries_differ_only_in_dtype_is_densified_as_torchrl():
    stack = LazyStackedTensorDict(
        TensorDict({"a": torch.ones(5, 3)}, [5]),
        TensorDict({"a": torch.ones(5, 3, dtype=torch.int64)}, [5]),
        stack_dim=1,
    )

    def run(storage):
        rb = ReplayBuffer(storage=storage)
        rb.extend(stack)
        return _kind(rb[:]), _described(rb[:])

    torchrl, ours = [run(cls(6)) for cls in STORAGES.values()]
    assert ours == torchrl and ours[0] == "TensorDict"  # float32, as torch.stack promotes


def test_ragged_lazy_stacks_that_cannot_be_stored_are_refused():
    along_rows = LazyStackedTensorDict(
        TensorDict({"a": torch.zeros(2, 4)}, [2]), TensorDict({"a": torch.zeros(2, 3)}, [2])
    )
    with pytest.raises(RuntimeError):  # torchrl refuses it too
        ReplayBuffer(storage=LazyTensorStorage(6)).extend(along_rows)
    with pytest.raises(ColumnError, match="stacked along the rows"):
        ReplayBuffer(storage=StoreReplay(6)).extend(along_rows)
    rb = ReplayBuffer(storage=StoreReplay(6))
    rb.extend(_ragged())
    with pytest.raises(ColumnError, match="first write's structure"):
        rb.extend(TensorDict({"a": torch.zeros(2, 2, 4, 2)}, [2, 2]))
    with pytest.raises(ColumnError, match="column '0/a' expects rows of shape"):
        rb.extend(LazyStackedTensorDict(*_ragged().tensordicts[::-1], stack_dim=1))
    assert len(rb) == 5


def test_a_ragged_ring_refuses_key_assignment_rather_than_losing_it():
    rb = ReplayBuffer(storage=StoreReplay(6))
    rb.extend(_ragged())
    with pytest.raises(RuntimeError, match="locked"):
        rb["c"] = torch.zeros(5, 2)
    rb[1:3] = _ragged(2, 7.0)  # rows written through set, as torchrl's
    assert rb[1].tensordicts[0]["a"][0].tolist() == [7.0, 8.0]


def test_ragged_rings_survive_state_dicts_and_checkpoints(tmp_path):
    from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer

    source = StoreReplay(6)
    rb = ReplayBuffer(storage=source)
    rb.extend(_ragged(keys=True))
    rb.extend(_ragged(3, 1000.0, keys=True))
    copy = StoreReplay(6)
    copy.load_state_dict(_through_torch_save(source.state_dict()))
    source.dumps(tmp_path / "ckpt")
    loaded = StoreReplay(6)
    loaded.loads(tmp_path / "ckpt")
    for other in (copy, loaded):
        assert _described(other[:]) == _described(source[:])
        assert other.cursor == source.cursor == 2 and len(other) == 6
    loaded.set(2, _ragged(1, 5.0, keys=True)[0])  # the restored layout takes rows again
    assert loaded[2].tensordicts[1]["a"][0].tolist() == [105.0, 106.0]
    source.checkpointer = TensorStorageCheckpointer()
    with pytest.raises(UnsupportedError, match="lazily stacked"):
        source.dumps(tmp_path / "torchrl")


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


# --------------------------------------------------------------------- item assignment
def _steps(n: int = 10) -> TensorDict:
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[n // 2] = True
    return TensorDict(
        {"a": torch.arange(n), "obs": torch.arange(n * 2.0).reshape(n, 2), ("next", "done"): done},
        [n],
    )


def _columns(rb) -> dict:
    return {k: v.tolist() for k, v in rb[:].items(include_nested=True, leaves_only=True)}


ASSIGNMENTS = {
    # name: (ndim, how the rows are extended, the assignment)
    "key": (1, lambda td: td, lambda rb: rb.__setitem__("a", torch.zeros(10, dtype=torch.long))),
    "nested key": (
        1,
        lambda td: td,
        lambda rb: rb.__setitem__(("next", "done"), torch.ones(10, 1, dtype=torch.bool)),
    ),
    "new key": (1, lambda td: td, lambda rb: rb.__setitem__("b", torch.ones(10))),
    "row batch index": (
        1,
        lambda td: td.reshape(5, 2),
        lambda rb: rb.__setitem__((1, 1), TensorDict({"a": torch.tensor(-3)}, [])),
    ),
    "ndim=2 index": (
        2,
        lambda td: td.reshape(2, 5),
        lambda rb: rb.__setitem__((0, slice(3, 4)), TensorDict({"a": torch.tensor([-1])}, [1])),
    ),
    "ndim=2 number": (2, lambda td: td.reshape(2, 5), lambda rb: rb.__setitem__((1, 0), 7)),
}


@pytest.mark.parametrize("case", list(ASSIGNMENTS))
def test_item_assignment_writes_the_rows_as_torchrl(case):
    ndim, shaped, assign = ASSIGNMENTS[case]

    def run(storage):
        rb = ReplayBuffer(storage=storage)
        rb.extend(shaped(_steps()))
        before = _columns(rb)
        assign(rb)
        return before, _columns(rb)

    torchrl, ours = [run(cls(10, ndim=ndim)) for cls in STORAGES.values()]
    assert ours == torchrl
    assert ours[1] != ours[0]  # the assignment changed the rows


@pytest.mark.parametrize("capacity", [10, 20])
def test_key_assignment_is_written_where_torchrl_loses_it(capacity):
    # LazyTensorStorage loses rb[key] = v unless rb[:] is its own storage (ndim=1, full):
    # on a ring that is not full, or with ndim=2, rb[:] is a new TensorDict of views. The
    # ring writes it: an assignment is never dropped.
    rb = ReplayBuffer(storage=StoreReplay(capacity, ndim=2))
    rb.extend(_steps().reshape(2, 5))
    rb["obs"] = torch.full((2, 5, 2), -1.0)
    rb[1, 3] = TensorDict({"a": torch.tensor(-7)}, [])
    assert rb[:]["obs"].unique().tolist() == [-1.0]
    assert rb[:]["a"].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, -7, 9]]


def test_an_assigned_end_flag_rebuilds_the_episode_index():
    storage = StoreReplay(10)
    rb = ReplayBuffer(storage=storage)
    rb.extend(_steps())
    assert storage.episode_segments()[1].tolist() == [6, 4]
    done = torch.zeros(10, 1, dtype=torch.bool)
    done[[2, 9]] = True
    rb["next", "done"] = done
    assert storage.episode_segments()[1].tolist() == [3, 7]


def test_item_assignment_goes_through_the_rings_column_checks():
    declared = {"a": {"dtype": torch.int64}, "obs": {"dtype": torch.float32, "shape": (2,)}}
    rb = ReplayBuffer(storage=StoreReplay(10, columns=declared))
    rb.extend(_steps().exclude("next"))
    rb["a"] = torch.full((10,), 4)  # a declared ring takes a patch of some columns
    assert rb[:]["a"].tolist() == [4] * 10 and rb[:]["obs"][1].tolist() == [2.0, 3.0]
    with pytest.raises(ColumnError, match="'b' is not a column"):
        rb["b"] = torch.ones(10)
    with pytest.raises(ColumnError, match="expects int64"):
        rb[2, ...] = TensorDict({"a": torch.tensor(0.5)}, [])
    with pytest.raises(ColumnError, match="expects int64"):
        rb["a"] = torch.zeros(10)
    read = rb[:]
    assert "b" not in read.keys() and read["a"].tolist() == [4] * 10  # nothing written


def test_item_assignment_of_a_quantised_column_is_encoded():
    from torchstore.data.columns import ColumnSpec
    from torchstore.data.quantize import Quantize

    columns = [ColumnSpec("obs", torch.float32, (2,), quantize=Quantize(0.0, 20.0))]
    rb = ReplayBuffer(storage=StoreReplay(10, columns=columns))
    rb.extend(TensorDict({"obs": torch.zeros(10, 2)}, [10]))
    rb["obs"] = torch.full((10, 2), 10.0)
    assert rb[:]["obs"].sub(10.0).abs().max() < 0.1
    assert rb.storage.packed.view("obs").dtype == torch.uint8


def test_an_old_read_refuses_assignment():
    rb = ReplayBuffer(storage=StoreReplay(10))
    rb.extend(_steps())
    read = rb[:]
    read["a"] = torch.zeros(10, dtype=torch.long)  # its own write keeps it current
    rb.extend(_steps(2))
    with pytest.raises(UnsupportedError, match="before the ring's last write"):
        read["a"] = torch.ones(10, dtype=torch.long)
    assert rb[:]["a"].tolist() == [0, 1] + [0] * 8


@pytest.mark.parametrize("ndim", [1, 2])
def test_a_full_read_derives_saves_and_pickles_as_a_plain_tensordict(ndim):
    import io
    import pickle

    rb = ReplayBuffer(storage=StoreReplay(10, ndim=ndim))
    rb.extend(_steps() if ndim == 1 else _steps().reshape(2, 5))
    read = rb[:]
    assert isinstance(read, TensorDict) and repr(read).startswith("TensorDict(")
    buffer = io.BytesIO()
    torch.save(read, buffer)  # its leaves view one block as several dtypes: saved as a clone
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    unpickled = pickle.loads(pickle.dumps(read))
    for derived in (read[:1], read.clone(), read + 0, saved, unpickled):
        assert type(derived) is TensorDict
    assert (saved == read).all() and (unpickled == read).all()
    before = read["a"].tolist()
    derived = read.clone()
    derived["a"] = torch.zeros_like(derived["a"])  # a copy: the ring keeps its rows
    assert rb[:]["a"].tolist() == before


# --------------------------------------------------------------------- lists of rows
LISTS = {
    "tensordicts with batch dims": lambda: [
        TensorDict({"a": torch.arange(6.0).reshape(2, 3)}, [2])
    ],
    "tensordicts": lambda: [TensorDict({"a": torch.full((3,), float(i))}, []) for i in range(4)],
    "tuples": lambda: [(torch.tensor(float(i)), torch.full((2,), i)) for i in range(3)],
    "tensors": lambda: [torch.full((2,), float(i)) for i in range(3)],
}


@pytest.mark.parametrize("case", list(LISTS))
def test_a_list_of_rows_is_stacked_as_torchrl_stacks_it(case):
    def run(storage):
        rb = ReplayBuffer(storage=storage)
        rb.extend(LISTS[case]())
        return _kind(rb[:]), str(rb[:]), tuple(rb.storage.shape)

    torchrl, ours = [run(cls(100)) for cls in STORAGES.values()]
    assert ours == torchrl


def test_a_list_of_rows_with_other_structures_is_refused():
    rb = ReplayBuffer(storage=StoreReplay(10))
    with pytest.raises(ColumnError, match="listed row 1 has another structure"):
        rb.extend([(torch.zeros(2), torch.zeros(2)), (torch.zeros(2),)])
    assert not rb.storage.initialized


# --------------------------------------------------------------------- compiled writes
@pytest.mark.parametrize("rows", ["tensor", "tensordict"])
def test_a_compiled_set_of_bare_tensors_is_graph_safe_as_torchrls(rows):
    from torch._dynamo.testing import CompileCounter

    def run(cls):
        storage = cls(100, compilable=True)
        data = torch.arange(25)[:, None]
        wrap = (lambda x: x) if rows == "tensor" else (lambda x: TensorDict({"x": x}, [25], "cpu"))
        storage.set(torch.arange(25), wrap(data))
        counter = CompileCounter()
        write = torch.compile(lambda c, v: storage.set(c, v), fullgraph=True, backend=counter)
        write(torch.arange(25, 50), wrap(data + 25))
        read = storage[:]
        return counter.frame_count, len(storage), (read if rows == "tensor" else read["x"]).tolist()

    torchrl, ours = [run(cls) for cls in STORAGES.values()]
    assert ours == torchrl and ours[0] == 1 and ours[2] == [[i] for i in range(50)]
