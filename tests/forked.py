"""Run a function in a forked child with a deadline: a hang or a crash fails, never blocks."""

from __future__ import annotations

import os
import signal
import time
import traceback


def run_forked(fn, *args, timeout: float = 30.0) -> tuple[str, str]:
    """Returns ``("ok", "")``, ``("error", traceback)``, ``("crashed", signal)`` or
    ``("hung", "")``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        status, text = 0, b""
        try:
            fn(*args)
        except BaseException:
            status, text = 1, traceback.format_exc().encode()
        os.write(write_end, text[-8000:])
        os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            return "hung", ""
        time.sleep(0.005)
    with os.fdopen(read_end, "rb") as r:
        text = r.read().decode(errors="replace")
    if os.WIFSIGNALED(status):
        return "crashed", signal.Signals(os.WTERMSIG(status)).name
    return ("ok", "") if os.WEXITSTATUS(status) == 0 else ("error", text)


def exit_code_by(pid: int, deadline: float) -> int:
    """The exit code of child ``pid`` once it ends, or -9 once it is SIGKILLed at
    ``deadline`` (a ``time.monotonic()`` time) for not having ended."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9
