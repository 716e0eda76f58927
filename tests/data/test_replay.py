"""StoreReplay driven by torchrl's own buffers, samplers, writers and checkpoints."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import (
    PrioritizedReplayBuffer,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import Sampler

from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.replay.ring import REPLAY_FILE, StoreReplay
from torchstore.data.replay.ring_episodes import age_rows
from torchstore.errors import ColumnError, StoreFormatError

logging.getLogger("torchrl").setLevel(logging.WARNING)

FLAT = (
    ColumnSpec("obs", torch.float32, (4,)),
    ColumnSpec("action", torch.float32, (2,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("next_obs", torch.float32, (4,)),
)
NESTED = (
    ColumnSpec("observation", torch.float32, (4,)),
    ColumnSpec("action", torch.int64),
    ColumnSpec("done", torch.bool, (1,)),
    ColumnSpec("next/observation", torch.float32, (4,)),
    ColumnSpec("next/reward", torch.float32, (1,)),
    ColumnSpec("next/done", torch.bool, (1,)),
    ColumnSpec("next/truncated", torch.bool, (1,)),
)


def flat_rows(n: int, start: int = 0, episode: int = 5) -> TensorDict:
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": step.float().unsqueeze(-1).expand(n, 4).clone(),
            "action": torch.stack([step.float(), -step.float()], -1),
            "reward": step.float() / 10,
            "done": step % episode == episode - 1,
            "next_obs": (step + 1).float().unsqueeze(-1).expand(n, 4).clone(),
        },
        batch_size=[n],
    )


def nested_rows(n: int, start: int = 0, episode: int = 5) -> TensorDict:
    step = torch.arange(start, start + n)
    end = (step % episode == episode - 1).unsqueeze(-1)
    return TensorDict(
        {
            "observation": step.float().unsqueeze(-1).expand(n, 4).clone(),
            "action": step % 3,
            "done": torch.zeros(n, 1, dtype=torch.bool),
            "next": {
                "observation": (step + 1).float().unsqueeze(-1).expand(n, 4).clone(),
                "reward": step.float().unsqueeze(-1),
                "done": end,
                "truncated": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def brute_segments(storage: StoreReplay) -> list[tuple[int, int]]:
    """Episode pieces from the stored end flags and the cursor, the slow obvious way."""
    names = [
        n
        for n in ("next/done", "next/truncated", "next/terminated")
        if n in {c.name for c in storage.columns}
    ]
    names = names or [
        n for n in ("done", "truncated", "terminated") if n in {c.name for c in storage.columns}
    ]
    ends = torch.zeros(storage.capacity, dtype=torch.bool)
    for name in names:
        ends |= storage.packed.view(name).reshape(storage.capacity, -1).any(-1).cpu()
    out, piece = [], None
    for row in age_rows(len(storage), storage.cursor, storage.capacity).tolist():
        if piece is None:
            piece = [row, 0]
            out.append(piece)
        piece[1] += 1
        if ends[row]:
            piece = None
    return [tuple(p) for p in out]


def segments(storage: StoreReplay) -> list[tuple[int, int]]:
    start, length, _ = storage.episode_segments()
    return list(zip(start.tolist(), length.tolist(), strict=True))


# ----------------------------------------------------------------- torchrl buffers
@pytest.mark.parametrize(
    "columns, make",
    [(None, flat_rows), (FLAT, flat_rows), (None, nested_rows), (NESTED, nested_rows)],
)
def test_tensordict_buffer_extend_add_sample_iterate(columns, make):
    storage = StoreReplay(20, columns=columns)
    rb = TensorDictReplayBuffer(
        storage=storage, batch_size=8, generator=torch.Generator().manual_seed(0)
    )
    index = rb.extend(make(12))
    assert index.tolist() == list(range(12))
    rb.add(make(1, start=12)[0])
    assert len(rb) == 13
    sample = rb.sample()
    assert sample.batch_size == torch.Size([8])
    obs_key = "obs" if "obs" in sample.keys() else "observation"
    assert torch.equal(sample[obs_key][:, 0].long(), sample["index"])
    assert torch.equal(rb[torch.tensor([3, 1])][obs_key][:, 0], torch.tensor([3.0, 1.0]))
    assert rb[2][obs_key][0] == 2.0
    assert {c.name for c in storage.columns} == {
        c.name for c in (columns or (FLAT if make is flat_rows else NESTED))
    }


def test_iteration_without_replacement_visits_every_row_once():
    storage = StoreReplay(16)
    rb = TensorDictReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=4)
    rb.extend(flat_rows(16))
    seen = torch.cat([batch["obs"][:, 0] for batch in rb]).long().sort().values
    assert seen.tolist() == list(range(16))


def test_plain_replay_buffer_with_random_sampler():
    rb = ReplayBuffer(storage=StoreReplay(8), sampler=RandomSampler(), batch_size=5)
    rb.extend(flat_rows(11))
    sample = rb.sample()
    assert sample["obs"].shape == torch.Size([5, 4]) and "index" not in sample.keys()
    assert int(sample["obs"][:, 0].min()) >= 3


def test_slice_sampler_never_crosses_an_episode_end():
    storage = StoreReplay(40)
    rb = TensorDictReplayBuffer(
        storage=storage,
        sampler=SliceSampler(num_slices=4, end_key=("next", "done")),
        batch_size=12,
        generator=torch.Generator().manual_seed(1),
    )
    rb.extend(nested_rows(30, episode=6))
    rb.extend(nested_rows(25, start=30, episode=6))  # wraps the ring
    for _ in range(10):
        sample = rb.sample()
        step = sample["observation"][:, 0].long().reshape(4, 3)
        assert bool((step[:, 1:] == step[:, :-1] + 1).all())
        assert bool((step // 6 == step[:, :1] // 6).all()), "a slice crossed an episode end"
        assert int(step.min()) >= 55 - 40


class _TinyPrioritized(Sampler):
    """A proportional sampler written for this test (torchrl's needs its C++ extension)."""

    def __init__(self, capacity: int):
        self.priority = torch.zeros(capacity)

    def sample(self, storage, batch_size):
        weights = self.priority[: len(storage)]
        index = torch.multinomial(weights, batch_size, replacement=True, generator=self._rng)
        return index, {"priority_weight": weights[index] / weights.max()}

    def mark_update(self, index, *, storage=None):
        self.priority[torch.as_tensor(index)] = 1.0

    def update_priority(self, index, priority, *, storage=None):
        self.priority[torch.as_tensor(index)] = torch.as_tensor(priority, dtype=torch.float32)

    def _empty(self):
        self.priority.zero_()

    def state_dict(self):
        return {"priority": self.priority.clone()}

    def load_state_dict(self, state_dict):
        self.priority.copy_(state_dict["priority"])

    def dumps(self, path):
        pass

    def loads(self, path):
        pass


def test_prioritized_replay_buffer_with_a_given_sampler():
    storage = StoreReplay(10)
    rb = PrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=storage, sampler=_TinyPrioritized(10), batch_size=16
    )
    index = rb.extend(flat_rows(10))
    priority = torch.zeros(10)
    priority[7] = 1.0
    rb.update_priority(index, priority)
    sample = rb.sample()
    assert bool((sample["obs"][:, 0] == 7).all())


