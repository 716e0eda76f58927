"""``StoreReplay.dumps`` never destroys the previous checkpoint.

(The storage's checkpoint, ``replay.h5``; the other files torchrl's ``ReplayBuffer.dumps``
writes next to it are torchrl's, written in place.)

The new checkpoint is written aside and renamed over the old one only when complete, so a
dump killed at any point leaves a checkpoint ``loads`` restores exactly: the old one, or
(once the rename happened) the new one. Each dump runs in a forked child that SIGKILLs
itself at a chosen step, or is killed by the test after a random delay.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer

from tests.forked import run_forked
from torchstore.data.replay.ring import REPLAY_FILE, StoreReplay
from torchstore.errors import DestinationError

CAPACITY = 24_000
EPISODE = 400


def _ring(seed: int) -> TensorDictReplayBuffer:
    g = torch.Generator().manual_seed(seed)
    n = CAPACITY + 1_000  # wrapped: the dump writes each segment in two runs
    step = torch.arange(n)
    rows = TensorDict(
        {
            "obs": torch.randn(n, 8, generator=g),
            "reward": torch.randn(n, generator=g),
            "done": step % EPISODE == EPISODE - 1,
        },
        batch_size=[n],
    )
    rb = TensorDictReplayBuffer(storage=StoreReplay(CAPACITY))
    rb.extend(rows)
    return rb


def _same_ring(a: StoreReplay, b: StoreReplay) -> bool:
    return (
        (a.cursor, len(a)) == (b.cursor, len(b))
        and all(torch.equal(x, y) for x, y in zip(a.packed.blocks, b.packed.blocks, strict=True))
        and all(
            torch.equal(x, y)
            for x, y in zip(a.episode_segments(), b.episode_segments(), strict=True)
        )
    )


def _loaded(folder) -> StoreReplay:
    fresh = StoreReplay(CAPACITY)
    fresh.loads(folder)
    return fresh


def _dump_dying_at(folder, replay: StoreReplay, step: str) -> None:
    """Dump ``replay`` over the checkpoint in ``folder``, SIGKILLing this (forked) process
    at ``step``. (The ring is built before the fork: torch's thread pool does not survive
    one.)"""
    import torchstore.data.file.writer as writer_module

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if step.startswith("episode-"):
        kill_at = int(step.removeprefix("episode-"))
        end_episode = writer_module.TrajectoryStoreWriter.end_episode

        def counting(self, metadata=None):
            number = end_episode(self, metadata)
            if number + 1 == kill_at:
                die()
            return number

        writer_module.TrajectoryStoreWriter.end_episode = counting
    else:
        real_replace = os.replace

        def replace(src, dst):
            final = str(src).endswith(".partial")  # the aside store put in place
            if final and step == "before-rename":
                die()
            real_replace(src, dst)
            if final and step == "after-rename":
                die()

        writer_module.os.replace = replace
    replay.dumps(folder)
    raise AssertionError(f"the dump never reached step {step!r}")


@pytest.fixture(scope="module")
def rings():
    return _ring(1).storage, _ring(2).storage


@pytest.mark.parametrize(
    "step, survivor",
    [
        ("episode-1", 0),
        ("episode-30", 0),
        ("episode-60", 0),
        ("before-rename", 0),
        ("after-rename", 1),
    ],
)
def test_a_dump_killed_at_any_step_leaves_a_loadable_checkpoint(tmp_path, rings, step, survivor):
    rings[0].dumps(tmp_path)
    status, text = run_forked(_dump_dying_at, tmp_path, rings[1], step, timeout=300)
    assert status == "crashed", f"{status}: {text}"
    assert _same_ring(_loaded(tmp_path), rings[survivor]), f"killed at {step}"
    rings[1].dumps(tmp_path)  # a dump after the kill replaces it (and its leftovers)
    assert _same_ring(_loaded(tmp_path), rings[1])
    assert sorted(os.listdir(tmp_path)) == [REPLAY_FILE]


@pytest.mark.slow
def test_dumps_killed_at_random_moments_leave_the_old_or_the_new_checkpoint(tmp_path, rings):
    rings[0].dumps(tmp_path)
    start = time.monotonic()
    assert run_forked(rings[1].dumps, tmp_path, timeout=300)[0] == "ok"
    span = time.monotonic() - start
    rings[0].dumps(tmp_path)
    rng = random.Random(11)
    seen = set()
    for trial in range(8):
        pid = os.fork()
        if pid == 0:
            try:
                rings[1].dumps(tmp_path)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, span))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        loaded = _loaded(tmp_path)
        which = [i for i, rb in enumerate(rings) if _same_ring(loaded, rb)]
        assert which, f"trial {trial}: the checkpoint is neither the old nor the new ring"
        seen.add(which[0])
        if which[0] == 1:
            rings[0].dumps(tmp_path)
    assert 0 in seen


def test_an_exception_during_a_dump_keeps_the_old_checkpoint(tmp_path, rings, monkeypatch):
    rings[0].dumps(tmp_path)
    import torchstore.data.file.writer as writer_module

    calls = []
    end_episode = writer_module.TrajectoryStoreWriter.end_episode

    def failing(self, metadata=None):
        calls.append(1)
        if len(calls) == 5:
            raise OSError("disk went away")
        return end_episode(self, metadata)

    monkeypatch.setattr(writer_module.TrajectoryStoreWriter, "end_episode", failing)
    with pytest.raises(OSError, match="disk went away"):
        rings[1].dumps(tmp_path)
    monkeypatch.undo()
    assert _same_ring(_loaded(tmp_path), rings[0])
    assert sorted(os.listdir(tmp_path)) == [REPLAY_FILE]


def test_dumps_refuses_a_checkpoint_file_that_is_not_a_store(tmp_path, rings):
    (tmp_path / REPLAY_FILE).write_text("my notes")
    with pytest.raises(DestinationError, match="not a torchstore store"):
        rings[0].dumps(tmp_path)
    assert (tmp_path / REPLAY_FILE).read_text() == "my notes"
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationError, match="is a file"):
        rings[0].dumps(tmp_path / "file")
