"""The write path's cached append plan: a repeat of a validated leaf structure is appended in
one compiled pass; anything else (a changed dtype, shape, key or device, a write off the
cursor) is checked as the first write was, with the same errors, and every ring ends up as
the torch path (kernels off) leaves it: rows, episode index, cursor, length."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer

from tests.data.test_packed_rowcopy import kernels
from torchstore.data import ColumnSpec
from torchstore.data.replay import ring as replay_module
from torchstore.data.replay.ring import StoreReplay
from torchstore.data.replay.ring_episodes import RingEpisodes
from torchstore.data.rows import rowcopy
from torchstore.errors import ColumnError

logging.getLogger("torchrl").setLevel(logging.WARNING)

COLUMNS = (
    ColumnSpec("obs", torch.float32, (3,)),
    ColumnSpec("action", torch.int64),
    ColumnSpec("done", torch.bool),
    ColumnSpec("next/obs", torch.float32, (3,)),
)


class PlanSpy:
    """Counts the writes the append plan took."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken = 0
        original = replay_module._AppendPlan.write

        def write(plan, *args, **kwargs):
            status = original(plan, *args, **kwargs)
            self.taken += status == replay_module._WRITTEN
            return status

        monkeypatch.setattr(replay_module._AppendPlan, "write", write)


def chunk(start: int, n: int, *, episode: int = 4, ends: str = "flat", lead=None) -> TensorDict:
    step = torch.arange(start, start + n)
    end = step % episode == episode - 1
    leaves = {
        "obs": step.float().unsqueeze(-1).expand(n, 3) * torch.tensor([1.0, -1.0, 0.5]),
        "action": step * 7,
        "next": {"obs": (step + 1).float().unsqueeze(-1).expand(n, 3).clone()},
    }
    if ends == "flat":
        leaves["done"] = end
    elif ends == "column":  # torchrl's [n, 1] flags, two of them OR-ed
        leaves["next"]["done"] = end.unsqueeze(-1)
        leaves["next"]["truncated"] = (step % 5 == 2).unsqueeze(-1)
    td = TensorDict(leaves, batch_size=[n])
    return td if lead is None else td.reshape(*lead)


def buffer(capacity: int, **kwargs) -> tuple[StoreReplay, TensorDictReplayBuffer]:
    storage = StoreReplay(capacity, **kwargs)
    return storage, TensorDictReplayBuffer(storage=storage, batch_size=4)


def state(storage: StoreReplay) -> dict:
    n = len(storage)
    rows = storage[:] if storage.ndim == 1 else storage.get(slice(None))
    leaves = {
        k if isinstance(k, str) else "/".join(k): v.clone()
        for k, v in rows.items(include_nested=True, leaves_only=True)
    }
    return {
        "len": n,
        "cursor": storage.cursor,
        "last": storage._last_cursor_index,
        "segments": [t.tolist() for t in storage.episode_segments()],
        "streams": storage.segment_streams().tolist(),
        "next_id": storage.next_episode_id,
        "fill_level": int(storage.fill_level),
        "cursor_tensor": int(storage.cursor_tensor),
        "leaves": leaves,
    }


def assert_same(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if k != "leaves"} == {
        k: v for k, v in b.items() if k != "leaves"
    }
    assert a["leaves"].keys() == b["leaves"].keys()
    for name in a["leaves"]:
        assert torch.equal(a["leaves"][name], b["leaves"][name]), name


# ----------------------------------------------------------------- the plan is taken
def test_a_repeat_chunk_takes_the_plan_and_writes_what_the_torch_path_writes(monkeypatch):
    spy = PlanSpy(monkeypatch)
    ours, rb = buffer(10, columns=COLUMNS)
    with kernels(False):
        theirs, trb = buffer(10, columns=COLUMNS)
    for k in range(7):
        rb.extend(chunk(3 * k, 3))
        with kernels(False):
            trb.extend(chunk(3 * k, 3))
    assert spy.taken >= 4  # every write after the first two (validated, then trusted)
    assert theirs._append_plans == []
    assert_same(state(ours), state(theirs))


def test_the_switch_keeps_every_write_on_the_torch_path(monkeypatch):
    spy = PlanSpy(monkeypatch)
    with kernels(False):
        storage, rb = buffer(10, columns=COLUMNS)
        for k in range(4):
            rb.extend(chunk(3 * k, 3))
    assert spy.taken == 0 and storage._append_plans == []