def test_prioritized_replay_buffer_with_torchstores_sampler():
    prioritized = pytest.importorskip("torchstore.samplers.prioritized")
    sampler = prioritized.PrioritizedSampler(10, alpha=1.0, beta=0.5)
    storage = StoreReplay(10)
    rb = PrioritizedReplayBuffer(
        alpha=1.0, beta=0.5, storage=storage, sampler=sampler, batch_size=16
    )
    index = rb.extend(flat_rows(10))
    priority = torch.full((10,), 1e-6)
    priority[7] = 1.0
    rb.update_priority(index, priority)
    assert bool((rb.sample()["obs"][:, 0] == 7).all())


def test_max_value_writer_writes_off_the_ring_order_and_the_index_is_rebuilt():
    from torchrl.data import LazyTensorStorage

    ours, theirs = StoreReplay(4), LazyTensorStorage(4)
    for storage in (ours, theirs):
        rb = TensorDictReplayBuffer(
            storage=storage, writer=TensorDictMaxValueWriter(rank_key="reward")
        )
        for start in range(0, 12, 3):
            data = flat_rows(3, start=start, episode=2)
            data["reward"] = data["reward"] * ((-1) ** torch.arange(3))
            rb.extend(data)
    assert len(ours) == len(theirs) == 4
    assert torch.equal(ours[:]["reward"], theirs[:]["reward"])
    assert ours._last_cursor_index == theirs._last_cursor_index
    assert segments(ours) == brute_segments(ours)


