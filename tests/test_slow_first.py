"""The test workers' order of work (tests/slow_first.py): longest units first, groups whole."""

from __future__ import annotations

from types import SimpleNamespace

from tests import slow_first


def test_units_go_longest_first_and_a_group_stays_together(monkeypatch):
    monkeypatch.setattr(
        slow_first, "SECONDS", {"a.py::slow": 30, "g": 28, "b.py::in_g": 5, "c.py::medium": 10}
    )
    ids = [
        "a.py::quick",
        "b.py::in_g@g",
        "c.py::medium",
        "a.py::slow",
        "b.py::also_in_g@g",
        "a.py::other[x@y]",  # an @ inside a parameter id names no group
        "a.py::last",
    ]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    ordered = [item.nodeid for item in slow_first.longest_first(items)]
    assert ordered == [
        "b.py::in_g@g",  # 28 for the group, 5 and 0.3 for its tests
        "b.py::also_in_g@g",
        "a.py::slow",
        "c.py::medium",
        "a.py::quick",  # the rest in collection order
        "a.py::other[x@y]",
        "a.py::last",
    ]
