"""Pushes racing each other: 4-8 forked pushers released at once onto one index location.

Each trial picks a location (a local folder, or the loopback HTTP file server of the test
suite, ``tests/fileserver.py``, run in its own process, when the checkout has it) and a
race: pushes creating the same new entry (different content, refused unless one wins),
the same new entry with ``replace=True`` (every pusher a revision), new revisions of an
existing entry, or the same content (all up to date but one). Every pusher must end with
its own revision or a torchstore error; then every revision the index lists is pulled
and compared byte for byte with the folder pushed as it, and no revision a pusher was
told it published (nor one listed before the race) may be missing. Outcomes:

- ``consistent``: every pusher published or was refused as it should be
  (``EntryExistsError`` for other content onto an entry another pusher just created);
- ``consistent, told to retry``: as above, but a pusher got ``IndexConflictError``;
- ``index names missing bytes``: a listed revision fails to pull or differs;
- ``revision lost``: a revision a pusher published (or one listed before) is not listed;
- ``unexpected error``: a torchstore error other than those two refusals;
- ``raw``: an exception that is not a torchstore error (a pusher's or the check's);
- ``hang``: a pusher still running past the deadline (killed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from torchstore.errors import EntryExistsError, IndexConflictError, TorchstoreError
from torchstore.remote import RemoteCatalog, pull
from torchstore.remote.index import RemoteFile, entry_revision
from torchstore.remote.upload import push_folder

OUTCOMES = [
    "consistent",
    "consistent, told to retry",
    "index names missing bytes",
    "revision lost",
    "unexpected error",
    "raw",
    "hang",
]
GOOD = {"consistent", "consistent, told to retry"}
RACES = ("new entry", "new entry, replace", "new revisions", "same content")
_DEADLINE_S = 60.0
_REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------- what each pusher pushes
def _folder(root: Path, rng: random.Random) -> dict[str, bytes]:
    """A small entry: a file every pusher shares, one of its own content, maybe one more."""
    files = {
        "meta/info.json": b'{"shared": true}',
        "data/blob.bin": rng.randbytes(rng.randrange(512, 48_000)),
    }
    if rng.random() < 0.5:
        files[f"data/extra-{rng.randrange(3)}.bin"] = rng.randbytes(rng.randrange(0, 4096))
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _revision(files: dict[str, bytes]) -> str:
    return entry_revision(
        RemoteFile(rel, len(data), hashlib.sha256(data).hexdigest()) for rel, data in files.items()
    )


# ----------------------------------------------------------------- the loopback HTTP server
@contextlib.contextmanager
def _http_server(root: Path):
    """The test suite's file server in a child process; yields its URL (None without it)."""
    if not (_REPO / "tests" / "fileserver.py").is_file():
        yield None
        return
    url_r, url_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(url_r)
            os.close(stop_w)
            sys.path.insert(0, str(_REPO))
            from tests.fileserver import FileServer

            with FileServer(root) as server:
                os.write(url_w, server.url.encode())
                os.read(stop_r, 1)  # until the parent closes its end
        finally:
            os._exit(0)
    os.close(url_w)
    os.close(stop_r)
    try:
        url = os.read(url_r, 4096).decode()
        yield url or None
    finally:
        os.close(url_r)
        os.close(stop_w)
        os.waitpid(pid, 0)


