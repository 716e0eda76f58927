"""Corrupted and truncated files: reported as errors, never returned as data, never a hang.

Each damaged copy is opened and read completely in a forked child with a deadline.
The only acceptable outcomes are a torchstore error (naming what is damaged) or, when
the damaged byte was unused space, data identical to what was written.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
import torch

from tests.conftest import make_rows
from tests.forked import run_forked
from torchstore.data import ColumnSpec, Quantize, TrajectoryStore, TrajectoryStoreWriter
from torchstore.errors import IntegrityError, StoreFormatError, TorchstoreError

COLUMNS = (
    ColumnSpec("obs", torch.float32, (26,)),
    ColumnSpec("action", torch.float32, (7,)),
    ColumnSpec("reward", torch.float32),
    ColumnSpec("pix", torch.float32, (8,), quantize=Quantize(-1, 1)),
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("integrity") / "good.h5"
    episodes = [make_rows(COLUMNS, n, i) for i, n in enumerate([3000, 17000, 5000, 9000])]
    with TrajectoryStoreWriter(path, COLUMNS) as w:
        for i, rows in enumerate(episodes):
            w.add_episode(rows, metadata={"i": i})
    with TrajectoryStore(path) as store:
        reference = {c.name: store.read_column(c.name, 0, store.num_rows) for c in COLUMNS}
    return path, reference


def _read_all(path: str, reference: dict) -> None:
    """Exit normally only if the file reads back exactly; a TorchstoreError exits 3."""
    try:
        with TrajectoryStore(path) as store:
            assert store.num_rows == 34000 and store.num_episodes == 4
            for name, ref in reference.items():
                got = np.concatenate(
                    [
                        s.numpy()
                        for s in (
                            torch.from_numpy(store.read_column(name, a, min(a + 7000, 34000)))
                            for a in range(0, 34000, 7000)
                        )
                    ]
                )
                assert np.array_equal(got, ref), f"silent wrong data in column {name}"
            for i in range(4):
                assert store.episode_metadata(i) == {"i": i}
    except TorchstoreError as exc:
        print(type(exc).__name__, exc)
        os._exit(3)


def _outcome(status: str, text: str) -> str:
    if status == "ok":
        return "no effect"
    if status == "error" and not text:  # os._exit(3) path: a clean torchstore error
        return "reported"
    return f"{status}: {text}"


@pytest.mark.slow
def test_flipped_bytes_are_reported_or_harmless(pristine, tmp_path):
    path, reference = pristine
    size = os.path.getsize(path)
    rng = random.Random(7)
    outcomes: dict[str, int] = {}
    # 91% of the file is checksummed data, 9% unused padding, 0.3% metadata (the metadata
    # checksums have their targeted flips below): one data hit in 40 trials fails a silent
    # wrong read, and 40 trials miss the data with odds of 0.09**40
    for trial in range(40):
        bad = tmp_path / f"flip{trial}.h5"
        shutil.copyfile(path, bad)
        offset = rng.randrange(size)
        with open(bad, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        result = _outcome(*run_forked(_read_all, str(bad), reference, timeout=30))
        assert result in ("no effect", "reported"), f"flip at byte {offset} of {size}: {result}"
        outcomes[result] = outcomes.get(result, 0) + 1
        bad.unlink()
    assert outcomes.get("reported", 0) > 20  # most of the file is committed data


@pytest.mark.slow
def test_truncated_files_are_reported_or_harmless(pristine, tmp_path):
    path, reference = pristine
    size = os.path.getsize(path)
    rng = random.Random(11)
    reported = 0
    for trial in range(30):
        bad = tmp_path / f"cut{trial}.h5"
        shutil.copyfile(path, bad)
        cut = rng.randrange(size) if trial else 0
        os.truncate(bad, cut)
        result = _outcome(*run_forked(_read_all, str(bad), reference, timeout=30))
        # cutting only unused space at the end of the file (page padding) is harmless
        assert result in ("no effect", "reported"), f"truncated to {cut} of {size} bytes: {result}"
        reported += result == "reported"
        bad.unlink()
    assert reported >= 25


def test_a_flipped_data_byte_names_the_column_and_rows(pristine, tmp_path):
    path, _ = pristine
    bad = tmp_path / "one.h5"
    shutil.copyfile(path, bad)
    with TrajectoryStore(bad) as store:
        ds = store._ds.columns["obs"].data
        offset = ds.id.get_chunk_info(3).byte_offset  # the fourth chunk of 'obs'
        rows = ds.chunks[0]
    with open(bad, "r+b") as f:
        f.seek(offset + 100)
        b = f.read(1)[0]
        f.seek(offset + 100)
        f.write(bytes([b ^ 0x10]))
    with TrajectoryStore(bad) as store:
        with pytest.raises(
            IntegrityError,
            match=rf"column 'obs' rows {3 * rows}\.\.{4 * rows - 1} fail their checksum",
        ):
            store.read_slab(0, store.num_rows)
        # other columns and other rows of the same column are still readable
        assert store.read_slab(0, 3 * rows, columns=["obs"])["obs"].shape[0] == 3 * rows
        store.read_slab(0, store.num_rows, columns=["action", "reward"])


# ----------------------------------------------------------------- metadata checksums
def _flip(path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def _manifest_offset(path, needle: bytes) -> int:
    data = open(path, "rb").read()
    start = data.index(b'{"columns": [')  # the manifest JSON in the global heap
    return data.index(needle, start)


def test_a_flipped_bit_in_the_manifest_is_reported_not_decoded(pristine, tmp_path):
    """Quantize(-1, 1) must not silently become Quantize(-1, 3)."""
    path, _ = pristine
    bad = tmp_path / "manifest.h5"
    shutil.copyfile(path, bad)
    _flip(bad, _manifest_offset(bad, b'"high": 1.0') + len('"high": '), bit=1)  # '1' -> '3'
    assert b'"high": 3.0' in open(bad, "rb").read()
    with pytest.raises((IntegrityError, StoreFormatError)):
        TrajectoryStore(bad)
    with pytest.raises((IntegrityError, StoreFormatError)):
        TrajectoryStoreWriter.resume(bad)


def test_a_manifest_changed_behind_its_checksum_is_reported(pristine, tmp_path):
    """HDF5 rewrites the attribute consistently; only torchstore's own hash can tell."""
    import h5py

    path, _ = pristine
    bad = tmp_path / "manifest.h5"
    shutil.copyfile(path, bad)
    with h5py.File(bad, "a", libver="latest") as f:
        text = bytes(f.attrs["torchstore_manifest"])
        f.attrs["torchstore_manifest"] = np.bytes_(text.replace(b'"high": 1.0', b'"high": 3.0'))
    with pytest.raises(IntegrityError, match="manifest .* fails its checksum"):
        TrajectoryStore(bad)
    with pytest.raises(IntegrityError, match="manifest .* fails its checksum"):
        TrajectoryStoreWriter.resume(bad)