# ----------------------------------------------------------------- bad writes after a hit
def error_of(write) -> str:
    with pytest.raises(ColumnError) as info:
        write()
    return str(info.value)


BAD = {
    "dtype": lambda td: td.set("obs", td["obs"].double()),
    "shape": lambda td: td.set("obs", torch.zeros(td.batch_size[0], 4)),
    "nested shape": lambda td: td.set(("next", "obs"), torch.zeros(td.batch_size[0], 3, 1)),
    "int dtype": lambda td: td.set("action", td["action"].float()),
    "flag dtype": lambda td: td.set("done", td["done"].to(torch.uint8)),
    "missing": lambda td: td.exclude("action"),
    "extra": lambda td: td.set("other", torch.zeros(td.batch_size[0])),
    "missing nested": lambda td: td.exclude(("next", "obs")),
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("declared", [True, False])
def test_a_changed_leaf_after_cached_chunks_gets_the_first_writes_error(bad, declared):
    kwargs = {"columns": COLUMNS} if declared else {}
    cached, rb = buffer(12, **kwargs)
    for k in range(3):
        rb.extend(chunk(3 * k, 3))
    assert cached._append_plans
    before = state(cached)
    fresh, frb = buffer(12, **kwargs)
    with kernels(False):
        frb.extend(chunk(0, 3))  # validated by the general path only
    changed = BAD[bad](chunk(9, 3))
    if not declared and bad in ("missing", "extra", "missing nested"):
        # an inferred ring takes partial writes and grows columns, as torchrl's does
        rb.extend(BAD[bad](chunk(9, 3)))
        frb.extend(BAD[bad](chunk(3, 3)))
        assert len(cached) == 12 and len(fresh) == 6
        return
    message = error_of(lambda: rb.extend(changed))
    assert message == error_of(lambda: frb.extend(BAD[bad](chunk(3, 3))))
    assert_same(state(cached), before)  # nothing written


def test_a_safe_cast_after_cached_chunks_is_converted_not_copied_as_bytes():
    storage, rb = buffer(12, columns=COLUMNS)
    for k in range(3):
        rb.extend(chunk(3 * k, 3))
    half = chunk(9, 3)
    half.set("obs", half["obs"].half())  # float16 -> float32 is safe: converted
    rb.extend(half)
    assert torch.equal(storage[9:12]["obs"], chunk(9, 3)["obs"])
    rb.extend(chunk(12, 3))  # the plan again
    assert torch.equal(storage[0:3]["obs"], chunk(12, 3)["obs"])


def test_a_strided_or_negative_leaf_takes_the_general_path(monkeypatch):
    spy = PlanSpy(monkeypatch)
    storage, rb = buffer(12, columns=COLUMNS)
    for k in range(3):
        rb.extend(chunk(3 * k, 3))
    taken = spy.taken
    odd = chunk(9, 3)
    odd.set("obs", torch.zeros(3, 6)[:, ::2].add_(5))  # rows strided within a row
    rb.extend(odd)
    neg = chunk(12, 3)
    neg.set(("next", "obs"), torch.ones(3, 3)._neg_view())
    rb.extend(neg)
    assert spy.taken == taken
    assert torch.equal(storage[9:12]["obs"], torch.full((3, 3), 5.0))
    assert torch.equal(storage[0:3]["next", "obs"], -torch.ones(3, 3))


def test_a_chunk_whose_rows_come_from_the_ring_itself_is_written_in_order():
    storage, rb = buffer(12, columns=COLUMNS)
    for k in range(4):
        rb.extend(chunk(3 * k, 3))
    expected = storage[0:6].clone()
    rows = TensorDict(
        {
            "obs": storage.packed.view("obs")[0:6],
            "action": storage.packed.view("action")[0:6],
            "done": storage.packed.view("done")[0:6],
            "next": {"obs": storage.packed.view("next/obs")[0:6]},
        },
        batch_size=[6],
    )
    rb.extend(rows)  # overwrites rows 0..5 from themselves
    got = storage[0:6]
    for key in ("obs", "action", "done", ("next", "obs")):
        assert torch.equal(got[key], expected[key])


# ----------------------------------------------------------------- kernels on and off
@settings(max_examples=25, deadline=None)
@given(
    capacity=st.integers(4, 24),
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=10),
    episode=st.integers(1, 7),
    ends=st.sampled_from(["flat", "column", "none"]),
    declared=st.booleans(),
)
def test_a_ring_matches_the_torch_path_with_kernels_on_and_off(
    capacity, sizes, episode, ends, declared
):
    kwargs = {"columns": COLUMNS} if declared and ends == "flat" else {}
    ours, rb = buffer(capacity, **kwargs)
    with kernels(False):
        theirs, trb = buffer(capacity, **kwargs)
    start = 0
    for n in sizes:
        rb.extend(chunk(start, n, episode=episode, ends=ends))
        with kernels(False):
            trb.extend(chunk(start, n, episode=episode, ends=ends))
        start += n
        assert_same(state(ours), state(theirs))


