"""Philox4x32: Random123 known-answer vectors, exact integer maths, graph safety."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.samplers.philox import (
    PhiloxStream,
    _mulhilo32,
    counters_from_offset,
    philox4x32,
    randint_below,
    uniform_from_words,
)

# fmt: off
KAT = [
    (10, "00000000 00000000 00000000 00000000", "00000000 00000000",
     "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    (10, "ffffffff ffffffff ffffffff ffffffff", "ffffffff ffffffff",
     "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    (10, "243f6a88 85a308d3 13198a2e 03707344", "a4093822 299f31d0",
     "d16cfe09 94fdcceb 5001e420 24126ea1"),
    (7, "00000000 00000000 00000000 00000000", "00000000 00000000",
     "5f6fb709 0d893f64 4f121f81 4f730a48"),
    (7, "ffffffff ffffffff ffffffff ffffffff", "ffffffff ffffffff",
     "5207ddc2 45165e59 4d8ee751 8c52f662"),
    (7, "243f6a88 85a308d3 13198a2e 03707344", "a4093822 299f31d0",
     "4dfccaba 190a87f0 c47362ba b6b5242a"),
]
# fmt: on
U32 = st.integers(0, 2**32 - 1)


def words(text: str) -> list[int]:
    return [int(w, 16) for w in text.split()]


def reference_philox(counter: list[int], key: list[int], rounds: int) -> list[int]:
    """Python-int Philox4x32, straight from the spec (the oracle)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    mask = 2**32 - 1
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & mask, (p0 >> 32) ^ c3 ^ k1, p0 & mask
    return [c0, c1, c2, c3]


@pytest.mark.parametrize("rounds, counter, key, expected", KAT)
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint32])
def test_random123_known_answers(rounds, counter, key, expected, dtype):
    out = philox4x32(
        torch.tensor(words(counter)).to(dtype), torch.tensor(words(key)).to(dtype), rounds
    )
    assert out.dtype == torch.int64
    assert out.tolist() == words(expected)


def test_known_answers_batched_in_one_call():
    counters = torch.tensor([words(c) for _, c, _, _ in KAT[:3]])
    keys = torch.tensor([words(k) for _, _, k, _ in KAT[:3]])
    assert philox4x32(counters, keys).tolist() == [words(e) for *_, e in KAT[:3]]


@pytest.mark.parametrize("a", [0, 1, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1])
@pytest.mark.parametrize("b", [0, 1, 2**16, 2**31, 2**32 - 1])
def test_mulhilo32_is_exact_at_edge_values(a, b):
    hi, lo = _mulhilo32(torch.tensor(a), torch.tensor(b))
    assert (int(hi), int(lo)) == divmod(a * b, 2**32)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(U32, min_size=4, max_size=4), st.lists(U32, min_size=2, max_size=2), st.integers(1, 12)
)
def test_matches_python_reference(counter, key, rounds):
    got = philox4x32(torch.tensor(counter), torch.tensor(key), rounds).tolist()
    assert got == reference_philox(counter, key, rounds)


def test_counters_carry_into_the_high_word():
    ctr = counters_from_offset(torch.tensor(2**32 - 2), 4, stream=2**32 + 5)
    assert ctr.tolist() == [
        [2**32 - 2, 0, 5, 1],
        [2**32 - 1, 0, 5, 1],
        [0, 1, 5, 1],
        [1, 1, 5, 1],
    ]


def test_uniform_from_words_stays_in_unit_interval():
    extreme = torch.tensor([[0, 0], [2**32 - 1, 2**32 - 1]])
    u64 = uniform_from_words(extreme)
    u32 = uniform_from_words(extreme, torch.float32)
    assert u64.dtype == torch.float64 and u32.dtype == torch.float32
    assert u64[0] == 0 and u64[1] < 1 and u64[1] == 1 - 2**-53
    assert u32[0] == 0 and u32[1] < 1


@settings(max_examples=80, deadline=None)
@given(U32, U32, st.integers(1, 2**62 - 1))
def test_randint_below_is_multiply_shift(w0, w1, n):
    got = int(randint_below(torch.tensor([w0, w1]), torch.tensor(n)))
    assert got == ((w0 << 32 | w1) * n) >> 64
    assert 0 <= got < n


def test_randint_below_is_uniform_enough():
    # 60_000 draws over 6 values: every count within 5 sigma of 10_000.
    w = philox4x32(counters_from_offset(torch.tensor(0), 60_000), torch.tensor([7, 9]))
    counts = torch.bincount(randint_below(w, torch.tensor(6)), minlength=6)
    assert counts.numel() == 6
    assert ((counts - 10_000).abs() < 5 * (10_000 * 5 / 6) ** 0.5).all()


def test_randint_below_zero_bound_gives_zero():
    w = torch.tensor([[2**32 - 1, 2**32 - 1]])
    assert randint_below(w, torch.tensor(0)).tolist() == [0]


def _draw(offset, key, n):
    w = philox4x32(counters_from_offset(offset, 64), key)
    return uniform_from_words(w), uniform_from_words(w, torch.float32), randint_below(w, n)


def test_compiled_fullgraph_matches_eager():
    offset, key, n = torch.tensor(123), torch.tensor([2**32 - 1, 17]), torch.tensor(10**9 + 7)
    compiled = torch.compile(_draw, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(offset, key, n), _draw(offset, key, n), strict=True):
        assert torch.equal(got, want)


