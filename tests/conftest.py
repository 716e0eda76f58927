from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import settings

from tests import slow_first
from torchstore.data import ColumnSpec, Quantize
from torchstore.io.frames.scheduling import restore_scheduling, thread_scheduling

# Property tests check invariants, not speed: on shared cores, with one test worker per
# core, one example can outlast Hypothesis's default 200 ms deadline.
settings.register_profile("torchstore", deadline=None)
settings.load_profile("torchstore")

WALKER_COLUMNS = (
    ColumnSpec("qpos", torch.float32, (9,)),
    ColumnSpec("qvel", torch.float32, (9,)),
    ColumnSpec("action", torch.float32, (6,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("done", torch.bool),
    ColumnSpec("next/qpos", torch.float32, (9,)),
    ColumnSpec("pixels", torch.float32, (4, 4, 3), quantize=Quantize(0.0, 1.0)),
)


def make_rows(columns, n: int, seed: int) -> dict[str, np.ndarray]:
    """Deterministic rows for ``columns`` (quantised columns get values inside their range)."""
    rng = np.random.default_rng(seed)
    rows = {}
    for spec in columns:
        shape = (n, *spec.shape)
        dtype = spec.dtype
        if spec.quantize is not None:
            q = spec.quantize
            rows[spec.name] = rng.uniform(q.low, q.high, shape).astype(np.float32)
        elif dtype == torch.bool:
            rows[spec.name] = rng.random(shape) < 0.5
        elif dtype.is_floating_point:
            rows[spec.name] = rng.standard_normal(shape).astype(str(dtype).removeprefix("torch."))
        else:
            info = np.iinfo(str(dtype).removeprefix("torch."))
            rows[spec.name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(
                info.dtype
            )
    return rows


@pytest.fixture
def walker_columns():
    return WALKER_COLUMNS


def _worker_group(item) -> str | None:
    """The test worker group an item must share (``--dist loadgroup``), if any.

    Tests using a Ray cluster run on one worker: two local clusters on one machine compete
    for its cores and default ports. Tests that use a module-scoped fixture (a DDP run, a
    damaged store) go to one worker, so the fixture is built once, not once per worker that
    gets one of them.
    """
    if "ray" in item.keywords:
        return "ray"
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    if any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values()):
        return item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _worker_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # test workers take the longest work first (tests/slow_first.py), not xdist's groups
    # by test count
    if getattr(config.option, "dist", None) == "loadgroup":  # the controller
        config.option.loadscopereorder = False
    config.pluginmanager.register(slow_first, "slow-first")


@pytest.fixture(autouse=True)
def _no_thread_left_realtime():
    """Fail a test that leaves a thread of its worker at realtime priority (and put the
    threads back): a realtime worker's busy loops starve the processes it waits for, and
    the suite hangs somewhere else entirely."""
    before = thread_scheduling()
    yield
    if restore_scheduling(before):
        pytest.fail("the test left threads at realtime scheduling priority (SCHED_FIFO/RR)")


@pytest.fixture(scope="session")
def preloaded(tmp_path_factory):
    """A :class:`tests.preloaded.PreloadedInterpreter`: script runs without the ~5 s import
    of torch and Lightning each (one server per test worker that asks for it)."""
    from tests.preloaded import PreloadedInterpreter

    server = PreloadedInterpreter(tmp_path_factory.mktemp("preloaded"))
    yield server
    server.close()
