"""A reader that opens a store at any step of its creation never locks the writer out.

A reader holding a store file takes HDF5's file lock unless the file is already open for
SWMR writing; a writer that renamed its closed new file into place and opened it only
afterwards could be locked out by a reader that came in between. Here a separate reader
process opens the store (and keeps it open) at every step of creation, and the writer must
still get in; each reader sees a valid empty store, or no file yet, never a lock error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchstore.data.file.writer as writer_module
import torchstore.io.hdf5.files as hdf5
from torchstore.data import ColumnSpec, TrajectoryStore, TrajectoryStoreWriter

COLUMNS = [ColumnSpec("obs", torch.float32, (3,))]

# A reader server that has never opened the store: for each "open STEP" it forks a reader
# (a clean HDF5 state) that opens the store, reports, and holds it until "finish"; then
# each reader refreshes, reports what it sees and closes.
READERS = textwrap.dedent(
    """
    import json, os, sys
    from torchstore.data import TrajectoryStore

    def describe(fn):
        try:
            return ["store", fn()]
        except Exception as exc:
            return ["error", type(exc).__name__, str(exc)]

    path, kids = sys.argv[1], []
    print(json.dumps(["ready"]), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "finish":
            for pid, w in kids:
                os.write(w, b"x")
                os.waitpid(pid, 0)
            print(json.dumps(["done"]), flush=True)
            break
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            box = []
            out = describe(lambda: box.append(TrajectoryStore(path)) or box[0].num_episodes)
            print(json.dumps([cmd[1], "open"] + out), flush=True)
            os.read(r, 1)
            if box:
                out = describe(lambda: (box[0].refresh(), box[0].num_episodes)[1])
                box[0].close()
                print(json.dumps([cmd[1], "later"] + out), flush=True)
            os._exit(0)
        os.close(r)
        kids.append((pid, w))
    """
)


class _Readers:
    def __init__(self, path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READERS, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self.proc.stdout.readline()) == ["ready"]
        self.opened: dict[str, list] = {}

    def open_at(self, step: str) -> None:
        """A reader opens the store now (and holds it); returns once it has tried."""
        self.proc.stdin.write(f"open {step}\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert reply[:2] == [step, "open"], reply
        self.opened[step] = reply[2:]

    def finish(self) -> dict[str, list]:
        self.proc.stdin.write("finish\n")
        self.proc.stdin.flush()
        later = {}
        for line in self.proc.stdout:
            reply = json.loads(line)
            if reply == ["done"]:
                break
            later[reply[0]] = reply[2:]
        self.proc.wait(timeout=60)
        return later


def _instrument(monkeypatch, readers: _Readers) -> list[str]:
    """Make a reader open the store before and after every step of a store's creation."""
    steps: list[str] = []

    def at(step: str) -> None:
        steps.append(step)
        readers.open_at(step)

    def around(owner, name: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            at(f"before-{name}")
            result = original(*args, **kwargs)
            at(f"after-{name}")
            return result

        monkeypatch.setattr(owner, name, wrapper)

    around(hdf5, "create_in_place")  # builds the temporary file, closes it
    around(writer_module, "build_store_file")  # inside the build, the temp file open
    around(hdf5, "_open_swmr_writer")  # the temp file opened for SWMR writing
    around(os, "replace")  # the rename into place
    around(writer_module.TrajectoryStoreWriter, "_attach")  # the writer's first flush
    return steps


@pytest.fixture
def no_lock_wait(monkeypatch):
    # a writer that meets a reader's lock fails at once instead of retrying for a while
    monkeypatch.setattr(hdf5, "LOCK_WAIT_S", 0.0)


def test_a_reader_at_any_step_of_creation_never_locks_the_writer_out(
    tmp_path, monkeypatch, no_lock_wait
):
    path = tmp_path / "new.h5"
    readers = _Readers(path)
    try:
        steps = _instrument(monkeypatch, readers)
        readers.open_at("start")
        writer = TrajectoryStoreWriter(path, COLUMNS)  # every reader above still holds on
        readers.open_at("created")
        writer.add_episode({"obs": torch.ones(4, 3)})
        readers.open_at("committed")
        writer.close()
        monkeypatch.undo()
    finally:
        later = readers.finish()
    assert "after-replace" in steps and "after-_open_swmr_writer" in steps
    assert steps.index("after-_open_swmr_writer") < steps.index("before-replace")
    renamed = False
    for step in ["start", *steps, "created", "committed"]:
        seen = readers.opened[step]
        renamed = renamed or step == "after-replace"
        if not renamed:  # the store's name does not exist before the rename
            assert seen[:2] == ["error", "FileNotFoundError"] and "no store at" in seen[2], step
            continue
        want = 1 if step == "committed" else 0
        assert seen == ["store", want], f"a reader opened at {step}: {seen}"
        assert later[step] == ["store", 1], f"the reader opened at {step} then saw {later[step]}"
    with TrajectoryStore(path) as store:
        assert store.num_episodes == 1
        assert torch.equal(store.episode(0)["obs"], torch.ones(4, 3))
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
