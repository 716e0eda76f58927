"""The plumbing every loopback test server shares: a threaded HTTP server on 127.0.0.1, a
port chosen by the OS, start/stop, and use as a context manager."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up early (refusing a body, a timeout) is expected in tests."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LoopbackServer:
    """Serves ``handler`` on 127.0.0.1 in a daemon thread until ``stop()``."""

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = _QuietServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def origin(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
