"""Write the zarr v2 fixture of ``test_zarr.py`` with zarr 2, as diffusion-policy does.

Run it with a zarr 2 interpreter, not the project's (which has zarr 3)::

    bash tests/formats/zarr2_venv.sh          # /tmp/zarr2: zarr 2.18, numcodecs 0.15
    /tmp/zarr2/bin/python tests/formats/make_zarr_fixture.py tests/formats/fixtures

diffusion-policy's ``ReplayBuffer`` (``diffusion_policy/common/replay_buffer.py``) is not
on PyPI, so the few zarr 2 calls its ``create_empty_zarr()`` and ``add_episode()`` make
are re-done here, call for call:

- ``create_empty_zarr``: ``zarr.group(store)``, ``require_group("data")``,
  ``require_group("meta")``, and ``meta.zeros("episode_ends", shape=(0,), dtype=int64,
  compressor=None)``;
- ``add_episode``: a key seen for the first time gets ``data.zeros(key, shape, chunks,
  dtype, compressor)`` with the chunks of ``get_optimal_chunks`` computed from *that
  first episode's* shape (2 MB chunks, cut along time only; a low-dim key's chunk is the
  first episode's length) and the default ``Blosc(lz4, clevel=5, NOSHUFFLE)``; later
  episodes ``resize`` every array and write their rows at the end; ``episode_ends`` is
  resized by one and set, and rechunked with ``zarr.copy`` to 1.5x its length whenever
  it outgrows its chunk;
- the ``.zarr.zip`` copy: ``ReplayBuffer.save_to_store(zarr.ZipStore(...))`` with chunks
  and compressors unchanged is ``zarr.copy_store`` of ``meta`` and ``data``.

Writes ``pusht_tiny.zarr/`` (a ``DirectoryStore``), ``pusht_tiny.zarr.zip`` and
``pusht_tiny.npz``, the arrays zarr 2 reads back (``data/<key>``, ``meta/episode_ends``),
to compare with. Keys and dtypes are PushT's (``pusht_cchi_v7_replay.zarr``), images
32x32 instead of 96x96 to keep the fixture small. With ``--check STORE`` it instead opens
a zarr store (folder or ``.zip``) with zarr 2 and prints its arrays as JSON (for the test
that zarr 2 reads what ``export_zarr`` wrote).
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import numbers
import shutil
import sys
from pathlib import Path

import numcodecs
import numpy as np
import zarr

assert zarr.__version__.startswith("2."), f"needs zarr 2, this is zarr {zarr.__version__}"

LENGTHS = (7, 12, 5)
SIDE = 32
SEED = 7


# ----------------------------------------------------------- diffusion-policy's calls
def optimal_chunks(shape, dtype, target_chunk_bytes=2e6, max_chunk_length=None):
    """``get_optimal_chunks``: whole trailing dims up to 2 MB, then cut the next one."""
    itemsize = np.dtype(dtype).itemsize
    rshape = list(shape[::-1])
    if max_chunk_length is not None:
        rshape[-1] = int(max_chunk_length)
    split = len(shape) - 1
    for i in range(len(shape) - 1):
        here = itemsize * np.prod(rshape[:i])
        after = itemsize * np.prod(rshape[: i + 1])
        if here <= target_chunk_bytes < after:
            split = i
    rchunks = rshape[:split]
    item_bytes = itemsize * np.prod(rshape[:split])
    rchunks.append(min(rshape[split], math.ceil(target_chunk_bytes / item_bytes)))
    rchunks.extend([1] * (len(shape) - len(rchunks)))
    return tuple(rchunks[::-1])


def default_compressor():
    """``ReplayBuffer.resolve_compressor('default')``."""
    return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE)


def create_empty_zarr(store):
    root = zarr.group(store=store)
    root.require_group("data", overwrite=False)
    meta = root.require_group("meta", overwrite=False)
    if "episode_ends" not in meta:
        meta.zeros("episode_ends", shape=(0,), dtype=np.int64, compressor=None, overwrite=False)
    return root


def rechunk(group, name, chunk_length):
    """``rechunk_recompress_array(group, name, chunk_length=...)`` (same compressor)."""
    old = group[name]
    chunks = (chunk_length,) + old.chunks[1:]
    assert all(isinstance(c, numbers.Integral) and c > 0 for c in chunks)
    if chunks == old.chunks:
        return
    group.move(name, "_temp")
    zarr.copy(
        source=group["_temp"], dest=group, name=name, chunks=chunks, compressor=old.compressor
    )
    del group["_temp"]


def add_episode(root, episode):
    data, meta = root["data"], root["meta"]
    ends = meta["episode_ends"]
    start = int(ends[-1]) if ends.shape[0] else 0
    length = len(next(iter(episode.values())))
    assert all(len(v) == length for v in episode.values())
    stop = start + length
    for key, value in episode.items():
        shape = (stop,) + value.shape[1:]
        if key not in data:
            arr = data.zeros(
                name=key,
                shape=shape,
                chunks=optimal_chunks(value.shape, value.dtype),
                dtype=value.dtype,
                compressor=default_compressor(),
            )
        else:
            arr = data[key]
            assert value.shape[1:] == arr.shape[1:]
            arr.resize(shape)
        arr[-length:] = value
    ends.resize(ends.shape[0] + 1)
    ends[-1] = stop
    if ends.chunks[0] < ends.shape[0]:
        rechunk(meta, "episode_ends", int(ends.shape[0] * 1.5))


# ----------------------------------------------------------- PushT-like episodes
def episode(rng, length):
    """One episode with PushT's keys: an agent (a bright square) moving over a gradient."""
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    background = np.stack([xx * 6, yy * 6, (xx + yy) * 3], axis=-1).astype(np.int64)
    pos = rng.uniform(4, SIDE - 4, size=2)
    img = np.empty((length, SIDE, SIDE, 3), np.uint8)
    states, actions = [], []
    for t in range(length):
        action = pos + rng.normal(0, 1.5, size=2)
        pos = np.clip(pos + 0.5 * (action - pos), 2, SIDE - 3)
        frame = background.copy()
        y, x = int(pos[0]), int(pos[1])
        frame[y - 2 : y + 2, x - 2 : x + 2] = (250, 40, 40)
        frame += rng.integers(0, 3, size=frame.shape)  # a little sensor noise
        img[t] = np.clip(frame, 0, 255)
        states.append([pos[1], pos[0], *rng.uniform(0, 512, 2), rng.uniform(-np.pi, np.pi)])
        actions.append(action[::-1])
    return {
        "img": img,
        "state": np.asarray(states, np.float32),
        "action": np.asarray(actions, np.float32),
        "keypoint": rng.uniform(0, 512, size=(length, 9, 2)).astype(np.float32),
        "n_contacts": rng.integers(0, 3, size=(length, 1)).astype(np.float32),
    }


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    folder, zipped, npz = out / "pusht_tiny.zarr", out / "pusht_tiny.zarr.zip", out / "pusht_tiny"
    shutil.rmtree(folder, ignore_errors=True)
    zipped.unlink(missing_ok=True)
    rng = np.random.default_rng(SEED)
    store = zarr.DirectoryStore(str(folder))
    root = create_empty_zarr(store)
    for length in LENGTHS:
        add_episode(root, episode(rng, length))
    zip_store = zarr.ZipStore(str(zipped), mode="w")
    try:
        zarr.group(store=zip_store)
        for path in ("/meta", "/data"):
            zarr.copy_store(
                source=store, dest=zip_store, source_path=path, dest_path=path, if_exists="replace"
            )
    finally:
        zip_store.close()
    back = zarr.open_group(str(folder), mode="r")
    arrays = {f"data/{k}": v[:] for k, v in back["data"].arrays()}
    arrays["meta/episode_ends"] = back["meta"]["episode_ends"][:]
    np.savez_compressed(npz, **arrays)
    print(f"zarr {zarr.__version__}, numcodecs {numcodecs.__version__}")
    print(back.tree())
    for key, arr in back["data"].arrays():
        print(key, arr.dtype, arr.shape, arr.chunks, arr.compressor)
    ends = back["meta"]["episode_ends"]
    print("episode_ends", ends.dtype, ends.shape, ends.chunks, ends.compressor, ends[:])


