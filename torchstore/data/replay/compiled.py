"""The compile guard of :class:`~torchstore.data.replay.ring.StoreReplay`: ``_compile_disable``.

``torch.compile`` must not trace the ring's host-side bookkeeping (the episode index, the
shared lock, torchrl's index forms), so ``StoreReplay.__len__``
(:mod:`torchstore.data.replay.ring`), ``get`` (:mod:`torchstore.data.replay.reads`) and the eager
write behind ``set`` (:mod:`torchstore.data.replay.writes`) carry this decorator; the
graph-safe write, ``_set_traced``, does not. It sits in its own module because the mixin
modules apply it and cannot import :mod:`torchstore.data.replay.ring`, which imports them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.compiler import is_compiling

#: dynamo's frame callback getter (``None`` outside any compiled region), where torch has it
_frame_callback = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None), "get_eval_frame_callback", None
)


def _compile_disable() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``torch.compiler.disable()`` for a method that ``torch.compile`` must not trace, at
    no cost when nothing is compiling.

    The library wrapper enters dynamo's frame machinery on every call: about 1.2 us warm
    and 50 us with cold caches, which is what a training step leaves between two
    ``rb.sample()`` calls (``len`` and ``get`` run on every sample). Here a call made while
    no compiled region is running (no frame callback installed, the usual eager loop) runs
    the method itself; a traced call, or one from the eager part of a compiled region
    (where frames the method calls would otherwise be compiled), reaches the disabled
    version, as before.
    """

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        disabled = torch.compiler.disable(method)
        if _frame_callback is None:  # a torch without the probe: the library wrapper
            return disabled

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            if is_compiling() or _frame_callback() is not None:
                return disabled(*args, **kwargs)
            return method(*args, **kwargs)

        return call

    return decorate