def test_consuming_sampler_refills_consumed_slots_and_keeps_the_index_right():
    storage = StoreReplay(8)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=2, consume_after_n_samples=1)
    rb.extend(flat_rows(8, episode=3))
    for _ in range(3):
        rb.sample()
    rb.extend(flat_rows(2, start=8, episode=3))
    assert segments(storage) == brute_segments(storage)


def test_compiled_extend_and_sample_do_not_recompile():
    from torch._dynamo.testing import CompileCounter
    from torchrl.data import RoundRobinWriter

    rb = ReplayBuffer(
        storage=StoreReplay(20, compilable=True),
        sampler=RandomSampler(),
        writer=RoundRobinWriter(compilable=True),
        batch_size=4,
        compilable=True,
    )
    counter = CompileCounter()

    @torch.compile(backend=counter)
    def step(data):
        rb.extend(data)
        return rb.sample()

    data = torch.randn(6, 3)
    for _ in range(3):
        step(data)
    warm = counter.frame_count
    for _ in range(6):  # crosses capacity: the ring wraps
        step(data)
    assert counter.frame_count == warm
    assert len(rb) == 20


# ----------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("make", [flat_rows, nested_rows])
def test_dumps_then_loads_into_a_fresh_buffer_continues_identically(make, tmp_path):
    rb = TensorDictReplayBuffer(
        storage=StoreReplay(16), batch_size=6, generator=torch.Generator().manual_seed(5)
    )
    rb.extend(make(11))
    rb.extend(make(9, start=11))
    rb.sample()
    rb.dumps(tmp_path)
    assert (tmp_path / "storage" / REPLAY_FILE).exists()

    fresh = TensorDictReplayBuffer(
        storage=StoreReplay(16), batch_size=6, generator=torch.Generator()
    )
    fresh.loads(tmp_path)
    for _ in range(3):
        assert (fresh.sample() == rb.sample()).all()
    a, b = rb.storage, fresh.storage
    assert (a.cursor, len(a), a._last_cursor_index) == (b.cursor, len(b), b._last_cursor_index)
    assert all(
        torch.equal(x, y) for x, y in zip(a.episode_segments(), b.episode_segments(), strict=True)
    )
    assert all(torch.equal(x, y) for x, y in zip(a.packed.blocks, b.packed.blocks, strict=True))
    rb.extend(make(3, start=20))
    fresh.extend(make(3, start=20))
    assert (fresh.sample() == rb.sample()).all()
    assert all(
        torch.equal(x, y) for x, y in zip(a.episode_segments(), b.episode_segments(), strict=True)
    )


def test_checkpoint_is_a_trajectory_store_in_age_order(tmp_path):
    storage = StoreReplay(12)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(flat_rows(17, episode=5))  # keeps steps 5..16; episodes 5-9, 10-14, 15-16 (open)
    rb.dumps(tmp_path)
    with TrajectoryStore(tmp_path / "storage" / REPLAY_FILE) as store:
        assert store.num_rows == 12
        assert store.episodes.lengths.tolist() == [5, 5, 2]
        assert store.read_slab(0, 12)["obs"][:, 0].long().tolist() == list(range(5, 17))
        meta = store.manifest.metadata["torchstore.replay"]
        assert meta["open"] is True and meta["cursor"] == 5 and meta["rows"] == 12
        assert meta["episode_ids"] == [1, 2, 3]
    from torchstore.cli import main

    assert main(["info", str(tmp_path / "storage" / REPLAY_FILE)]) in (0, None)


