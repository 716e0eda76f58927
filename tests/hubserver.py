"""A loopback Hugging Face Hub for tests: the part of its HTTP API huggingface_hub calls here.

In memory, threaded, HTTP/1.1 keep-alive, bound to 127.0.0.1 on a free port. It speaks
what huggingface_hub 2.4 sends for: create_repo, repo_info/dataset_info, list_datasets,
list_models, list_repo_tree/list_repo_files, get_paths_info, list_repo_refs, preupload +
commit (base64 regular files only: preupload answers ``regular`` for everything, so LFS and
Xet never start), tags, branches, validate-yaml, and HEAD/GET resolve with ETag,
X-Repo-Commit and Range (``bytes=N-`` or ``bytes=A-B``). Typed errors carry
``X-Error-Code``. No ``X-Xet-*`` header is ever sent. That is also all that lerobot's
``StreamingLeRobotDataset`` (through ``datasets`` streaming and ``HfFileSystem``) asks of it.

Usage::

    with HubServer() as hub:
        HfApi(endpoint=hub.endpoint).create_repo("tester/ds", repo_type="dataset")

Counters: ``requests`` (method, raw path, authorization, Range header, and the status
answered) and ``body_bytes`` (resolve bytes sent per ``repo_id/path``). Fault:
``cut_after[(repo_id, path)] = n`` drops the next resolve GET of that file after ``n`` body
bytes. A slow link, for benchmarks: ``delay_s`` is slept before answering each request (a
round-trip latency) and ``rate_bytes_per_s`` caps how fast each answer's body is sent
(0: no cap), as ``tests/fileserver.py`` does.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

from tests.loopback import LoopbackServer

TYPES = {"datasets": "dataset", "models": "model", "spaces": "space"}
PREFIX = {"dataset": "datasets/", "model": "", "space": "spaces/"}
DATE = "2025-01-01T00:00:00.000Z"


def blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    oid: str
    files: dict[str, bytes]
    title: str
    parent: str | None


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> str | None:
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        for prefix, table in (("refs/heads/", self.branches), ("refs/tags/", self.tags)):
            if rev.startswith(prefix) and rev[len(prefix) :] in table:
                return table[rev[len(prefix) :]]
        if rev in self.commits:
            return rev
        if len(rev) >= 7:
            hits = [c for c in self.commits if c.startswith(rev)]
            if len(hits) == 1:
                return hits[0]
        return None


class HubError(Exception):
    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class HubServer(LoopbackServer):
    def __init__(self):
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.RLock()
        self.requests: list[dict] = []
        self.body_bytes: dict[str, int] = defaultdict(int)
        self.cut_after: dict[tuple[str, str], int] = {}
        self.delay_s = 0.0
        self.rate_bytes_per_s = 0
        self._counter = 0
        self._serve(_make_handler(self))

    @property
    def endpoint(self) -> str:
        return self.origin

    # ----------------------------------------------------------------- state
    def new_commit(
        self, repo: Repo, files: dict[str, bytes], title: str, parent: str | None
    ) -> str:
        self._counter += 1
        seed = f"{repo.repo_id}\0{parent}\0{self._counter}\0{time.time_ns()}\0{sorted(files)}"
        oid = hashlib.sha1(seed.encode()).hexdigest()
        repo.commits[oid] = Commit(oid, files, title, parent)
        return oid

    def repo_url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{PREFIX[repo.repo_type]}{repo.repo_id}"

    def get_repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, f"Repository Not Found for url: {repo_id}", "RepoNotFound")
        return repo

    def commit_of(self, repo: Repo, rev: str) -> Commit:
        oid = repo.resolve(rev)
        if oid is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return repo.commits[oid]

    def info(self, repo: Repo, commit: Commit) -> dict:
        return {
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "createdAt": DATE,
            "lastModified": DATE,
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "siblings": [
                {"rfilename": p, "size": len(d), "blobId": blob_sha1(d)}
                for p, d in sorted(commit.files.items())
            ],
        }


class _HubHandler(BaseHTTPRequestHandler):
    """Answers for one :class:`HubServer` (set as ``hub`` on the subclass it makes)."""

    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, *args) -> None:
        pass

    # ------------------------------------------------------------- io
    def _body(self) -> bytes:
        return self._raw_body

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict | None = None,
        ctype="application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self._write(body)

    def _write(self, body: bytes) -> None:
        """Send ``body``, no faster than the hub's ``rate_bytes_per_s`` where it has one."""
        rate = self.hub.rate_bytes_per_s
        if not rate:
            self.wfile.write(body)
            return
        step = max(1, rate // 100)  # 10 ms of bytes at a time
        for at in range(0, len(body), step):
            self.wfile.write(body[at : at + step])
            time.sleep(min(step, len(body) - at) / rate)

    def send_response(self, code: int, message: str | None = None) -> None:
        request = getattr(self, "_request", None)  # None: refused before it was parsed
        if request is not None:
            request["status"] = code
        super().send_response(code, message)

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        segments = [unquote(s) for s in parts.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self._raw_body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        self._request = {
            "method": self.command,
            "path": self.path,
            "authorization": self.headers.get("Authorization"),
            "range": self.headers.get("Range"),
            "status": None,
        }
        with self.hub.lock:
            self.hub.requests.append(self._request)
        if self.hub.delay_s:
            time.sleep(self.hub.delay_s)
        try:
            if segments and segments[0] == "api":
                self._api(segments[1:], query)
            else:
                self._resolve(segments)
        except HubError as exc:
            headers = dict(exc.headers)
            if exc.code:
                headers["X-Error-Code"] = exc.code
            headers["X-Error-Message"] = exc.message
            self._json({"error": exc.message}, exc.status, headers)

    do_GET = do_HEAD = do_POST = do_DELETE = do_PUT = _dispatch

    # ------------------------------------------------------------- api
    #: ``/api/...`` paths with fixed segments: (method, segments) -> handler name
    _API_ROUTES = {
        ("POST", ("repos", "create")): "_create",
        ("DELETE", ("repos", "delete")): "_delete",
        ("POST", ("validate-yaml",)): "_validate_yaml",
    }

    def _api(self, seg: list[str], query: dict) -> None:
        route = self._API_ROUTES.get((self.command, tuple(seg)))
        if route is not None:
            return getattr(self, route)(json.loads(self._body() or b"{}"))
        if seg and seg[0] in TYPES:
            if len(seg) == 1 and self.command == "GET":
                return self._list(TYPES[seg[0]], query)
            if len(seg) >= 3:
                repo_type, repo_id, rest = TYPES[seg[0]], f"{seg[1]}/{seg[2]}", seg[3:]
                return self._repo_api(repo_type, repo_id, rest, query)
        raise HubError(404, f"no route {self.command} {self.path}")

    def _delete(self, body: dict) -> None:
        key = (body.get("type") or "model", f"{body.get('organization')}/{body['name']}")
        with self.hub.lock:
            if self.hub.repos.pop(key, None) is None:
                raise HubError(404, "repo not found", "RepoNotFound")
        self._json({})

    def _validate_yaml(self, body: dict) -> None:
        self._json({"errors": [], "warnings": []})

    def _create(self, body: dict) -> None:
        repo_type = body.get("type") or "model"
        org = body.get("organization")
        if not org:
            raise HubError(400, "use a namespace/name repo id")
        repo_id = f"{org}/{body['name']}"
        private = body.get("visibility") == "private" or bool(body.get("private"))
        with self.hub.lock:
            if (repo_type, repo_id) in self.hub.repos:
                repo = self.hub.repos[(repo_type, repo_id)]
                return self._json(
                    {"error": "You already created this repo", "url": self.hub.repo_url(repo)}, 409
                )
            repo = Repo(repo_id, repo_type, private)
            oid = self.hub.new_commit(repo, {}, "initial commit", None)
            repo.branches["main"] = oid
            self.hub.repos[(repo_type, repo_id)] = repo
        self._json({"url": self.hub.repo_url(repo)})

    def _list(self, repo_type: str, query: dict) -> None:
        author = query.get("author")
        with self.hub.lock:
            out = [
                self.hub.info(r, r.commits[r.branches["main"]])
                for (t, rid), r in sorted(self.hub.repos.items())
                if t == repo_type and (author is None or rid.split("/")[0] == author)
            ]
        self._json(out)

    #: ``/api/{type}s/{ns}/{name}/{head}/...``: (method, head) -> handler name; ``*``: any
    #: method (the handler checks it). Each handler takes (repo, args after head, query).
    _REPO_ROUTES = {
        ("GET", ""): "_repo_info",
        ("GET", "revision"): "_revision_info",
        ("GET", "tree"): "_tree",
        ("POST", "paths-info"): "_paths_info",
        ("GET", "refs"): "_refs",
        ("POST", "preupload"): "_preupload",
        ("POST", "commit"): "_commit",
        ("*", "tag"): "_tag",
        ("*", "branch"): "_branch",
    }

    def _repo_api(self, repo_type: str, repo_id: str, rest: list[str], query: dict) -> None:
        head, args = (rest[0], rest[1:]) if rest else ("", [])
        route = self._REPO_ROUTES.get((self.command, head)) or self._REPO_ROUTES.get(("*", head))
        with self.hub.lock:
            repo = self.hub.get_repo(repo_type, repo_id)
            if route is None:
                raise HubError(404, f"no route {self.command} {self.path}")
            return getattr(self, route)(repo, args, query)

    def _repo_info(self, repo: Repo, args: list[str], query: dict) -> None:
        self._json(self.hub.info(repo, self.hub.commit_of(repo, "main")))

    def _revision_info(self, repo: Repo, args: list[str], query: dict) -> None:
        self._json(self.hub.info(repo, self.hub.commit_of(repo, "/".join(args))))

    def _refs(self, repo: Repo, args: list[str], query: dict) -> None:
        refs = {
            "branches": [
                {"name": b, "ref": f"refs/heads/{b}", "targetCommit": c}
                for b, c in repo.branches.items()
            ],
            "converts": [],
            "tags": [
                {"name": t, "ref": f"refs/tags/{t}", "targetCommit": c}
                for t, c in repo.tags.items()
            ],
        }
        if "include_prs" in query:
            refs["pullRequests"] = []
        self._json(refs)

    def _tree(self, repo: Repo, args: list[str], query: dict) -> None:
        commit = self.hub.commit_of(repo, args[0])
        sub = "/".join(args[1:]).strip("/")
        recursive = query.get("recursive") == "true"
        files = {p: d for p, d in commit.files.items() if not sub or p.startswith(sub + "/")}
        if sub and not files:
            raise HubError(404, f"{sub} does not exist", "EntryNotFound")
        dirs = set()
        for p in commit.files:
            parts = p.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
        base_depth = len(sub.split("/")) if sub else 0
        out = []
        for d in sorted(dirs):
            if (not sub or d.startswith(sub + "/")) and (recursive or d.count("/") == base_depth):
                out.append(
                    {
                        "type": "directory",
                        "path": d,
                        "oid": hashlib.sha1(d.encode()).hexdigest(),
                        "size": 0,
                    }
                )
        for p, data in sorted(files.items()):
            if recursive or p.count("/") == base_depth:
                out.append({"type": "file", "path": p, "oid": blob_sha1(data), "size": len(data)})
        self._json(out)

    def _paths_info(self, repo: Repo, args: list[str], query: dict) -> None:
        """``get_paths_info``: a form (``paths=a&paths=b&expand=...``) or a JSON body."""
        commit = self.hub.commit_of(repo, "/".join(args))
        raw = self._body()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(raw or b"{}").get("paths", [])
        else:
            paths = parse_qs(raw.decode()).get("paths", [])
        out = []
        for path in (p.strip("/") for p in paths):
            if path in commit.files:
                data = commit.files[path]
                out.append(
                    {"type": "file", "path": path, "oid": blob_sha1(data), "size": len(data)}
                )
            elif any(p.startswith(path + "/") for p in commit.files):
                oid = hashlib.sha1(path.encode()).hexdigest()
                out.append({"type": "directory", "path": path, "oid": oid, "size": 0})
        self._json(out)

    def _preupload(self, repo: Repo, args: list[str], query: dict) -> None:
        commit = self.hub.commit_of(repo, "/".join(args))
        body = json.loads(self._body() or b"{}")
        files = [
            {
                "path": f["path"],
                "uploadMode": "regular",
                "shouldIgnore": False,
                "oid": blob_sha1(commit.files[f["path"]]) if f["path"] in commit.files else None,
            }
            for f in body.get("files", [])
        ]
        self._json({"files": files})

    def _commit(self, repo: Repo, args: list[str], query: dict) -> None:
        rev = "/".join(args)
        if rev not in repo.branches:
            raise HubError(400, f"cannot commit to {rev!r}: not a branch")
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the commit must start with a header line")
        header = lines[0]["value"]
        head = repo.branches[rev]
        parent = header.get("parentCommit")
        if parent and not head.startswith(parent):
            raise HubError(412, f"parent commit {parent} is not the head of {rev}")
        files = dict(repo.commits[head].files)
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            operation = _COMMIT_OPERATIONS.get(key)
            if operation is None:
                raise HubError(
                    400, f"unsupported commit operation {key!r} (LFS is not served here)"
                )
            files = operation(files, value)
        oid = self.hub.new_commit(repo, files, header.get("summary", ""), head)
        repo.branches[rev] = oid
        self._json(
            {
                "success": True,
                "commitOid": oid,
                "commitUrl": f"{self.hub.repo_url(repo)}/commit/{oid}",
                "pullRequestUrl": None,
            }
        )

    def _tag(self, repo: Repo, args: list[str], query: dict) -> None:
        arg = "/".join(args)
        if self.command == "POST":
            tag = json.loads(self._body() or b"{}")["tag"]
            if tag in repo.tags:
                raise HubError(409, f"tag {tag} exists")
            repo.tags[tag] = self.hub.commit_of(repo, arg or "main").oid
            return self._json({})
        if self.command == "DELETE":
            if repo.tags.pop(arg, None) is None:
                raise HubError(404, f"no tag {arg}", "RevisionNotFound")
            return self._json({})
        raise HubError(405, "method not allowed")

    def _branch(self, repo: Repo, args: list[str], query: dict) -> None:
        branch = "/".join(args)
        if self.command == "POST":
            body = json.loads(self._body() or b"{}")
            if branch in repo.branches:
                raise HubError(409, f"branch {branch} exists")
            repo.branches[branch] = self.hub.commit_of(
                repo, body.get("startingPoint") or "main"
            ).oid
            return self._json({})
        if self.command == "DELETE":
            if repo.branches.pop(branch, None) is None:
                raise HubError(404, f"no branch {branch}", "RevisionNotFound")
            return self._json({})
        raise HubError(405, "method not allowed")

    # ------------------------------------------------------------- resolve
    def _resolve(self, seg: list[str]) -> None:
        repo_type = "model"
        if seg and seg[0] in ("datasets", "spaces"):
            repo_type = TYPES[seg.pop(0)]
        if len(seg) < 5 or seg[2] != "resolve" or self.command not in ("GET", "HEAD"):
            raise HubError(404, f"no route {self.command} {self.path}")
        repo_id, rev, path = f"{seg[0]}/{seg[1]}", seg[3], "/".join(seg[4:])
        with self.hub.lock:
            repo = self.hub.get_repo(repo_type, repo_id)
            commit = self.hub.commit_of(repo, rev)
            data = commit.files.get(path)
            if data is None:
                raise HubError(
                    404, f"{path} not found", "EntryNotFound", {"X-Repo-Commit": commit.oid}
                )
            cut = self.hub.cut_after.pop((repo_id, path), None) if self.command == "GET" else None
        start, end, status = 0, len(data) - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):  # bytes=N- or bytes=A-B
            first, _, last = rng[6:].partition("-")
            start, status = int(first), 206
            end = min(int(last), len(data) - 1) if last else len(data) - 1
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
        body = data[start : end + 1]
        headers = {
            "ETag": f'"{blob_sha1(data)}"',
            "X-Repo-Commit": commit.oid,
            "Accept-Ranges": "bytes",
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut is not None and cut < len(body):
            self.hub.body_bytes[f"{repo_id}/{path}"] += (
                cut  # counted first: the client may finish first
            )
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.hub.body_bytes[f"{repo_id}/{path}"] += len(body)
        self._write(body)


def _put_file(files: dict[str, bytes], value: dict) -> dict[str, bytes]:
    if value.get("encoding") != "base64":
        raise HubError(400, "only base64 file content is supported")
    files[value["path"]] = base64.b64decode(value["content"])
    return files


def _delete_file(files: dict[str, bytes], value: dict) -> dict[str, bytes]:
    if value["path"] not in files:
        raise HubError(
            404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound"
        )
    del files[value["path"]]
    return files


def _delete_folder(files: dict[str, bytes], value: dict) -> dict[str, bytes]:
    prefix = value["path"].rstrip("/") + "/"
    return {p: d for p, d in files.items() if not p.startswith(prefix)}


#: a commit's operation lines: key -> (files so far, the line's value) -> files after it
_COMMIT_OPERATIONS = {
    "file": _put_file,
    "deletedFile": _delete_file,
    "deletedFolder": _delete_folder,
}


def _make_handler(hub: HubServer) -> type[_HubHandler]:
    return type("Handler", (_HubHandler,), {"hub": hub})


# --------------------------------------------------------------------------- default endpoint
_DEFAULT_ENDPOINT_CLI = """
import sys
import huggingface_hub
import huggingface_hub.constants as constants

endpoint = sys.argv[1]
constants.ENDPOINT = endpoint
constants.HUGGINGFACE_CO_URL_TEMPLATE = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
# leave the package as a fresh ``import huggingface_hub`` does: its submodules are loaded
# lazily, so ``huggingface_hub.constants`` is no attribute of it until someone imports it
del huggingface_hub.constants
assert not hasattr(huggingface_hub, "constants") and not hasattr(huggingface_hub, "errors")
from torchstore.cli.main import main

sys.exit(main(sys.argv[2:]))
"""


#: prepended with ``waits_to``: ``time.sleep`` only records its argument, written at exit
_RECORD_WAITS = """
import atexit, json, os, time
_waits = []
time.sleep = _waits.append
atexit.register(lambda: open(os.environ["TORCHSTORE_TEST_WAITS"], "w").write(json.dumps(_waits)))
"""


def run_cli_default_endpoint(
    endpoint: str, *args: str, env: dict | None = None, timeout=300, waits_to=None
):
    """Run ``torchstore ARGS`` in a fresh interpreter with ``HF_ENDPOINT`` unset.

    huggingface_hub's default endpoint (``constants.ENDPOINT``, what a user without
    ``HF_ENDPOINT`` gets) is pointed at ``endpoint`` before torchstore is imported, so the
    code path of a default install runs against the loopback Hub. With ``waits_to`` (a
    path), ``time.sleep`` returns at once and the waits asked of it (retry backoffs: 23 s
    against an unreachable Hub) are written there as a JSON list. Returns the
    ``CompletedProcess`` (text mode).
    """
    import os
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if k != "HF_ENDPOINT"}
    full.update(env or {})
    full.pop("HF_ENDPOINT", None)
    full["PYTHONPATH"] = os.pathsep.join(
        p
        for p in (
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            full.get("PYTHONPATH"),
        )
        if p
    )
    script = _DEFAULT_ENDPOINT_CLI
    if waits_to is not None:
        script = _RECORD_WAITS + script
        full["TORCHSTORE_TEST_WAITS"] = str(waits_to)
    return subprocess.run(
        [sys.executable, "-c", script, endpoint, *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
