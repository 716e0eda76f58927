"""A loopback HTTP file server for tests: Range, PUT, ETag/If-Match, fault injection, counters.

Serves (and stores ``PUT`` bodies into) a root folder, bound to 127.0.0.1 on a free port.

Faults, all keyed by the URL path below the root (``"ds/data/a.bin"``):

- ``cut_after[path] = n``: the next GET of ``path`` sends headers for the whole body, then
  only ``n`` body bytes, then drops the connection (once per assignment);
- ``flip_byte[path] = i``: byte ``i`` of every body served for ``path`` is inverted;
- ``serve_instead[path] = bytes``: serve these bytes instead of the file;
- ``delay_s``: sleep this long before answering any request (a slow server);
- ``ignore_range``: answer every GET with the whole file (``200``), as servers without
  Range support do;
- ``status_for[path] = [code, ...]``: answer the next requests of ``path`` with these
  statuses, one per request;
- ``redirect[path] = url``: answer GET of ``path`` with ``302 Location: url`` (``""``: no
  Location header).
- ``drip_s[path] = s``: send the body of ``path`` one byte every ``s`` seconds (a server
  that stays just inside a client's read timeout); stops when the client hangs up.

Counters: ``body_bytes[path]`` (body bytes actually sent), ``requests`` (one dict per
request: method, path, range, authorization), ``puts`` (paths written).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.loopback import LoopbackServer


class FileServer(LoopbackServer):
    def __init__(self, root: Path, *, prefix: str = "/data"):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix.rstrip("/")
        self.cut_after: dict[str, int] = {}
        self.flip_byte: dict[str, int] = {}
        self.serve_instead: dict[str, bytes] = {}
        self.delay_s = 0.0
        self.ignore_range = False
        self.status_for: dict[str, list[int]] = {}
        self.redirect: dict[str, str] = {}
        self.drip_s: dict[str, float] = {}
        self.body_bytes: dict[str, int] = defaultdict(int)
        self.requests: list[dict] = []
        self.puts: list[str] = []
        self.lock = threading.Lock()
        self._serve(_make_handler(self))

    @property
    def url(self) -> str:
        return f"{self.origin}{self.prefix}"

    def gets(self, path: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == "GET" and r["path"] == path]


def _etag(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest() + '"'


def _make_handler(server: FileServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _rel(self) -> str | None:
            path = urlsplit(self.path).path
            if not path.startswith(server.prefix + "/"):
                return None
            return "/".join(unquote(s) for s in path[len(server.prefix) + 1 :].split("/"))

        def _file(self, rel: str) -> Path | None:
            target = (server.root / rel).resolve()
            if not str(target).startswith(str(server.root.resolve()) + os.sep):
                return None
            return target

        def _plain(self, status: int, text: str = "", headers: dict | None = None) -> None:
            body = text.encode()
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _record(self, rel) -> None:
            with server.lock:
                server.requests.append(
                    {
                        "method": self.command,
                        "path": rel,
                        "range": self.headers.get("Range"),
                        "authorization": self.headers.get("Authorization"),
                    }
                )
            if server.delay_s:
                time.sleep(server.delay_s)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            rel = self._rel()
            self._record(rel)
            file = self._file(rel) if rel is not None else None
            if server.status_for.get(rel):
                return self._plain(server.status_for[rel].pop(0), "injected")
            if rel in server.redirect:
                location = server.redirect[rel]
                return self._plain(302, "", {"Location": location} if location else {})
            if rel in server.serve_instead:
                data = server.serve_instead[rel]
            elif file is not None and file.is_file():
                data = file.read_bytes()
            else:
                return self._plain(404, "not found")
            if rel in server.flip_byte and server.flip_byte[rel] < len(data):
                i = server.flip_byte[rel]
                data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
            start, status = 0, 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and rng.endswith("-") and not server.ignore_range:
                start = int(rng[6:-1])
                if start >= len(data):
                    return self._plain(416, "", {"Content-Range": f"bytes */{len(data)}"})
                status = 206
            body = data[start:]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", _etag(data))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if self.command == "HEAD":
                return
            cut = server.cut_after.pop(rel, None) if self.command == "GET" else None
            if cut is not None and cut < len(body):
                with server.lock:  # counted before sending: the client may finish first
                    server.body_bytes[rel] += cut
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if rel in server.drip_s and self.command == "GET":
                for i in range(len(body)):
                    time.sleep(server.drip_s[rel])
                    try:
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                    except OSError:  # the client gave up
                        return
                    with server.lock:
                        server.body_bytes[rel] += 1
                return
            with server.lock:
                server.body_bytes[rel] += len(body)
            self.wfile.write(body)

        def do_PUT(self) -> None:
            rel = self._rel()
            self._record(rel)
            length = int(self.headers.get("Content-Length", "0"))
            data = self.rfile.read(length)
            file = self._file(rel) if rel is not None else None
            if file is None:
                return self._plain(403, "outside the root")
            with server.lock:
                current = file.read_bytes() if file.is_file() else None
                if_match = self.headers.get("If-Match")
                if if_match is not None and (current is None or _etag(current) != if_match):
                    return self._plain(412, "precondition failed")
                if self.headers.get("If-None-Match") == "*" and current is not None:
                    return self._plain(412, "exists")
                file.parent.mkdir(parents=True, exist_ok=True)
                tmp = file.with_name(f".{file.name}.upload-{threading.get_ident()}")
                tmp.write_bytes(data)
                os.replace(tmp, file)
                server.puts.append(rel)
            self._plain(201 if current is None else 200, "")

    return Handler