@pytest.mark.slow
def test_compiled_inductor_matches_eager():
    offset, key, n = torch.tensor(5), torch.tensor([1, 2]), torch.tensor(1000)
    compiled = torch.compile(_draw, fullgraph=True)
    for got, want in zip(compiled(offset, key, n), _draw(offset, key, n), strict=True):
        assert torch.equal(got, want)


def test_bad_shapes_and_rounds_are_rejected():
    ctr, key = torch.zeros(4, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(
        ValueError, match=r"counter must have a trailing dimension of 4, got \(3,\)"
    ):
        philox4x32(torch.zeros(3, dtype=torch.int64), key)
    with pytest.raises(ValueError, match=r"key must have a trailing dimension of 2, got \(4,\)"):
        philox4x32(ctr, ctr)
    with pytest.raises(ValueError, match=r"rounds \(0\) must be an int >= 1"):
        philox4x32(ctr, key, rounds=0)
    with pytest.raises(ValueError, match="dtype must be torch.float64 or torch.float32"):
        uniform_from_words(ctr, torch.float16)


def test_block_stream_draws_the_graph_safe_numbers_however_it_is_cut():
    """Block-computed draws equal one-at-a-time draws, across blocks, bounds and seeks."""
    blocked = PhiloxStream(9, 3, block=10)
    plain = PhiloxStream(9, 3)
    for n, kind in [(4, "int"), (7, "uniform"), (10, "int"), (1, "uniform"), (13, "int")]:
        if kind == "int":
            assert torch.equal(blocked.randint(n, 1000), plain.randint(n, torch.tensor(1000)))
        else:
            assert torch.equal(blocked.uniform(n, torch.float32), plain.uniform(n, torch.float32))
    assert int(blocked.position) == int(plain.position) == 35
    blocked.seek(5)  # back into an older block
    plain.seek(5)
    assert torch.equal(blocked.randint(6, 77), plain.randint(6, 77))
    # a tensor bound is served from the same block
    assert torch.equal(blocked.randint(2, torch.tensor(50)), plain.randint(2, 50))
    assert torch.equal(blocked.randint(3, 50), plain.randint(3, 50))
    other = PhiloxStream(9, 4, block=10).randint(8, 1000)
    assert not torch.equal(other, PhiloxStream(9, 3, block=10).randint(8, 1000))


def test_block_stream_checkpoint_is_the_plain_one():
    a = PhiloxStream(1, block=16)
    a.randint(5, 10)
    b = PhiloxStream(1)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.randint(20, 10), b.randint(20, 10))
    with pytest.raises(ValueError, match=r"block \(.*\) must be an int >= 0"):
        PhiloxStream(1, block=-1)
    with pytest.raises(ValueError, match=r"position \(.*\) must be an int >= 0"):
        a.seek(-3)


@pytest.mark.parametrize("kernels", [True, False])
def test_block_draws_with_an_offset_are_new_tensors(monkeypatch, kernels):
    """``randint(n, high, offset)`` is ``offset + randint(n, high)``; what it returns is the
    caller's: editing it does not change the draws a seek back replays."""
    from torchstore.samplers import philox as philox_module

    monkeypatch.setattr(philox_module, "KERNELS", kernels)
    blocked = PhiloxStream(4, block=32)
    plain = PhiloxStream(4)
    for n, offset in [(5, 100), (20, 0), (30, 7)]:  # the last one crosses into a new block
        got = blocked.randint(n, 90, offset)
        assert torch.equal(got, plain.randint(n, 90) + offset)
        got.fill_(-1)
    blocked.seek(0)
    plain.seek(0)
    assert torch.equal(blocked.randint(55, 90), plain.randint(55, 90))


def test_block_mode_counts_the_position_on_the_host_and_shows_it_when_read():
    s = PhiloxStream(2, block=16)
    s.randint(5, 10)
    s.uniform(40)  # crosses two blocks
    assert int(s.position) == 45
    assert int(s.state_dict()["position"]) == 45
    s.randint(3, 10)
    s.seek(10)
    assert int(s.position) == 10
    s.randint(2, 10)
    moved = s.to("cpu")
    assert int(moved.position) == 12
    words, first = s.block_words(4)
    assert words.shape[1] == 4 and int(s.position) == 16
    reference = PhiloxStream(2)
    reference.seek(12)
    assert torch.equal(torch.from_numpy(words[first : first + 4]), reference.words(4))
    with pytest.raises(ValueError, match="block mode"):
        PhiloxStream(2).block_words(4)
    # a view of the block's cached integers, for callers that read the block through it
    view = s.randint_view(3, 10)
    assert view._base is not None and int(s.position) == 19
    assert torch.equal(view, reference.randint(3, 10))
    with pytest.raises(ValueError, match="block mode"):
        PhiloxStream(2).randint_view(3, 10)


@pytest.mark.parametrize("block", [0, 64])
def test_a_pickled_stream_is_its_recipe_and_leaves_the_original_alone(block):
    """torch's worker pickler moves a tensor it pickles into shared memory in place; a
    stream pickles as (seed, stream, device, block, position) instead, so the sender's
    tensors (and a block's cached views of them) stay as they were, and the copy draws
    what the original draws next."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions)

    stream = PhiloxStream(seed=3, stream=2, block=block)
    stream.randint(10, 100)
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(stream)
    assert not stream.position.is_shared() and not stream.key.is_shared()
    copy = pickle.loads(buffer.getvalue())
    assert torch.equal(copy.randint(7, 100), stream.randint(7, 100))
    assert int(copy.position) == int(stream.position) == 17
