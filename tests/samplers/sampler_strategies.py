"""Hypothesis strategies for the sampler tests (named to avoid clashing with other
``strategies`` modules under ``tests/``, since test folders are not packages)."""

from __future__ import annotations

from hypothesis import strategies as st
from sampler_fakes import FakeRing


@st.composite
def rings(draw, *, max_capacity: int = 40, min_rows: int = 1) -> FakeRing:
    """A FakeRing after a random history of episodes, often wrapped several times."""
    capacity = draw(st.integers(1, max_capacity))
    ring = FakeRing(capacity)
    lengths = draw(st.lists(st.integers(1, 15), min_size=1, max_size=12))
    for n in lengths:
        ring.write(n)
    if ring.rows < min_rows:
        ring.write(min_rows - ring.rows)
    return ring


@st.composite
def priority_batches(draw, capacity: int, max_batches: int = 4):
    """Batches of (index, value) with duplicate indices and exact zeros."""
    batches = []
    for _ in range(draw(st.integers(1, max_batches))):
        n = draw(st.integers(1, 2 * capacity))
        index = draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
        value = draw(
            st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e6)), min_size=n, max_size=n)
        )
        batches.append((index, value))
    return batches