# ----------------------------------------------------------------- forked pushers
def _fork_pusher(folder: Path, location: str, replace: bool, go_r: int) -> tuple[int, int]:
    """A child that waits for a byte on ``go_r``, pushes, and writes its outcome as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.read(go_r, 1)
            try:
                done = push_folder(folder, location, "ds", replace=replace, progress=False)
                out = ["ok", done.entry.revision]
            except TorchstoreError as exc:
                out = ["torchstore", type(exc).__name__, str(exc)[:300]]
            except BaseException as exc:  # noqa: BLE001 - counting raw exceptions is the point
                out = ["raw", type(exc).__name__, traceback.format_exc()[-800:]]
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def _collect(children: list[tuple[int, int]]) -> list[list]:
    deadline = time.monotonic() + _DEADLINE_S
    results = []
    for pid, r in children:
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        data = os.read(r, 65536)
        os.close(r)
        results.append(json.loads(data) if data else ["hang"])
    return results


def _race(location: str, folders: list[Path], replace: bool) -> list[list]:
    go_r, go_w = os.pipe()
    children = [_fork_pusher(f, location, replace, go_r) for f in folders]
    os.write(go_w, b"g" * len(folders))  # every pusher starts at once
    os.close(go_r)
    os.close(go_w)
    return _collect(children)


# ----------------------------------------------------------------- the check
def _check(
    location: str, expected: dict[str, dict[str, bytes]], must_list: set[str], cache: Path
) -> tuple[str, str]:
    """``(outcome, note)`` for the index after a race (outcome "" when it is consistent)."""
    try:
        entry = RemoteCatalog(location)["ds"]
    except TorchstoreError as exc:
        return "index names missing bytes", f"{type(exc).__name__}: {exc}"
    listed = {rev.revision for rev in entry.revisions}
    if must_list - listed:
        return "revision lost", f"not listed: {sorted(r[:12] for r in must_list - listed)}"
    for rev in entry.revisions:
        try:
            got = pull(location, f"ds@{rev.revision}", cache_dir=cache, progress=False)
        except TorchstoreError as exc:
            return "index names missing bytes", f"{rev.revision[:12]}: {exc}"
        files = {
            p.relative_to(got).as_posix(): p.read_bytes()
            for p in got.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        }
        if files != expected.get(rev.revision):
            return "index names missing bytes", f"{rev.revision[:12]} pulls other bytes"
    return "", ""


def _judge(race: str, results: list[list], must_list: set[str]) -> tuple[str, str]:
    """The pushers' side: raw or hung pushers, wrong refusals; adds what must be listed."""
    for out in results:
        if out[0] in ("raw", "hang"):
            return out[0], " ".join(map(str, out[1:]))[:400]
    retried = False
    for out in results:
        if out[0] == "ok":
            must_list.add(out[1])
        elif out[1] == IndexConflictError.__name__:
            retried = True
        elif not (race == "new entry" and out[1] == EntryExistsError.__name__):
            return "unexpected error", f"{race}: {out[1]}: {out[2]}"
    if race == "new entry" and sum(out[0] == "ok" for out in results) != 1 and not retried:
        return "revision lost", f"{race}: {sum(o[0] == 'ok' for o in results)} winners"
    return ("consistent, told to retry" if retried else "consistent"), ""


def _trial(workdir: Path, location: str, race: str, n: int, rng: random.Random):
    expected: dict[str, dict[str, bytes]] = {}
    must_list: set[str] = set()
    if race == "new revisions":
        base = workdir / "base"
        files = _folder(base, rng)
        expected[_revision(files)] = files
        must_list.add(push_folder(base, location, "ds", progress=False).entry.revision)
    folders = []
    for i in range(n):
        folder = workdir / f"pusher{i}"
        files = _folder(folder, random.Random(7) if race == "same content" else rng)
        expected[_revision(files)] = files
        folders.append(folder)
    results = _race(location, folders, replace=race in ("new entry, replace", "new revisions"))
    outcome, note = _judge(race, results, must_list)
    if outcome not in GOOD:
        return outcome, note
    bad, why = _check(location, expected, must_list, workdir / "cache")
    return (bad, why) if bad else (outcome, note)


def run_section(workdir: Path, trials: int, rng: random.Random) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    notes: list[str] = []
    root = workdir / "concurrent-pushes"
    with _http_server(root / "served") as http_url:
        if http_url is None:
            notes.append("concurrent pushes: no tests/fileserver.py here; folder locations only")
        for trial in range(trials):
            race = RACES[trial % len(RACES)]
            n = rng.randrange(4, 9)
            work = root / f"t{trial}"
            # every race on both kinds: a round of RACES on a folder, the next over HTTP
            use_http = http_url is not None and (trial // len(RACES)) % 2 == 1
            location = f"{http_url}/t{trial}" if use_http else str(work / "loc")
            work.mkdir(parents=True)
            try:
                outcome, note = _trial(work, location, race, n, rng)
            except Exception as exc:  # noqa: BLE001 - the check itself failing is counted
                outcome, note = "raw", f"{type(exc).__name__}: {exc}"
            counts[outcome] += 1
            if outcome not in GOOD or note:
                kind = "http" if use_http else "folder"
                notes.append(f"concurrent pushes ({race}, {kind}, {n} pushers): {outcome}: {note}")
    return counts, notes
