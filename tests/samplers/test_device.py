"""The device path: Philox sampling and sample_into, graph-safe on CPU (torch.compile with
fullgraph=True) and, on a GPU, under CUDA graph capture and replay."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import ReplayBuffer

from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.data.replay.ring import StoreReplay
from torchstore.errors import EmptyStorageError
from torchstore.samplers import PrioritizedSampler
from torchstore.samplers.device import PhiloxSampler, empty_batch, sample_into, update_priority_
from torchstore.samplers.philox import PhiloxStream

COLUMNS = (
    ColumnSpec("obs", torch.float32, (5,)),
    ColumnSpec("action", torch.float32, (2,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("pix", torch.float32, (3,), quantize=Quantize(0.0, 1.0)),
)


def _rows(start: int, n: int, device="cpu") -> TensorDict:
    r = torch.arange(start, start + n, dtype=torch.float32, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    done[-1] = True
    return TensorDict(
        {
            "obs": r[:, None].expand(n, 5).clone(),
            "action": -r[:, None].expand(n, 2).clone(),
            "reward": r,
            "done": done,
            "pix": (r[:, None] % 7 / 7).expand(n, 3).clone(),
        },
        [n],
        device=device,
    )


def _replay(capacity=64, filled=40, device="cpu") -> StoreReplay:
    storage = StoreReplay(capacity, columns=COLUMNS, device=device)
    storage.buffer = ReplayBuffer(
        storage=storage, sampler=PhiloxSampler(seed=0)
    )  # for later extends
    storage.buffer.extend(_rows(0, filled, device))
    return storage


def _check_rows(batch: TensorDict) -> None:
    rows = batch["index"].float()
    assert torch.equal(batch["reward"], rows) and torch.equal(batch["obs"][:, 3], rows)
    assert torch.equal(batch["action"][:, 1], -rows)
    assert (batch["pix"][:, 0] - rows % 7 / 7).abs().max() <= 1 / 510 + 1e-6


def test_philox_sampler_in_a_torchrl_buffer_reproduces_from_its_seed():
    storage = StoreReplay(50, columns=COLUMNS)
    rb = ReplayBuffer(storage=storage, sampler=PhiloxSampler(seed=5, stream=1), batch_size=16)
    with pytest.raises(EmptyStorageError, match="empty storage"):
        rb.sample()
    rb.extend(_rows(0, 30))
    first = rb.sample()["reward"]
    state = rb._sampler.state_dict()
    second = rb.sample()["reward"]
    again = PhiloxSampler(seed=5, stream=1)
    again.load_state_dict(state)
    assert torch.equal(again.sample(storage, 16)[0].float(), second)
    assert not torch.equal(first, second)
    other_stream = PhiloxSampler(seed=5, stream=2).sample(storage, 16)[0]
    assert not torch.equal(other_stream, PhiloxSampler(seed=5, stream=1).sample(storage, 16)[0])
    with pytest.raises(ValueError, match="does not match"):
        PhiloxSampler(seed=6).load_state_dict(state)


def test_sample_into_fills_a_preallocated_batch_in_place():
    storage = _replay()
    out = empty_batch(storage, 32)
    obs_ptr = out["obs"].data_ptr()
    sampler = PhiloxSampler(seed=1)
    sample_into(storage, sampler, out)
    assert out["obs"].data_ptr() == obs_ptr
    assert int(out["index"].max()) < 40
    _check_rows(out)
    # a plain TensorDict of the right shapes works too (one gather per column)
    plain = TensorDict({k: torch.zeros_like(v) for k, v in out.items()}, [32])
    replay = PhiloxSampler(seed=1)
    sample_into(storage, replay, plain)
    assert torch.equal(plain["index"], out["index"]) and torch.equal(plain["obs"], out["obs"])
    with pytest.raises(TypeError, match="PhiloxSampler .* or a PrioritizedSampler"):
        sample_into(storage, object(), out)


@pytest.mark.parametrize("raw", [False, True])
def test_a_packed_batch_is_gathered_in_place_with_the_same_rows(raw):
    storage = _replay()
    plain, packed = (
        empty_batch(storage, 32, raw=raw),
        empty_batch(storage, 32, raw=raw, packed=True),
    )
    # the stored columns share one row block (quantised ones read as float are their own)
    shared = {k for k in ("obs", "action", "reward", "done", "pix") if k != "pix" or raw}
    ptrs = {k: packed[k].untyped_storage().data_ptr() for k in shared}
    assert len(set(ptrs.values())) == 1
    before = {k: packed[k].data_ptr() for k in packed.keys()}
    for _ in range(3):
        a = sample_into(storage, PhiloxSampler(seed=4), plain)
        b = sample_into(storage, PhiloxSampler(seed=4), packed)
        assert b is packed and {k: packed[k].data_ptr() for k in packed.keys()} == before
        for key in a.keys():
            assert torch.equal(a[key], b[key]), key
    assert packed["pix"].dtype == (torch.uint8 if raw else torch.float32)
    if not raw:
        _check_rows(packed)


def test_resident_store_takes_the_device_path(tmp_path):
    with TrajectoryStoreWriter(tmp_path / "s.h5", COLUMNS) as w:
        w.add_episode(_rows(0, 25).to_dict())
    view = TrajectoryStore(tmp_path / "s.h5").resident()
    out = sample_into(view, PhiloxSampler(seed=2), empty_batch(view, 64))
    assert int(out["index"].max()) < 25
    _check_rows(out)
    # the bare ResidentStore (rows and episodes, no torchrl face) is not a storage: the
    # message names what is
    bare = view.resident
    with pytest.raises(TypeError, match=r"ResidentStorage that TrajectoryStore.resident\(\)"):
        sample_into(bare, PhiloxSampler(seed=2), empty_batch(view, 8))


def _compiled(fn):
    return torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=False)


def test_uniform_sample_into_compiles_without_graph_breaks_and_matches_eager():
    storage = _replay()
    eager_sampler, compiled_sampler = PhiloxSampler(seed=9), PhiloxSampler(seed=9)
    eager_out, compiled_out = empty_batch(storage, 48), empty_batch(storage, 48)
    step = _compiled(lambda out: sample_into(storage, compiled_sampler, out))
    for i in range(4):
        sample_into(storage, eager_sampler, eager_out)
        step(compiled_out)
        assert torch.equal(eager_out["index"], compiled_out["index"]), f"call {i}"
        assert torch.equal(eager_out["pix"], compiled_out["pix"])
    # rows added between calls are sampled by the same compiled step (fill level on device)
    storage.buffer.extend(_rows(40, 20))
    seen = torch.cat([step(compiled_out)["index"].clone() for _ in range(20)])
    assert int(seen.max()) >= 40
    _check_rows(compiled_out)


def _prioritized(storage, seed):
    sampler = PrioritizedSampler(storage.capacity, alpha=0.7, beta=0.5, philox=PhiloxStream(seed))
    n = len(storage)
    sampler.update_priority(torch.arange(n), torch.linspace(0.1, 5.0, n))
    return sampler


def test_prioritized_sample_into_and_update_compile_and_match_eager():
    storage = _replay()
    eager_sampler, compiled_sampler = _prioritized(storage, 4), _prioritized(storage, 4)
    eager_out, compiled_out = empty_batch(storage, 32), empty_batch(storage, 32)

    def train_step(sampler, out):
        sample_into(storage, sampler, out)
        update_priority_(sampler, out["index"], out["reward"] % 3 + 0.5)  # a stand-in TD error
        return out

    step = _compiled(train_step)
    for i in range(3):
        train_step(eager_sampler, eager_out)
        step(compiled_sampler, compiled_out)
        assert torch.equal(eager_out["index"], compiled_out["index"]), f"call {i}"
        assert torch.allclose(eager_out["priority_weight"], compiled_out["priority_weight"])
    assert torch.equal(eager_sampler.tree.values(), compiled_sampler.tree.values())
    _check_rows(compiled_out)
    # the weights are the closed form (p_i / p_min) ** -beta over the valid rows
    tree = eager_sampler.tree.values()[: len(storage)].clone()
    sample_into(storage, eager_sampler, eager_out)
    expected = (tree[eager_out["index"]] / tree[tree > 0].min()) ** -0.5
    assert torch.allclose(eager_out["priority_weight"], expected.float())


def test_prioritized_device_path_needs_a_philox_stream():
    storage = _replay()
    with pytest.raises(TypeError, match="philox=PhiloxStream"):
        sample_into(storage, PrioritizedSampler(storage.capacity), empty_batch(storage, 4))
    with pytest.raises(TypeError, match="PhiloxStream or None"):
        PrioritizedSampler(8, philox=3)


@pytest.mark.slow
def test_sample_into_compiles_with_inductor():
    storage = _replay()
    eager_sampler, compiled_sampler = PhiloxSampler(seed=3), PhiloxSampler(seed=3)
    eager_out, compiled_out = empty_batch(storage, 16), empty_batch(storage, 16)
    step = torch.compile(lambda out: sample_into(storage, compiled_sampler, out), fullgraph=True)
    for _ in range(2):
        sample_into(storage, eager_sampler, eager_out)
        step(compiled_out)
        assert torch.equal(eager_out["index"], compiled_out["index"])
        assert torch.equal(eager_out["obs"], compiled_out["obs"])


# ---------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_same_seed_same_indices_on_cpu_and_cuda():
    cpu = _replay(device="cpu")
    gpu = _replay(device="cuda")
    a = sample_into(cpu, PhiloxSampler(seed=11), empty_batch(cpu, 256))["index"]
    b = sample_into(gpu, PhiloxSampler(seed=11), empty_batch(gpu, 256))["index"]
    assert torch.equal(a, b.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("prioritized", [False, True])
def test_cuda_graph_replays_draw_like_eager_calls_and_see_new_rows(prioritized):
    storage = _replay(capacity=128, filled=40, device="cuda")

    def make():
        if prioritized:
            sampler = PrioritizedSampler(128, philox=PhiloxStream(7, device="cuda"), device="cuda")
            sampler.update_priority(
                torch.arange(128, device="cuda"), torch.ones(128, device="cuda")
            )
            return sampler
        return PhiloxSampler(seed=7, device="cuda")

    eager_sampler, graph_sampler = make(), make()
    eager_out, graph_out = empty_batch(storage, 64), empty_batch(storage, 64, packed=prioritized)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the graph, then re-align the streams
        for _ in range(2):
            sample_into(storage, graph_sampler, graph_out)
    torch.cuda.current_stream().wait_stream(stream)
    (graph_sampler.philox).position.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sample_into(storage, graph_sampler, graph_out)
    (graph_sampler.philox).position.zero_()
    for k in range(5):
        graph.replay()
        sample_into(storage, eager_sampler, eager_out)
        torch.cuda.synchronize()
        assert torch.equal(graph_out["index"], eager_out["index"]), f"replay {k}"
    storage.buffer.extend(_rows(40, 80, "cuda"))
    seen = []
    for _ in range(10):
        graph.replay()
        seen.append(graph_out["index"].clone())
    torch.cuda.synchronize()
    assert int(torch.cat(seen).max()) >= 40
    _check_rows(graph_out)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_sample_into_with_ere_draws_the_eager_rows_of_a_wrapped_ring(kind):
    from torchstore.samplers import ERE

    storage = _replay(capacity=64, filled=40)
    storage.buffer.extend(_rows(40, 50))  # wrapped: the cursor sits at row 26

    def make():
        ere = ERE(eta=0.5, c_min=9)
        ere.set_progress(2, 2)
        if kind == "uniform":
            return PhiloxSampler(seed=3, ere=ere)
        sampler = PrioritizedSampler(64, seed=3, ere=ere)
        sampler.update_priority(torch.arange(64), torch.arange(64).double() % 5 + 1)
        return sampler

    eager, device = make(), make()
    out = empty_batch(storage, 256)
    newest = {(storage.cursor - 1 - k) % 64 for k in range(9)}
    for _ in range(3):
        index, info = eager.sample(storage, 256)
        sample_into(storage, device, out)
        assert torch.equal(out["index"], index) and set(index.tolist()) <= newest
        if kind == "prioritized":
            assert torch.equal(out["priority_weight"], info["priority_weight"])
        assert torch.equal(out["reward"].long() % 64, out["index"])  # row r holds value r (+64)