def test_state_dict_round_trip_copies_and_continues_identically():
    rb = TensorDictReplayBuffer(
        storage=StoreReplay(10), batch_size=4, generator=torch.Generator().manual_seed(2)
    )
    rb.extend(nested_rows(14))
    state = rb.state_dict()
    fresh = TensorDictReplayBuffer(
        storage=StoreReplay(10), batch_size=4, generator=torch.Generator()
    )
    fresh.load_state_dict(state)
    for value in state["_storage"]["_storage"].values():
        value.zero_()  # the restored ring holds copies
    assert all(
        torch.equal(x, y)
        for x, y in zip(rb.storage.packed.blocks, fresh.storage.packed.blocks, strict=True)
    )
    assert (fresh.sample() == rb.sample()).all()
    assert segments(fresh.storage) == segments(rb.storage)
    blocks = {b.untyped_storage().data_ptr() for b in rb.storage.packed.blocks}
    for saved in rb.storage.state_dict()["_storage"].values():
        assert saved.untyped_storage().data_ptr() not in blocks


def test_pickle_round_trip():
    storage = StoreReplay(6)
    TensorDictReplayBuffer(storage=storage).extend(flat_rows(8))
    clone = pickle.loads(pickle.dumps(storage))
    assert (clone[:] == storage[:]).all() and segments(clone) == segments(storage)
    assert clone._last_cursor_index == storage._last_cursor_index


# ----------------------------------------------------------------- columns
def test_quantised_column_round_trips_within_half_a_step(tmp_path):
    q = Quantize(-2.0, 2.0)
    columns = (
        ColumnSpec("pixels", torch.float32, (3, 2), quantize=q),
        ColumnSpec("done", torch.bool),
    )
    storage = StoreReplay(32, columns=columns)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=8)
    values = torch.rand(32, 3, 2) * 4 - 2
    rb.extend(TensorDict({"pixels": values, "done": torch.zeros(32, dtype=torch.bool)}, [32]))
    assert storage.packed.blocks[0].dtype == torch.uint8
    got = storage.get(torch.arange(32))["pixels"]
    assert got.dtype == torch.float32
    assert float((got - values).abs().max()) <= q.step / 2 + 1e-6
    rb.dumps(tmp_path)
    fresh = TensorDictReplayBuffer(storage=StoreReplay(32), batch_size=8)
    fresh.loads(tmp_path)
    assert torch.equal(fresh.storage.packed.blocks[0], storage.packed.blocks[0])


def test_bool_and_int_columns_keep_their_dtypes():
    columns = (
        ColumnSpec("mask", torch.bool, (3,)),
        ColumnSpec("count", torch.int32),
        ColumnSpec("big", torch.int64, (2,)),
        ColumnSpec("done", torch.bool),
    )
    storage = StoreReplay(8, columns=columns)
    data = TensorDict(
        {
            "mask": torch.rand(5, 3) < 0.5,
            "count": torch.arange(5, dtype=torch.int32),
            "big": torch.arange(10).reshape(5, 2) * 2**40,
            "done": torch.tensor([False, True, False, False, True]),
        },
        [5],
    )
    ReplayBuffer(storage=storage).extend(data)
    out = storage.get(torch.arange(5))
    for key in ("mask", "count", "big", "done"):
        assert out[key].dtype == data[key].dtype and torch.equal(out[key], data[key])
    assert segments(storage) == [(0, 2), (2, 3)]