@settings(max_examples=15, deadline=None)
@given(
    envs=st.integers(1, 4),
    capacity=st.integers(4, 40),
    # two time rows at least: torchrl's TensorDictReplayBuffer cannot index a [envs, 1] batch
    steps=st.lists(st.integers(2, 9), min_size=1, max_size=8),
    episode=st.integers(1, 6),
    ends=st.sampled_from(["flat", "column"]),
)
def test_a_multi_env_ring_matches_the_torch_path_with_kernels_on_and_off(
    envs, capacity, steps, episode, ends
):
    ours, rb = buffer(capacity, ndim=2)
    with kernels(False):
        theirs, trb = buffer(capacity, ndim=2)
    start = 0
    for t in steps:
        # [envs, t] batches: the buffer transposes them to [t, envs] (strided leaves)
        rb.extend(chunk(start, envs * t, episode=episode, ends=ends, lead=(envs, t)))
        with kernels(False):
            trb.extend(chunk(start, envs * t, episode=episode, ends=ends, lead=(envs, t)))
        start += envs * t
        assert_same(state(ours), state(theirs))


def test_a_multi_env_repeat_chunk_takes_the_plan(monkeypatch):
    spy = PlanSpy(monkeypatch)
    storage, rb = buffer(64, ndim=2)
    for k in range(5):
        rb.extend(chunk(12 * k, 12, lead=(4, 3)))
    assert spy.taken >= 3
    # an env count other than the ring's is refused as before
    with pytest.raises(ColumnError, match="must hold 4 envs"):
        rb.extend(chunk(0, 12, lead=(3, 4)))


# ----------------------------------------------------------------- copies and sharing
def test_a_copy_of_a_ring_with_a_plan_writes_its_own_rows():
    storage, rb = buffer(12, columns=COLUMNS)
    for k in range(3):
        rb.extend(chunk(3 * k, 3))
    twin = copy.deepcopy(storage)
    twin.set(torch.arange(9, 12), chunk(100, 3))
    twin.set(torch.arange(0, 3), chunk(103, 3))
    assert len(storage) == 9 and int(storage.fill_level) == 9
    assert len(twin) == 12 and int(twin.fill_level) == 12 and int(twin.cursor_tensor) == 3
    assert torch.equal(twin[0:3]["action"], chunk(103, 3)["action"])
    assert torch.equal(storage[0:3]["action"], chunk(0, 3)["action"])


def test_the_device_scalars_follow_writes_after_the_ring_moves_to_shared_memory():
    storage, rb = buffer(12, columns=COLUMNS)
    for k in range(2):
        rb.extend(chunk(3 * k, 3))
    storage._share()
    for k in range(2, 5):
        rb.extend(chunk(3 * k, 3))
        assert int(storage.fill_level) == len(storage) == min(3 * (k + 1), 12)
        assert int(storage.cursor_tensor) == storage.cursor


# ----------------------------------------------------------------- the pieces
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 20),
    chunks=st.lists(st.lists(st.booleans(), min_size=0, max_size=30), max_size=8),
)
def test_append_stops_is_append(capacity, chunks):
    a, b = RingEpisodes(capacity), RingEpisodes(capacity)
    for flags in chunks:
        ends = torch.tensor(flags, dtype=torch.bool)
        a.append(ends)
        b.append_stops(np.flatnonzero(np.array(flags, dtype=bool)), len(flags))
        assert [t.tolist() for t in a.segments()] == [t.tolist() for t in b.segments()]
        assert (a.rows, a.cursor, a.is_open, a.next_episode_id) == (
            b.rows,
            b.cursor,
            b.is_open,
            b.next_episode_id,
        )


