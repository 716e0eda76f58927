"""The torchrl Sampler classes, driven by torchrl's own replay buffers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sampler_fakes import EpisodeLazyStorage, FakeRing
from scipy.stats import chisquare
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import PrioritizedSampler as TorchrlPrioritizedSampler
from torchrl.data.replay_buffers.samplers import Sampler

from torchstore.errors import EmptyStorageError
from torchstore.samplers import PrioritizedSampler, SequenceWindowSampler, UniformSampler

CAPACITY = 32
EPISODES = (7, 9, 5, 12, 8)  # 41 rows: the ring wraps


def episodes_td(lengths=EPISODES, *, td_error: bool = False) -> TensorDict:
    """Rows numbered by write order, with their episode (and a positive td_error)."""
    episode = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    td = TensorDict({"obs": torch.arange(episode.numel()), "episode": episode}, [episode.numel()])
    if td_error:
        gen = torch.Generator().manual_seed(0)
        td["td_error"] = torch.rand(episode.numel(), generator=gen) + 0.1
    return td


def fill(rb: TensorDictReplayBuffer, kind: str) -> None:
    rb.extend(episodes_td(td_error="prioritized" in kind))


def make_sampler(kind: str, seed: int | None = 0) -> Sampler:
    if kind == "uniform":
        return UniformSampler(generator=seed)
    if kind == "prioritized":
        return PrioritizedSampler(CAPACITY, generator=seed)
    if kind == "window_prioritized":
        return SequenceWindowSampler(4, generator=seed, priority=PrioritizedSampler(CAPACITY))
    return SequenceWindowSampler(4, generator=seed)


def make_buffer(kind: str, seed: int | None = 0, **kwargs) -> TensorDictReplayBuffer:
    windows = kind.startswith("window")
    storage = EpisodeLazyStorage(CAPACITY) if windows else LazyTensorStorage(CAPACITY)
    return TensorDictReplayBuffer(
        storage=storage, sampler=make_sampler(kind, seed), priority_key="td_error", **kwargs
    )


KINDS = ["uniform", "prioritized", "window", "window_prioritized"]


# ---------------------------------------------------------------- contract suite (all samplers)
@pytest.mark.parametrize("kind", KINDS)
def test_is_a_torchrl_sampler_and_samples_through_the_buffer(kind):
    rb = make_buffer(kind)
    assert isinstance(rb.sampler, Sampler)
    fill(rb, kind)
    batch = rb.sample(8)
    assert batch.shape == (8,)
    assert (batch["obs"] >= 41 - CAPACITY).all()  # only rows still in the ring
    assert rb.can_sample(8)


@pytest.mark.parametrize("kind", KINDS)
def test_empty_storage_raises(kind):
    rb = make_buffer(kind)
    with pytest.raises(EmptyStorageError, match="Cannot sample from an empty storage"):
        rb.sample(8)
    assert not rb.can_sample(8)


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_draws(kind):
    a, b = make_buffer(kind, seed=5), make_buffer(kind, seed=5)
    for rb in (a, b):
        fill(rb, kind)
    assert torch.equal(a.sample(8)["obs"], b.sample(8)["obs"])


@pytest.mark.parametrize("kind", KINDS)
def test_buffer_generator_takes_precedence(kind):
    a = make_buffer(kind, seed=1, generator=torch.Generator().manual_seed(9))
    b = make_buffer(kind, seed=2, generator=torch.Generator().manual_seed(9))
    for rb in (a, b):
        fill(rb, kind)
    assert torch.equal(a.sample(8)["obs"], b.sample(8)["obs"])


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_round_trip_continues_identically(kind):
    rb = make_buffer(kind, seed=3)
    fill(rb, kind)
    rb.sample(8)
    state = rb.state_dict()
    want = [rb.sample(8)["obs"] for _ in range(3)]
    fresh = make_buffer(kind, seed=None)
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.sample(8)["obs"], w) for w in want)


@pytest.mark.parametrize("kind", KINDS)
def test_dumps_loads_continues_identically(kind, tmp_path):
    rb = make_buffer(kind, seed=4)
    fill(rb, kind)
    rb.sample(8)
    rb.dumps(tmp_path)
    want = [rb.sample(8)["obs"] for _ in range(3)]
    fresh = make_buffer(kind, seed=None)
    fresh.loads(tmp_path)
    assert all(torch.equal(fresh.sample(8)["obs"], w) for w in want)


@pytest.mark.parametrize("kind", KINDS)
def test_loads_from_a_folder_without_state_raises(kind, tmp_path):
    with pytest.raises(FileNotFoundError, match="no sampler state at"):
        make_sampler(kind).loads(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_generator_is_rejected(kind):
    cls = type(make_sampler(kind))
    args = {"uniform": (), "prioritized": (CAPACITY,), "window": (4,), "window_prioritized": (4,)}[
        kind
    ]
    with pytest.raises(TypeError, match="generator must be a torch.Generator, an int seed or None"):
        cls(*args, generator="seed")
    with pytest.raises(TypeError, match="ere must be an ERE schedule or None, got float"):
        cls(*args, ere=0.5)


# ---------------------------------------------------------------- uniform
def test_uniform_indices_cover_the_valid_prefix():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=UniformSampler(generator=0))
    rb.extend(torch.arange(10))
    index = rb.sampler.sample(rb.storage, 2000)[0]
    assert set(index.tolist()) == set(range(10))


def test_uniform_without_replacement_draws_distinct_rows():
    sampler = UniformSampler(replacement=False, generator=0)  # torchrl's spelling works too
    assert sampler.with_replacement is False
    ring = FakeRing(10)
    ring.write(10)
    index, _ = sampler.sample(ring, 10)
    assert sorted(index.tolist()) == list(range(10))
    with pytest.raises(
        ValueError, match=r"batch_size \(11\) must be <= the sampleable rows \(10\)"
    ):
        sampler.sample(ring, 11)
    with pytest.raises(TypeError, match="pass either replacement= or with_replacement="):
        UniformSampler(replacement=False, with_replacement=False)


# ---------------------------------------------------------------- prioritized
PRIORITIES = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0, 0.0, 6.0, 7.0], dtype=torch.float64)


def prioritized_ring(alpha=0.6, beta=0.4, eps=0.0, **kwargs):
    ring = FakeRing(8)
    ring.write(8)
    sampler = PrioritizedSampler(8, alpha=alpha, beta=beta, eps=eps, generator=11, **kwargs)
    sampler.update_priority(torch.arange(8), PRIORITIES)
    return ring, sampler


def test_prioritized_is_torchrl_prioritized_for_isinstance_checks():
    assert isinstance(PrioritizedSampler(4), TorchrlPrioritizedSampler)


def test_frequencies_follow_p_to_the_alpha_chi_square():
    ring, sampler = prioritized_ring(alpha=0.6)
    index, _ = sampler.sample(ring, 40_000)
    counts = torch.bincount(index, minlength=8).to(torch.float64)
    assert counts[5] == 0  # zero priority (eps=0): never drawn
    keep = PRIORITIES > 0
    expected = PRIORITIES[keep] ** 0.6
    expected = expected / expected.sum() * counts.sum()
    p_value = chisquare(counts[keep].numpy(), expected.numpy()).pvalue
    assert p_value > 1e-3, f"chi-square p-value {p_value:.2e} (fixed seed 11)"


def test_importance_weights_match_closed_form():
    ring, sampler = prioritized_ring(alpha=0.7, beta=0.5, eps=1e-3)
    index, info = sampler.sample(ring, 64)
    stored = (PRIORITIES + 1e-3) ** 0.7
    want = (stored[index] / stored.min()) ** -0.5
    assert info["priority_weight"].dtype == torch.float32
    assert torch.allclose(info["priority_weight"], want.float())
    assert (info["priority_weight"] <= 1).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.0, 0.5, 3.0]), min_size=1, max_size=20), st.integers(0, 99))
def test_zero_priority_rows_are_never_sampled(priorities, seed):
    if not any(priorities):
        return
    n = len(priorities)
    ring = FakeRing(n)
    ring.write(n)
    sampler = PrioritizedSampler(n, alpha=0.8, eps=0.0, generator=seed)
    sampler.update_priority(torch.arange(n), torch.tensor(priorities))
    index, info = sampler.sample(ring, 256)
    assert all(priorities[i] > 0 for i in index.tolist())
    assert torch.isfinite(info["priority_weight"]).all()


def test_new_rows_get_the_max_priority_seen():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(8), sampler=PrioritizedSampler(8, alpha=1.0, eps=0.0)
    )
    sampler = rb.sampler
    assert sampler.default_priority == 1.0
    index = rb.extend(torch.arange(3))
    rb.update_priority(index, torch.tensor([0.5, 9.0, 2.0]))
    rb.extend(torch.arange(2))
    assert sampler.default_priority == 9.0
    assert sampler.tree.values()[:5].tolist() == [0.5, 9.0, 2.0, 9.0, 9.0]


def test_storage_filled_before_the_buffer_gets_default_priorities():
    storage = LazyTensorStorage(8)
    ReplayBuffer(storage=storage).extend(torch.arange(5))
    rb = ReplayBuffer(storage=storage, sampler=PrioritizedSampler(8, eps=0.0))
    assert rb.sampler.tree.values().tolist() == [1.0] * 5 + [0.0] * 3
    assert rb.sample(4).shape == (4,)


def test_update_priority_drops_negative_indices_and_last_duplicate_wins():
    _, sampler = prioritized_ring(alpha=1.0)
    sampler.update_priority(torch.tensor([-1, 2, 2, -1]), torch.tensor([100.0, 5.0, 8.0, 100.0]))
    assert sampler.tree.values()[2] == 8.0 and sampler.default_priority == 8.0
    sampler.update_priority(-1, 1000.0)  # a lone -1 is dropped too
    assert sampler.default_priority == 8.0


def test_bad_priorities_are_rejected():
    _, sampler = prioritized_ring()
    with pytest.raises(ValueError, match="priority must be finite and >= 0, got nan at index 3"):
        sampler.update_priority(torch.tensor([1, 3]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="priority must be finite and >= 0, got -0.5 at index 1"):
        sampler.update_priority(torch.tensor([1, 3]), torch.tensor([-0.5, 1.0]))
    with pytest.raises(ValueError, match="priority must be finite and >= 0, got inf at index 0"):
        sampler.update_priority(0, float("inf"))
    with pytest.raises(ValueError, match=r"one value or one per index \(2\), got shape \(3,\)"):
        sampler.update_priority(torch.tensor([1, 3]), torch.ones(3))
    with pytest.raises(ValueError, match=r"index must be < capacity \(8\), got 8"):
        sampler.update_priority(8, 1.0)


def test_bad_constructor_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"capacity \(0\) must be an int >= 1"):
        PrioritizedSampler(0)
    with pytest.raises(ValueError, match=r"alpha \(-1\) must be a finite number >= 0"):
        PrioritizedSampler(4, alpha=-1)
    with pytest.raises(ValueError, match=r"beta \(nan\) must be a finite number >= 0"):
        PrioritizedSampler(4, beta=float("nan"))
    with pytest.raises(ValueError, match="reduction must be one of"):
        PrioritizedSampler(4, reduction="mode")
    with pytest.raises(ValueError, match=r"beta_schedule must be a callable t -> beta or a tuple"):
        PrioritizedSampler(4, beta_schedule=(1.0, 0))
    with pytest.raises(ValueError, match=r"alpha \(-0.1\) must be a finite number >= 0"):
        PrioritizedSampler(4).alpha = -0.1
    with pytest.raises(ValueError, match=r"beta \(-2\) must be a finite number >= 0"):
        PrioritizedSampler(4).beta = -2


def test_all_zero_priorities_and_oversized_storage_raise():
    ring = FakeRing(4)
    ring.write(4)
    sampler = PrioritizedSampler(4, eps=0.0)
    sampler.update_priority(torch.arange(4), 0.0)
    with pytest.raises(EmptyStorageError, match="all 4 sampleable rows have priority 0"):
        sampler.sample(ring, 2)
    with pytest.raises(
        ValueError, match="storage holds 4 rows but PrioritizedSampler capacity is 3"
    ):
        PrioritizedSampler(3).sample(ring, 2)
    from torchstore.samplers import ERE

    with pytest.raises(ValueError, match=r"with ERE, PrioritizedSampler capacity \(5\) must equal"):
        PrioritizedSampler(5, ere=ERE(c_min=1)).sample(ring, 2)


def test_beta_schedule_linear_and_callable():
    ring, sampler = prioritized_ring(beta=0.4, beta_schedule=(1.0, 4))
    betas = []
    for _ in range(6):
        betas.append(sampler.beta)
        sampler.sample(ring, 1)
    assert betas == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0, 1.0])
    ring, sampler = prioritized_ring(beta_schedule=lambda t: 0.1 * t)
    sampler.sample(ring, 1)
    assert sampler.beta == pytest.approx(0.1)


def test_alpha_change_rewrites_the_tree_from_raw_priorities():
    _, sampler = prioritized_ring(alpha=0.6, eps=0.0)
    sampler.alpha = 1.0
    assert torch.allclose(sampler.tree.values(), PRIORITIES)


def test_tensordict_buffer_priority_flows():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(16),
        sampler=PrioritizedSampler(16, alpha=1.0, eps=0.0, generator=0),
        priority_key="td_error",
    )
    td = TensorDict({"obs": torch.arange(6.0), "td_error": torch.arange(1.0, 7.0)}, [6])
    rb.extend(td)  # td_error present: extend sets those priorities
    assert rb.sampler.tree.values()[:6].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    batch = rb.sample(4)
    assert set(batch.keys()) >= {"index", "priority_weight"}
    batch["td_error"] = torch.full((4, 3), 10.0)  # extra dims are reduced with sampler.reduction
    rb.update_tensordict_priority(batch)
    assert (rb.sampler.tree.values()[batch["index"]] == 10.0).all()


def test_torchrl_prioritized_replay_buffer_takes_our_sampler():
    rb = PrioritizedReplayBuffer(
        alpha=0.7,
        beta=0.5,
        storage=LazyTensorStorage(16),
        sampler=PrioritizedSampler(16, generator=0),
    )
    index = rb.extend(torch.arange(10))
    rb.update_priority(index, torch.linspace(0.1, 5.0, 10))
    data, info = rb.sample(8, return_info=True)
    assert data.shape == (8,) and info["priority_weight"].shape == (8,)


def test_prioritized_load_with_other_capacity_raises():
    with pytest.raises(ValueError, match="capacity must match the checkpoint: this sampler has 4"):
        PrioritizedSampler(4).load_state_dict(PrioritizedSampler(6).state_dict())


# ---------------------------------------------------------------- sequence windows
def window_buffer(length=4, **kwargs) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(
        storage=EpisodeLazyStorage(CAPACITY),
        sampler=SequenceWindowSampler(length, generator=0, **kwargs),
    )
    rb.extend(episodes_td())
    return rb


def test_windows_through_torchrl_reshape_to_num_windows_by_length():
    rb = window_buffer(4)
    batch = rb.sample(24).reshape(6, 4)
    assert (batch["episode"] == batch["episode"][:, :1]).all()  # one episode per window
    assert (batch["episode_id"] == batch["episode"]).all()
    assert (batch["obs"].diff(dim=1) == 1).all()  # consecutive rows, no wrap crossing
    assert (batch["window_id"] == torch.arange(6)[:, None]).all()
    assert (batch["window_step"] == torch.arange(4)).all()
    assert batch["mask"].all()


def test_sample_windows_returns_two_d_index_and_pad_masks():
    ring = FakeRing(16)
    ring.write(2)
    ring.write(3)
    sampler = SequenceWindowSampler(4, pad=True, generator=0)
    index, info = sampler.sample_windows(ring, 50)
    assert index.shape == (50, 4) and info["mask"].shape == (50, 4)
    assert info["episode_id"].shape == (50,) and info["start_step"].shape == (50,)
    assert (info["mask"].sum(1) == torch.where(info["episode_id"] == 0, 2, 3)).all()


def test_window_batch_size_rules():
    rb = window_buffer(4)
    with pytest.raises(
        ValueError, match="batch_size must be a multiple of the window length 4, got 10"
    ):
        rb.sample(10)
    rb = window_buffer(4, num_windows=3)
    assert rb.sample(12).shape == (12,)
    with pytest.raises(
        ValueError, match=r"batch_size must equal num_windows \* length = 3 \* 4 = 12, got 8"
    ):
        rb.sample(8)


def test_window_longer_than_every_episode_raises():
    rb = window_buffer(13)
    with pytest.raises(EmptyStorageError, match="T=13: the longest episode has 12 rows"):
        rb.sample(13)
    assert not rb.can_sample(13)


def test_window_needs_an_episode_index():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=SequenceWindowSampler(2))
    rb.extend(episodes_td((3, 3)))
    with pytest.raises(
        TypeError, match=r"needs a storage with an episode index \(episode_segments\(\)\)"
    ):
        rb.sample(4)


def test_bad_window_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"length \(0\) must be an int >= 1 \(the window length\)"):
        SequenceWindowSampler(0)
    with pytest.raises(ValueError, match=r"num_windows \(0\) must be an int >= 1 or None"):
        SequenceWindowSampler(2, num_windows=0)


# ---------------------------------------------------------------- prioritized windows
def prioritized_window_ring(T=3, **kwargs):
    ring = FakeRing(16)
    for n in (6, 5, 5, 4):  # 20 rows into 16: the first episode is cut by the ring
        ring.write(n)
    gen = torch.Generator().manual_seed(3)
    row_priority = torch.rand(16, generator=gen, dtype=torch.float64) + 0.2
    row_priority[ring.cursor] = 0.0  # a zero-priority start row
    prio = PrioritizedSampler(16, alpha=1.0, beta=0.5, eps=0.0)
    prio.update_priority(torch.arange(16), row_priority)
    sampler = SequenceWindowSampler(T, priority=prio, generator=7, **kwargs)
    return ring, sampler, row_priority


def test_prioritized_windows_follow_start_row_priority_chi_square():
    ring, sampler, row_priority = prioritized_window_ring()
    index, info = sampler.sample_windows(ring, 30_000)
    starts = index[:, 0]
    start, length, _ = ring.episode_segments()
    valid = sorted(
        int((s + o) % 16) for s, n in zip(start, length, strict=True) for o in range(int(n) - 2)
    )
    assert set(starts.tolist()) <= set(valid)
    assert ring.cursor not in set(starts.tolist())  # priority 0: never a start
    keep = [r for r in valid if row_priority[r] > 0]
    counts = torch.bincount(starts, minlength=16).to(torch.float64)[keep]
    expected = row_priority[keep] / row_priority[keep].sum() * counts.sum()
    p_value = chisquare(counts.numpy(), expected.numpy()).pvalue
    assert p_value > 1e-3, f"chi-square p-value {p_value:.2e} (fixed seed 7)"
    for rows in index.tolist():  # still whole windows inside one episode
        assert len({ring.row_episode[r] for r in rows}) == 1


def test_prioritized_window_weights_use_valid_start_rows_only():
    ring, sampler, row_priority = prioritized_window_ring()
    start, length, _ = ring.episode_segments()
    last_row = int((start[-1] + length[-1] - 1) % 16)  # cannot start a window of 3
    sampler.priority.update_priority(last_row, 1e-6)
    index, info = sampler.sample_windows(ring, 64)
    valid = [
        int((s + o) % 16) for s, n in zip(start, length, strict=True) for o in range(int(n) - 2)
    ]
    p = torch.tensor([float(row_priority[r]) for r in valid])
    p_min = p[p > 0].min()
    want = (row_priority[index[:, 0]] / p_min) ** -0.5
    assert torch.allclose(info["priority_weight"], want.float())


def test_prioritized_windows_through_torchrl_buffer():
    rb = make_buffer("window_prioritized")
    fill(rb, "window_prioritized")
    batch = rb.sample(16).reshape(4, 4)
    assert (batch["priority_weight"] == batch["priority_weight"][:, :1]).all()
    assert (batch["obs"].diff(dim=1) == 1).all()
    rb.update_priority(batch["index"].reshape(-1), torch.full((16,), 50.0))
    assert rb.sampler.default_priority == 50.0


def test_prioritized_window_errors():
    ring, sampler, _ = prioritized_window_ring(T=7)
    with pytest.raises(EmptyStorageError, match="T=7: the longest episode has 5 rows"):
        sampler.sample_windows(ring, 2)
    ring, sampler, _ = prioritized_window_ring()
    sampler.priority.update_priority(torch.arange(16), 0.0)
    with pytest.raises(EmptyStorageError, match="all window start rows have priority 0"):
        sampler.sample_windows(ring, 2)
    bad = SequenceWindowSampler(3, priority=PrioritizedSampler(8))
    with pytest.raises(ValueError, match=r"priority sampler capacity \(8\) must equal the storage"):
        bad.sample_windows(ring, 2)
    with pytest.raises(TypeError, match="priority must be a torchstore PrioritizedSampler or None"):
        SequenceWindowSampler(3, priority=0.5)
    with pytest.raises(ValueError, match="the checkpoint holds window priorities"):
        SequenceWindowSampler(3).load_state_dict(sampler.state_dict())


def test_samplers_pickle_and_continue_identically():
    import pickle

    for kind in KINDS:
        rb = make_buffer(kind, seed=2)
        fill(rb, kind)
        sampler = rb.sampler
        copy = pickle.loads(pickle.dumps(sampler))
        a = sampler.sample(rb.storage, 8)[0]
        b = copy.sample(rb.storage, 8)[0]
        assert torch.equal(a, b), kind