def test_safe_casts_are_applied_on_write():
    storage = StoreReplay(4, columns=(ColumnSpec("x", torch.float64), ColumnSpec("n", torch.int64)))
    ReplayBuffer(storage=storage).extend(
        {"x": torch.ones(2, dtype=torch.float32), "n": torch.ones(2, dtype=torch.int32)}
    )
    assert storage[:]["x"].dtype == torch.float64 and storage[:]["n"].dtype == torch.int64


@pytest.mark.parametrize("columns", [FLAT, NESTED, (ColumnSpec("done", torch.bool),)])
def test_packed_rows_gather_into_preallocated_buffers(columns):
    storage = StoreReplay(16, columns=columns)
    rows = nested_rows(16) if columns is NESTED else flat_rows(16)
    ReplayBuffer(storage=storage).extend(rows.select(*[c.key for c in columns]))
    index = torch.tensor([3, 15, 0, 3])
    blocks = storage.packed.gather_blocks(index)
    out = [torch.empty_like(b) for b in blocks]
    assert storage.packed.gather_blocks(index, out=out) is out
    assert all(torch.equal(a, b) for a, b in zip(out, blocks, strict=True))
    batch = storage.packed.batch_from_blocks(out)
    expected = rows[index].select(*[c.key for c in columns])
    assert (batch == expected).all()


def test_index_entry_is_not_stored_but_returned():
    storage = StoreReplay(8, columns=FLAT)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(flat_rows(5))
    assert "index" not in {c.name for c in storage.columns}
    assert storage.get(torch.tensor([4, 2]))["index"].tolist() == [4, 2]


def test_fill_level_and_cursor_scalars_update_in_place():
    storage = StoreReplay(6)
    fill, cursor = storage.fill_level, storage.cursor_tensor
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(flat_rows(4))
    assert (int(fill), int(cursor)) == (4, 4)
    rb.extend(flat_rows(4, start=4))
    assert storage.fill_level is fill and storage.cursor_tensor is cursor
    assert (int(fill), int(cursor)) == (6, 2)
    assert fill.dtype == torch.int64 and fill.ndim == 0 and fill.device == storage.device
    rb.empty()
    assert (int(fill), int(cursor)) == (0, 0)


def test_auto_device_and_compilable_flag():
    storage = StoreReplay(5, device="auto", compilable=True)
    rb = ReplayBuffer(storage=storage, batch_size=2, compilable=True)
    rb.extend(flat_rows(3))
    assert storage.device == torch.device("cpu") and rb.sample()["obs"].shape == torch.Size([2, 4])
    assert storage._last_cursor_index == 2