@pytest.mark.parametrize("seed", range(6))
def test_append_rows_finds_each_streams_ends_and_copies_like_copy_rows(seed):
    gen = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (), generator=gen))

    steps, envs, row_bytes = draw(1, 12), draw(1, 4), 16
    cap = steps + draw(0, 5)
    first = draw(0, cap - steps + 1)
    source = torch.randint(0, 255, (envs, steps, 6), dtype=torch.uint8, generator=gen)
    view = source.transpose(0, 1)  # [steps, envs, 6], strided
    table = [[view.data_ptr(), view.stride(0), view.stride(1), 3, 6]]
    flags = []  # end flag columns: [steps, envs, k] bools, some of them transposed views
    for _ in range(draw(0, 4)):
        k = draw(1, 3)
        flag = torch.rand(envs, steps, k, generator=gen) < 0.2
        flag = flag.transpose(0, 1) if draw(0, 2) else flag.transpose(0, 1).contiguous()
        flags.append(flag)
        table.append([flag.data_ptr(), flag.stride(0), flag.stride(1), 9, k])
    table = np.array(table, dtype=np.int64)
    end_rows = np.arange(1, len(table), dtype=np.int64)
    ours = torch.zeros(cap * envs, row_bytes, dtype=torch.uint8)
    theirs = ours.clone()
    counts, stops = np.zeros(envs, dtype=np.int64), np.zeros((envs, steps), dtype=np.int64)
    rows = torch.arange(first, first + steps).repeat_interleave(2)[::2]  # a strided cursor
    assert rows.stride(0) == 2
    status = rowcopy.append_rows(
        ours.data_ptr(), cap, row_bytes, rows.data_ptr(), 16, steps, first, envs, table,
        end_rows, counts, stops,
    )  # fmt: skip
    assert status == 0
    rowcopy.copy_rows(theirs.data_ptr(), cap * envs, row_bytes, first * envs, steps, envs, table)
    assert torch.equal(ours, theirs)
    any_flag = torch.zeros(steps, envs, dtype=torch.bool)
    for flag in flags:
        any_flag |= flag.any(-1)
    for e in range(envs):
        expected = torch.nonzero(any_flag[:, e]).reshape(-1).tolist()
        assert stops[e, : counts[e]].tolist() == expected


def test_append_rows_writes_nothing_for_a_cursor_that_is_not_the_run_or_a_source_in_the_block():
    block = torch.zeros(8, 8, dtype=torch.uint8)
    source = torch.arange(16, dtype=torch.uint8).reshape(4, 4)
    table = np.array([[source.data_ptr(), 4, 0, 0, 4]], dtype=np.int64)
    no_ends = np.zeros(0, dtype=np.int64)
    counts, stops = np.zeros(1, dtype=np.int64), np.zeros((1, 4), dtype=np.int64)

    def append(rows, first, table=table, end_rows=no_ends):
        rows = torch.tensor(rows, dtype=torch.int64)
        return rowcopy.append_rows(
            block.data_ptr(), 8, 8, rows.data_ptr(), 8, len(rows), first, 1, table,
            end_rows, counts, stops,
        )  # fmt: skip

    assert append([2, 3, 5, 6], 2) == rowcopy.NOT_A_RUN
    assert append([2, 3, 4, 5], 3) == rowcopy.NOT_A_RUN
    assert append([6, 7, 8, 9], 6) == rowcopy.NOT_A_RUN  # past the end
    inside = np.array([[block.data_ptr() + 8, 8, 0, 0, 4]], dtype=np.int64)
    assert append([0, 1, 2, 3], 0, inside) == rowcopy.NOT_COPYABLE
    wide = np.array([[source.data_ptr(), 4, 0, 6, 4]], dtype=np.int64)
    assert append([0, 1, 2, 3], 0, wide) == rowcopy.NOT_COPYABLE
    bad_end = np.array([3], dtype=np.int64)
    assert append([0, 1, 2, 3], 0, end_rows=bad_end) == rowcopy.NOT_COPYABLE
    assert not block.any()
    assert append([4, 5, 6, 7], 4) == 0
    assert torch.equal(block[4:, :4], source)
