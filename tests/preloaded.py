"""Script runs forked from an interpreter that has already imported torch and Lightning.

A recipe's process spends about 5 s of a smoke-sized run importing torch, Lightning, Hydra
and matplotlib before its first line runs. Tests whose subject is what a run does (its
rollout, its answer to SIGINT or SIGTERM, a retrain on another machine) start it from this
preloaded interpreter instead. Each run is still a process of its own, with its own pid,
working directory, environment, ``sys.argv``, signal dispositions and output, running the
script as ``__main__`` the way ``python SCRIPT ARGS`` does. Tests whose subject is the
interpreter's start (import-time output, start-up cost, the console a terminal gets) keep
fresh interpreters.

Only third-party packages that read no test-set environment variable at import are
preloaded: the package itself and huggingface_hub (which fixes its cache folders at
import) are imported by each run, so a run's ``HF_HOME`` or ``TORCHSTORE_*`` is honoured.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PRELOAD = (
    "torch",
    "numpy",
    "h5py",
    "tensordict",
    "torchrl.data",
    "lightning.pytorch",
    "hydra",
    "hydra.utils",
    "omegaconf",
    "matplotlib.pyplot",
    "gymnasium",
    "safetensors.torch",
)

#: runs in the preloaded interpreter: reads one JSON job a line on stdin, forks a child for
#: each, prints ``started PID`` for it and ``exited PID CODE`` when it ends (CODE as
#: ``Popen.returncode`` gives it: negative for a signal)
SERVER = r"""
import atexit, importlib, json, os, runpy, selectors, signal, sys, threading, traceback

for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
assert "huggingface_hub" not in sys.modules, "preloading fixed huggingface_hub's cache paths"


def run(job):
    code = 1
    try:
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        script = job["argv"][0]
        sys.argv = list(job["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:  # as the interpreter does: end by the signal itself
            traceback.print_exc()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            traceback.print_exc()
        for thread in threading.enumerate():  # the interpreter's exit: threads, then atexit
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


print("ready", flush=True)
selector = selectors.DefaultSelector()
selector.register(0, selectors.EVENT_READ)
pending, live = b"", set()
while True:
    if selector.select(timeout=0.02):
        chunk = os.read(0, 65536)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = os.fork()
            if pid == 0:
                selector.close()
                run(json.loads(line))
            live.add(pid)
            print("started", pid, flush=True)
    for pid in list(live):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            live.discard(pid)
            print("exited", pid, os.waitstatus_to_exitcode(status), flush=True)
"""


class PreloadedInterpreter:
    """One server process; :meth:`popen` and :meth:`run` mirror ``subprocess``'s."""

    def __init__(self, folder: Path):
        self.folder = folder
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONWARNINGS")}
        self._server = subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(PRELOAD)],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the preloaded interpreter did not start ({self._server.wait()})")
        self._lock = threading.Lock()
        self._started: list[int] = []
        self._exited: dict[int, int] = {}
        self._changed = threading.Condition()
        self._count = 0
        self._follower = threading.Thread(target=self._follow, daemon=True)
        self._follower.start()

    def _follow(self) -> None:
        for line in self._server.stdout:
            word, pid, *code = line.split()
            with self._changed:
                if word == "started":
                    self._started.append(int(pid))
                else:
                    self._exited[int(pid)] = int(code[0])
                self._changed.notify_all()
        with self._changed:  # the server is gone: no run of it can end any more
            self._changed.notify_all()

    def popen(self, cmd: list[str], *, cwd: Path | str, env: dict[str, str]) -> PreloadedRun:
        """Start ``cmd`` (``[sys.executable, SCRIPT, *ARGS]``) in ``cwd`` with ``env``."""
        if cmd[0] != sys.executable:
            raise ValueError(f"runs Python scripts only, not {cmd[0]}")
        with self._lock:
            self._count += 1
            out = self.folder / f"run{self._count}.out"
            err = self.folder / f"run{self._count}.err"
            job = {
                "argv": [str(c) for c in cmd[1:]],
                "cwd": str(Path(cwd).resolve()),
                "env": dict(env),
                "stdout": str(out),
                "stderr": str(err),
            }
            with self._changed:
                self._server.stdin.write(json.dumps(job) + "\n")
                self._server.stdin.flush()
                self._changed.wait_for(lambda: self._started or self._server.poll() is not None)
                if not self._started:
                    raise RuntimeError("the preloaded interpreter ended")
                pid = self._started.pop(0)
        return PreloadedRun(self, pid, out, err)

    def run(
        self, cmd: list[str], *, cwd: Path | str, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """As ``subprocess.run(cmd, capture_output=True, text=True, timeout=...)``."""
        proc = self.popen(cmd, cwd=cwd, env=env)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def close(self) -> None:
        """End the server (its runs are the tests' to end); it holds nothing to save."""
        self._server.kill()
        self._server.wait()
        self._follower.join(timeout=10)
        self._server.stdin.close()
        self._server.stdout.close()


class PreloadedRun:
    """What a test uses of ``subprocess.Popen``: pid, poll, wait, signals, communicate."""

    def __init__(self, server: PreloadedInterpreter, pid: int, out: Path, err: Path):
        self._server, self.pid, self._out, self._err = server, pid, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self._server._changed:
            self.returncode = self._server._exited.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._server._changed:
            while self.pid not in self._server._exited:
                if self._server._server.poll() is not None:
                    raise RuntimeError("the preloaded interpreter ended before its run")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(str(self.pid), timeout)
                self._server._changed.wait(timeout=left)
            self.returncode = self._server._exited[self.pid]
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self._out.read_text(errors="replace"), self._err.read_text(errors="replace")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
