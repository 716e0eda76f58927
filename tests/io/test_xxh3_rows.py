"""The compiled xxh3-64 of scattered rows gives ``xxhash``'s digest of the joined bytes, and
the span check accepts exactly the blocks whose recorded hash matches."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.io.hdf5.xxh3_rows import LONG_MIN, verify_rows, xxh3_64


@settings(max_examples=300, deadline=None)
@given(
    length=st.one_of(
        st.integers(LONG_MIN, 3000),  # around the first blocks (1024 bytes) and stripes
        st.integers(3000, 140_000),
    ),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.floats(0, 1), max_size=7),
)
def test_the_hash_of_pieces_is_xxhash_of_their_concatenation(length, seed, cuts):
    data = np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8)
    at = sorted(int(c * length) for c in cuts)  # empty pieces and 1-byte pieces included
    pieces = [np.ascontiguousarray(p) for p in np.split(data, at)]
    assert xxh3_64(pieces) == xxhash.xxh3_64_intdigest(data.tobytes())


@pytest.mark.parametrize("length", [LONG_MIN, 1024, 1025, 1087, 1088, 1089, 16 * 1024 + 1])
def test_lengths_at_the_edges_of_stripes_and_blocks(length):
    data = np.arange(length, dtype=np.uint64).astype(np.uint8)
    assert xxh3_64([data]) == xxhash.xxh3_64_intdigest(data.tobytes())


def test_inputs_shorter_than_the_long_path_are_refused():
    with pytest.raises(ValueError, match="241 bytes or more"):
        xxh3_64([np.zeros(LONG_MIN - 1, dtype=np.uint8)])
    with pytest.raises(ValueError, match="C-contiguous"):
        xxh3_64([np.zeros((40, 20), dtype=np.uint8)[:, ::2]])


def _blocks(rng, counts, row_bytes):
    """Rows scattered in one array at a stride wider than a row (as in a window's slot),
    each block's recorded slots, and the row addresses in order."""
    total = sum(counts)
    memory = rng.integers(0, 256, (total, row_bytes + 24), dtype=np.uint8)
    rows = memory[:, 8 : 8 + row_bytes]
    sums = np.zeros((len(counts), 2, 2), dtype=np.uint64)
    first = 0
    for i, n in enumerate(counts):
        digest = xxhash.xxh3_64_intdigest(np.ascontiguousarray(rows[first : first + n]).tobytes())
        slot = i % 2  # the committed value sits in either slot
        sums[i, slot] = (n, digest)
        sums[i, 1 - slot] = (n + 1, digest ^ 1)  # the other slot: a later, uncommitted count
        first += n
    addresses = rows.__array_interface__["data"][0] + memory.strides[0] * np.arange(total)
    return memory, rows, sums, addresses.astype(np.int64)


def test_verify_rows_accepts_matching_blocks_and_names_the_damaged_one():
    rng = np.random.default_rng(3)
    counts = np.array([6, 6, 6, 4], dtype=np.int64)
    memory, rows, sums, addresses = _blocks(rng, counts, 700)
    ok = np.zeros(len(counts), dtype=np.bool_)
    assert verify_rows(addresses, 700, counts, sums, ok) == 4 and ok.all()

    rows[13, 650] ^= 1  # a byte of the third block
    assert verify_rows(addresses, 700, counts, sums, ok) == 3
    assert ok.tolist() == [True, True, False, True]
    rows[13, 650] ^= 1
    memory[13, 2] ^= 1  # a byte outside the rows: not hashed
    assert verify_rows(addresses, 700, counts, sums, ok) == 4
    del memory


def test_verify_rows_leaves_unknown_counts_and_short_blocks_to_the_caller():
    rng = np.random.default_rng(4)
    counts = np.array([6, 6], dtype=np.int64)
    _, _, sums, addresses = _blocks(rng, counts, 700)
    ok = np.zeros(2, dtype=np.bool_)
    sums[1, :, 0] = 99  # no slot records 6 rows
    assert verify_rows(addresses, 700, counts, sums, ok) == 1 and ok.tolist() == [True, False]

    counts = np.array([2], dtype=np.int64)  # 2 rows of 100 bytes: under the long path's 241
    _, _, sums, addresses = _blocks(rng, counts, 100)
    assert verify_rows(addresses, 100, counts, sums, ok[:1]) == 0 and not ok[0]
