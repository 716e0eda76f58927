"""The distinct bytes a URL window's read-ahead hinted (``ahead_bytes``): every byte once,
however the hinted spans overlap, touch or repeat."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from torchstore.data.residency.block_read import _RemoteAhead

span = st.tuples(st.integers(0, 300), st.integers(1, 60)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(span, min_size=1, max_size=4), min_size=1, max_size=12))
def test_new_bytes_counts_each_hinted_byte_once(hints):
    ahead = _RemoteAhead.__new__(_RemoteAhead)  # the span bookkeeping alone
    ahead.seen = []
    covered: set[int] = set()
    for spans in hints:
        new = set().union(*(range(a, z) for a, z in spans))
        assert ahead._new_bytes(spans) == len(new - covered)
        covered |= new
        seen = ahead.seen
        assert all(seen[i][1] < seen[i + 1][0] for i in range(len(seen) - 1))
        assert sum(z - a for a, z in seen) == len(covered)
