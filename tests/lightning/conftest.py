"""Every DataModule test caches normalisation statistics in a folder of its own, never in
the home folder of whoever runs the tests (a MonkeyPatch of its own, so that a test's
``monkeypatch.undo()`` keeps it)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _stats_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHSTORE_CACHE", str(tmp_path_factory.mktemp("torchstore-cache")))
        yield
