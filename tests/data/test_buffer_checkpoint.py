"""dump_buffer / load_buffer: a kill at any step leaves the old or the new checkpoint, whole.

Each kill is deterministic: a forked child runs the dump with a trap that SIGKILLs it at one
chosen step. Torchrl's own ``rb.dumps`` killed the same way leaves a mixed checkpoint (new
storage, old sampler and writer), which is what the whole-folder dump exists to prevent.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

import torchstore.data.replay.buffer_dump as bc
from torchstore.data import ColumnSpec
from torchstore.data.replay.buffer_dump import MANIFEST, dump_buffer, load_buffer
from torchstore.data.replay.ring import StoreReplay
from torchstore.errors import (
    ArgumentTypeError,
    CheckpointNotFoundError,
    DestinationError,
    IntegrityError,
    StoreFormatError,
    StoreLockedError,
)
from torchstore.io.hdf5.writer_lock import WriterLock
from torchstore.samplers import PrioritizedSampler

ROWS = 64
COLUMNS = [ColumnSpec("obs", torch.float32, (4,)), ColumnSpec("done", torch.bool)]


def empty_buffer() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(
        storage=StoreReplay(ROWS, columns=COLUMNS), sampler=PrioritizedSampler(ROWS), batch_size=4
    )


def buffer(version: int) -> TensorDictReplayBuffer:
    """Rows, priorities and writer cursor all say ``version``."""
    rb = empty_buffer()
    obs = torch.arange(ROWS * 4, dtype=torch.float32).reshape(ROWS, 4) + 1000 * version
    done = torch.zeros(ROWS, dtype=torch.bool)
    rb.extend(TensorDict({"obs": obs[: version + 1], "done": done[: version + 1]}, [version + 1]))
    rb.update_priority(torch.arange(version + 1), torch.full((version + 1,), version + 1.0))
    return rb


def versions(rb: TensorDictReplayBuffer) -> dict[str, int]:
    """The version each component of a loaded buffer holds."""
    n = len(rb)
    obs = rb.storage.get(torch.arange(n))["obs"]
    raw = rb.sampler.state_dict()["raw"]
    return {
        "storage": int(obs[0, 0]) // 1000,
        "rows": n - 1,
        "sampler": int(raw[0]) - 1,
        "writer": rb.writer.state_dict()["_cursor"] - 1,
    }


def loaded(folder, *, plain=False) -> dict[str, int]:
    rb = empty_buffer()
    if plain:
        rb.loads(folder)
    else:
        load_buffer(rb, folder)
    return versions(rb)


def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def killed(dump, trap) -> None:
    """Run ``dump()`` in a forked child that ``trap()`` arms first; it must die by SIGKILL."""
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)  # the parent's OpenMP pool does not survive a fork
            trap()
            dump()
        finally:
            os._exit(3)  # the trap did not fire
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def after_seal(arm):
    """A trap that runs ``arm()`` once the new folder is complete (right before the swap)."""
    seal = bc._seal

    def sealed(folder):
        seal(folder)
        arm()

    return lambda: setattr(bc, "_seal", sealed)


def hidden(tmp_path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path) if n.startswith(".ckpt.") and n != ".ckpt.lock")


def test_whole_round_trip_of_every_component(tmp_path):
    dump_buffer(buffer(5), tmp_path / "ckpt")
    assert loaded(tmp_path / "ckpt") == dict.fromkeys(("storage", "rows", "sampler", "writer"), 5)
    assert (tmp_path / "ckpt" / MANIFEST).is_file() and hidden(tmp_path) == []


def test_plain_rb_dumps_killed_between_storage_and_sampler_is_mixed(tmp_path):
    folder = tmp_path / "ckpt"
    buffer(1).dumps(folder)
    rb = buffer(2)
    killed(lambda: rb.dumps(folder), lambda: setattr(rb.sampler, "dumps", die))
    got = loaded(folder, plain=True)
    assert got["storage"] == 2 and got["sampler"] == 1 and got["writer"] == 1  # mixed


def test_dump_buffer_killed_between_storage_and_sampler_keeps_the_old_one(tmp_path):
    folder = tmp_path / "ckpt"
    dump_buffer(buffer(1), folder)
    rb = buffer(2)
    killed(lambda: dump_buffer(rb, folder), lambda: setattr(rb.sampler, "dumps", die))
    assert hidden(tmp_path) != []  # the killed dump's half-written folder
    assert set(loaded(folder).values()) == {1}
    assert hidden(tmp_path) == []  # removed by the load
    dump_buffer(buffer(3), folder)
    assert set(loaded(folder).values()) == {3}


def test_killed_after_the_exchange_gives_the_new_one(tmp_path):
    folder = tmp_path / "ckpt"
    dump_buffer(buffer(1), folder)
    rb = buffer(2)
    killed(lambda: dump_buffer(rb, folder), after_seal(lambda: setattr(bc.shutil, "rmtree", die)))
    assert set(loaded(folder).values()) == {2}
    assert hidden(tmp_path) == []


@pytest.mark.parametrize(("renames_before_kill", "want"), [(0, 1), (1, 2), (2, 2)])
def test_rename_fallback_recovers_at_every_step(tmp_path, monkeypatch, renames_before_kill, want):
    """Without RENAME_EXCHANGE: marker, old aside, new in; a kill between any two steps."""
    folder = tmp_path / "ckpt"
    dump_buffer(buffer(1), folder)
    monkeypatch.setattr(bc, "_exchange", lambda new, folder: False)
    rb = buffer(2)
    rename = os.rename

    def arm():
        calls = []

        def counting(src, dst):
            if len(calls) == renames_before_kill:
                die()
            calls.append(src)
            rename(src, dst)

        bc.os.rename = counting
        if renames_before_kill == 2:
            bc.shutil.rmtree = die

    killed(lambda: dump_buffer(rb, folder), after_seal(arm))
    assert (tmp_path / ".ckpt.swap").exists() or renames_before_kill == 2
    assert set(loaded(folder).values()) == {want}
    assert hidden(tmp_path) == []


def test_the_fallback_swap_completes(tmp_path, monkeypatch):
    monkeypatch.setattr(bc, "_exchange", lambda new, folder: False)
    dump_buffer(buffer(1), tmp_path / "ckpt")
    dump_buffer(buffer(2), tmp_path / "ckpt")
    assert set(loaded(tmp_path / "ckpt").values()) == {2} and hidden(tmp_path) == []


def test_rb_dumps_in_place_over_a_sealed_checkpoint_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    dump_buffer(buffer(1), folder)
    buffer(2).dumps(folder)
    with pytest.raises(IntegrityError, match="rb.loads"):
        load_buffer(empty_buffer(), folder)


def test_a_flipped_byte_is_an_integrity_error(tmp_path):
    folder = tmp_path / "ckpt"
    dump_buffer(buffer(1), folder)
    path = folder / "writer" / "metadata.json"
    data = bytearray(path.read_bytes())
    data[1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="writer/metadata.json"):
        load_buffer(empty_buffer(), folder)


def test_any_torchrl_storage(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=2)
    rb.extend(TensorDict(obs=torch.arange(6.0), batch_size=[6]))
    dump_buffer(rb, tmp_path / "a" / "ckpt")
    back = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=2)
    load_buffer(back, tmp_path / "a" / "ckpt")
    assert torch.equal(back[:]["obs"], torch.arange(6.0))
    assert back.writer.state_dict()["_cursor"] == 6


def test_what_a_user_sees_on_bad_folders(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no replay buffer checkpoint"):
        load_buffer(empty_buffer(), tmp_path / "missing")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(StoreFormatError, match="not a replay buffer checkpoint"):
        load_buffer(empty_buffer(), other)
    with pytest.raises(DestinationError, match="not a replay buffer checkpoint"):
        dump_buffer(buffer(1), other)
    assert (other / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationError, match="is a file"):
        dump_buffer(buffer(1), tmp_path / "file")
    with pytest.raises(ArgumentTypeError, match="ReplayBuffer"):
        dump_buffer(object(), tmp_path / "ckpt")


def test_a_second_dump_while_one_is_live_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    dump_buffer(buffer(1), folder)
    with WriterLock.acquire(folder, what="replay buffer checkpoint"):
        with pytest.raises(StoreLockedError, match="replay buffer checkpoint"):
            dump_buffer(buffer(2), folder)
        assert set(loaded(folder).values()) == {1}  # loading is not blocked


def test_a_symlinked_folder_stays_a_link_to_the_new_checkpoint(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "ckpt").symlink_to(tmp_path / "real")
    dump_buffer(buffer(1), tmp_path / "ckpt")
    dump_buffer(buffer(2), tmp_path / "ckpt")
    assert (tmp_path / "ckpt").is_symlink()
    assert set(loaded(tmp_path / "ckpt").values()) == {2}