# ----------------------------------------------------------------- episode index
@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 30),
    chunks=st.lists(st.integers(1, 45), min_size=1, max_size=8),
    episode=st.integers(1, 9),
    nested=st.booleans(),
)
def test_episode_segments_match_brute_force_through_the_buffer(capacity, chunks, episode, nested):
    make = nested_rows if nested else flat_rows
    storage = StoreReplay(capacity)
    rb = TensorDictReplayBuffer(storage=storage)
    start = 0
    last_ids = None
    for n in chunks:
        rb.extend(make(n, start=start, episode=episode))
        start += n
        assert segments(storage) == brute_segments(storage)
        begin, length, ids = storage.episode_segments()
        assert bool((ids[1:] > ids[:-1]).all())
        # Episode id = global episode number of the step (episodes have a fixed length here).
        first_steps = storage.get(begin)["obs" if not nested else "observation"][:, 0].long()
        assert torch.equal(ids, first_steps // episode)
        last_ids = ids
    assert last_ids is not None


def test_rewriting_end_flags_in_place_rebuilds_the_index():
    storage = StoreReplay(10)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(flat_rows(12, episode=5))  # steps 2..11; ends at 4 and 9
    assert segments(storage) == brute_segments(storage) == [(2, 3), (5, 5), (0, 2)]
    patch = flat_rows(1, start=6, episode=1)  # done=True at physical row 6
    rb[torch.tensor([6])] = patch
    assert segments(storage) == brute_segments(storage) == [(2, 3), (5, 2), (7, 3), (0, 2)]
    ids = storage.episode_segments()[2]
    assert bool((ids[1:] > ids[:-1]).all())
    rb[torch.tensor([3])] = flat_rows(1, start=3)  # same end flag: no rebuild, same ids
    assert torch.equal(storage.episode_segments()[2], ids)


def test_segments_live_on_the_storage_device_and_are_cached():
    storage = StoreReplay(8)
    TensorDictReplayBuffer(storage=storage).extend(flat_rows(6))
    first = storage.episode_segments()
    assert first is storage.episode_segments()
    assert all(t.device == storage.device and t.dtype == torch.int64 for t in first)


# ----------------------------------------------------------------- offline to online
def _write_store(path, episodes=(4, 6, 3), quantize=False):
    columns = list(FLAT)
    if quantize:
        columns[0] = ColumnSpec("obs", torch.float32, (4,), quantize=Quantize(0.0, 100.0))
    step = 0
    with TrajectoryStoreWriter(path, columns) as writer:
        for length in episodes:
            data = flat_rows(length, start=step, episode=10**6)
            data["done"][-1] = True
            writer.add_episode(data)
            step += length
    return step


@pytest.mark.parametrize("quantize", [False, True])
def test_from_store_prefills_rows_and_episodes(tmp_path, quantize):
    total = _write_store(tmp_path / "demo.h5", quantize=quantize)
    storage = StoreReplay.from_store(tmp_path / "demo.h5")
    assert len(storage) == storage.capacity == total
    assert storage[:]["obs"][:, 0].round().long().tolist() == list(range(total))
    start, length, ids = storage.episode_segments()
    assert (
        length.tolist() == [4, 6, 3] and ids.tolist() == [0, 1, 2] and start.tolist() == [0, 4, 10]
    )
    assert storage.next_episode_id == 3


def test_from_store_keeps_the_newest_rows_and_continues_online(tmp_path):
    _write_store(tmp_path / "demo.h5")
    with TrajectoryStore(tmp_path / "demo.h5") as store:
        small = StoreReplay.from_store(store, capacity=8)
    assert small[:]["obs"][:, 0].long().tolist() == list(range(5, 13))
    assert segments(small) == [(0, 5), (5, 3)] and small.episode_segments()[2].tolist() == [1, 2]
    big = StoreReplay.from_store(tmp_path / "demo.h5", capacity=20)
    rb = TensorDictReplayBuffer(storage=big)
    big.align_writer(rb)
    rb.extend(flat_rows(4, start=13, episode=10**6))
    assert big[:]["obs"][:, 0].long().tolist() == list(range(17))
    assert segments(big) == [(0, 4), (4, 6), (10, 3), (13, 4)]
    assert big.episode_segments()[2].tolist() == [0, 1, 2, 3]


def test_from_store_of_a_replay_checkpoint_keeps_ids_and_open_episode(tmp_path):
    rb = TensorDictReplayBuffer(storage=StoreReplay(12))
    rb.extend(flat_rows(17, episode=5))
    rb.dumps(tmp_path)
    restored = StoreReplay.from_store(tmp_path / "storage")
    assert restored.episode_segments()[2].tolist() == [1, 2, 3]
    assert restored._episodes.is_open and restored.next_episode_id == 4


# ----------------------------------------------------------------- bad input
def test_from_store_of_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trajectory store"):
        StoreReplay.from_store(tmp_path / "nope.h5")


def test_loads_of_a_plain_store_is_refused(tmp_path):
    _write_store(tmp_path / REPLAY_FILE)
    with pytest.raises(StoreFormatError, match="not a replay checkpoint"):
        StoreReplay(13).loads(tmp_path)


def test_loads_into_a_ring_of_another_capacity(tmp_path):
    rb = TensorDictReplayBuffer(storage=StoreReplay(12))
    rb.extend(flat_rows(5))
    rb.storage.dumps(tmp_path)
    with pytest.raises(ValueError, match="capacity 12"):
        StoreReplay(10).loads(tmp_path)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (
            lambda td: td.set("obs", td["obs"].double()),
            "column 'obs' expects float32\\[4\\], got float64",
        ),
        (
            lambda td: td.set("action", torch.zeros(td.shape[0], 3)),
            "column 'action' expects rows of shape \\[2\\]",
        ),
        (lambda td: td.set("done", torch.zeros(td.shape[0])), "column 'done' expects bool"),
    ],
)
@pytest.mark.parametrize("declared", [True, False])
def test_writes_that_break_the_schema_name_the_column(mutate, match, declared):
    storage = StoreReplay(8, columns=FLAT if declared else None)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(flat_rows(2))
    revision = storage._mutation_revision
    with pytest.raises(ColumnError, match=match):
        rb.extend(mutate(flat_rows(3)))
    assert len(storage) == 2 and storage._mutation_revision == revision


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda td: td.exclude("reward"), "column 'reward' is missing"),
        (lambda td: td.set("extra", torch.zeros(td.shape[0])), "column 'extra' is not a column"),
    ],
)
def test_declared_columns_are_a_schema_every_write_matches(mutate, match):
    storage = StoreReplay(8, columns=FLAT)
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(flat_rows(2))
    with pytest.raises(ColumnError, match=match):
        rb.extend(mutate(flat_rows(3)))
    assert len(storage) == 2