# ----------------------------------------------------------- zarr 2 reads an export
def _describe(arr) -> dict:
    value = arr[...]
    return {
        "dtype": value.dtype.str,
        "shape": list(value.shape),
        "chunks": list(arr.chunks),
        "compressor": arr.compressor.get_config() if arr.compressor else None,
        "attrs": dict(arr.attrs),
        "b64": base64.b64encode(np.ascontiguousarray(value).tobytes()).decode(),
    }


def check(path: str) -> None:
    store = zarr.ZipStore(path, mode="r") if path.endswith(".zip") else zarr.DirectoryStore(path)
    try:
        root = zarr.open_group(store=store, mode="r")
        arrays = {}
        root.visititems(
            lambda name, obj: (
                arrays.update({name: _describe(obj)}) if isinstance(obj, zarr.Array) else None
            )
        )
        groups = {"": dict(root.attrs)}
        root.visitvalues(
            lambda obj: (
                groups.update({obj.path: dict(obj.attrs)}) if isinstance(obj, zarr.Group) else None
            )
        )
        json.dump({"arrays": arrays, "groups": groups}, sys.stdout)
    finally:
        if hasattr(store, "close"):
            store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default=str(Path(__file__).parent / "fixtures"))
    parser.add_argument("--check", metavar="STORE", help="print a store's arrays as JSON")
    args = parser.parse_args()
    if args.check:
        check(args.check)
    else:
        write(Path(args.out))
