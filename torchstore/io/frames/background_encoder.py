"""Encode an episode's video on a worker thread, so a recording loop never waits on the codec.

A robot recorder calls ``add`` at the control rate (30 Hz and up) for every camera; encoding
a 640x480 AV1 frame inline takes about 30 ms on one core, a whole control period. Here
``add`` copies the frame into a bounded queue and returns; one thread per camera feeds
:class:`~torchstore.io.frames.video.EpisodeVideoEncoder` (PyAV releases the GIL while encoding).
The queue bound makes a recorder that outpaces the encoder wait instead of growing memory
without limit; ``close`` drains the queue and reports any encoder error.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

import numpy as np

from torchstore.errors import VideoError
from torchstore.io.frames.video import EncoderSettings, EpisodeVideoEncoder

__all__ = ["BackgroundVideoEncoder"]

_DONE = object()


class BackgroundVideoEncoder:
    """:class:`EpisodeVideoEncoder` behind a queue of at most ``max_pending`` frames.

    The encoder opens in the constructor (so bad settings fail at once); an error the
    worker meets is raised by the next ``add`` or by ``close``.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        fps: int,
        width: int,
        height: int,
        settings: EncoderSettings | None = None,
        max_pending: int = 64,
    ) -> None:
        self._encoder = EpisodeVideoEncoder(
            path, fps=fps, width=width, height=height, settings=settings
        )
        self.path = self._encoder.path
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._finished = False
        self._worker = threading.Thread(
            target=self._run, name=f"encode {self.path.name}", daemon=True
        )
        self._worker.start()

    def _run(self) -> None:
        while (frame := self._queue.get()) is not _DONE:
            if self._error is None:
                try:
                    self._encoder.add(frame)
                except BaseException as exc:  # reported to the recording thread
                    self._error = exc

    def _raise_error(self) -> None:
        if self._error is not None:
            error = self._error
            if isinstance(error, VideoError):
                raise error
            raise VideoError(f"{self.path}: encoding failed: {error}") from error

    def add(self, frame: Any) -> None:
        """Queue one uint8 ``[H, W, 3]`` frame (copied: the caller may reuse its buffer)."""
        if self._finished:
            raise VideoError(f"{self.path}: add() after close()")
        self._raise_error()
        frame = np.array(frame, copy=True)
        if frame.shape != (self._encoder.height, self._encoder.width, 3) or frame.dtype != np.uint8:
            raise VideoError(
                f"{self.path}: frames must be uint8 [{self._encoder.height}, "
                f"{self._encoder.width}, 3], got {frame.dtype} {list(frame.shape)}"
            )
        self._queue.put(frame)

    def _stop(self) -> None:
        if not self._finished:
            self._finished = True
            self._queue.put(_DONE)
            self._worker.join()

    def close(self) -> int:
        """Wait for every queued frame, close the file; returns the frames written."""
        self._stop()
        if self._error is not None:
            self._encoder.abort()
            self._raise_error()
        return self._encoder.close()

    def abort(self) -> None:
        """Stop encoding and delete the partial file."""
        self._stop()
        self._encoder.abort()