def test_hooks_on_the_own_checkpointer_are_refused():
    with pytest.raises(TypeError, match="no save hooks"):
        StoreReplay(4).register_save_hook(lambda data, path: data)


def test_restoring_into_other_columns_or_capacity_is_refused(tmp_path):
    rb = TensorDictReplayBuffer(storage=StoreReplay(6))
    rb.extend(flat_rows(4))
    rb.storage.dumps(tmp_path)
    with pytest.raises(ColumnError, match="column"):
        StoreReplay(6, columns=NESTED).loads(tmp_path)
    with pytest.raises(ValueError, match="capacity 6"):
        StoreReplay(5).load_state_dict(rb.storage.state_dict())


@pytest.mark.parametrize("ndim", [0, 3, True])
def test_ndim_other_than_one_or_two_is_refused(ndim):
    with pytest.raises(ValueError, match="must be 1 or 2"):
        StoreReplay(10, ndim=ndim)


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True])
def test_capacity_must_be_a_positive_int(capacity):
    with pytest.raises(ValueError, match="capacity"):
        StoreReplay(capacity)


@pytest.mark.parametrize(
    "index", [5, -6, torch.tensor([0, 5]), np.array([7]), [1, 9], torch.tensor([-6])]
)
def test_get_out_of_range(index):
    storage = StoreReplay(10)
    ReplayBuffer(storage=storage).extend(flat_rows(5))
    with pytest.raises(IndexError, match="out of range"):
        storage.get(index)


def test_full_ring_fast_path_keeps_negative_indices_and_bounds():
    storage = StoreReplay(5)
    ReplayBuffer(storage=storage).extend(flat_rows(7))
    assert storage.get(torch.tensor([-1, 0]))["obs"][:, 0].tolist() == [4.0, 5.0]
    with pytest.raises(IndexError, match="index 5 is out of range"):
        storage.get(torch.tensor([0, 5]))


def test_get_before_any_write():
    with pytest.raises(RuntimeError, match="non-initialized"):
        StoreReplay(4).get(0)


def test_inferred_columns_reject_unsupported_dtypes():
    with pytest.raises(ColumnError, match="not supported"):
        ReplayBuffer(storage=StoreReplay(4)).extend({"z": torch.zeros(2, dtype=torch.complex64)})


def test_data_rows_must_match_the_cursor():
    storage = StoreReplay(4)
    with pytest.raises(ValueError, match="addresses 3 rows but the data holds 2"):
        storage.set(torch.tensor([0, 1, 2]), flat_rows(2))