def test_every_flipped_bit_of_the_manifest_text_is_reported(pristine, tmp_path):
    path, _ = pristine
    good = open(path, "rb").read()
    start = good.index(b'{"columns": [')
    end = good.index(b"}", good.index(b'"torchstore_version"', start)) + 1
    rng = random.Random(3)
    offsets = sorted(rng.sample(range(start, end), 40))

    def check():
        for offset in offsets:
            bad = tmp_path / "m.h5"
            bad.write_bytes(good)
            _flip(bad, offset, rng.randrange(8))
            try:
                TrajectoryStore(bad).close()
            except TorchstoreError:
                continue
            raise AssertionError(f"a flipped manifest byte at {offset} opened silently")

    assert run_forked(check, timeout=60) == ("ok", "")


def _commit_offset(path) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        return f["commit"].id.get_offset()


@pytest.mark.parametrize("field", [0, 1, 2, 3])
def test_a_flipped_bit_in_the_commit_record_is_reported(pristine, tmp_path, field):
    path, _ = pristine
    bad = tmp_path / "commit.h5"
    shutil.copyfile(path, bad)
    _flip(bad, _commit_offset(bad) + 8 * field, bit=0)
    with pytest.raises(IntegrityError, match="commit record .* fails its checksum"):
        TrajectoryStore(bad)


def test_a_huge_flipped_count_in_an_old_store_is_an_error_not_an_allocation(tmp_path):
    """Format 1 stores have no commit hash: counts are still bounded by the file's size."""
    from tests.data.test_store import _format1_store

    demo = _format1_store(tmp_path)
    for field in (0, 1, 2):
        bad = tmp_path / f"old{field}.h5"
        shutil.copyfile(demo, bad)
        _flip(bad, _commit_offset(bad) + 8 * field + 4, bit=4)  # count += 2**36
        with pytest.raises(
            IntegrityError, match="counts more than the .*-byte file can hold|is inconsistent"
        ):
            TrajectoryStore(bad)


def _object_header_ranges(path) -> dict[str, tuple[int, int]]:
    """Byte ranges of the object headers of the root group and a few datasets."""
    import h5py

    out = {}
    data = open(path, "rb").read()
    with h5py.File(path, "r") as f:
        for name in ("/", "commit", "columns/obs", "checksums/columns/obs", "episodes/index"):
            addr = h5py.h5o.get_info(f[name].id).addr
            assert data[addr : addr + 4] == b"OHDR"
            out[name] = (addr, addr + 256)
    return out


def test_damaged_object_headers_raise_torchstore_errors_only(pristine, tmp_path):
    """KeyError, RuntimeError or OSError from h5py must never reach a user."""
    path, reference = pristine
    good = open(path, "rb").read()
    rng = random.Random(5)
    trials = [
        (name, rng.randrange(lo, hi), rng.randrange(8))
        for name, (lo, hi) in _object_header_ranges(path).items()
        for _ in range(12)
    ]

    def check():
        for _name, offset, bit in trials:
            bad = tmp_path / "h.h5"
            bad.write_bytes(good)
            _flip(bad, offset, bit)
            try:
                _read_all_quietly(str(bad), reference)
            except TorchstoreError:
                pass

    status, text = run_forked(check, timeout=120)
    assert status == "ok", text


def _read_all_quietly(path, reference) -> None:
    with TrajectoryStore(path) as store:
        for name, ref in reference.items():
            got = store.read_column(name, 0, store.num_rows)
            assert np.array_equal(got, ref), f"silent wrong data in column {name}"
        for i in range(store.num_episodes):
            assert store.episode_metadata(i) == {"i": i}


def test_a_damaged_global_heap_of_a_format1_store_is_an_error_not_a_hang(tmp_path):
    """Format 1 kept the manifest as a heap string; HDF5 loops on some damaged heap sizes."""
    from tests.data.test_store import _format1_store

    good = _format1_store(tmp_path).read_bytes()
    heap = good.index(b"GCOL")
    bad = tmp_path / "heap.h5"

    def open_it():
        try:
            TrajectoryStore(bad).close()
        except TorchstoreError:
            pass

    for offset in range(heap + 16, heap + 32):  # the manifest object's index, count and size
        for bit in (0, 3, 6):
            damaged = bytearray(good)
            damaged[offset] ^= 1 << bit
            bad.write_bytes(damaged)
            assert run_forked(open_it, timeout=60) == ("ok", ""), (
                f"heap byte {offset - heap}, bit {bit}"
            )
