"""Philox4x32 counter-based random numbers as pure tensor code.

Philox4x32 (Salmon et al., SC'11; the Random123 library) maps a 128-bit counter and a 64-bit
key to 128 random bits with a fixed number of rounds of multiply, xor and key bumps. It has
no hidden state: the same (key, counter) always gives the same words, so a stream lives in
two small device tensors and advances by adding to the counter. That is what lets a device
sampler run inside ``torch.compile(fullgraph=True)`` and a captured CUDA graph.

Words are carried in ``int64`` tensors holding values in ``[0, 2**32)``. A 32 x 32-bit
product does not fit a signed int64 when both factors are ``>= 2**31``, so products are formed
from 16-bit halves (:func:`_mulhilo32`) and nothing ever overflows. Everything here is
branch-free tensor code: no ``.item()``, no data-dependent shapes.

Examples:
    >>> import torch
    >>> out = philox4x32(torch.zeros(4, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    >>> [f"{int(w):08x}" for w in out]
    ['6627e8d5', 'e169c58d', 'bc57ac4c', '9b00dbd8']
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from torchstore.validation import int_in_range, non_negative_int, positive_int

__all__ = [
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_W0",
    "PHILOX_W1",
    "philox4x32",
    "counters_from_offset",
    "uniform_from_words",
    "randint_below",
    "PhiloxStream",
    "cpu_kernels",
]

PHILOX_M0 = 0xD2511F53
"""Round multiplier applied to counter word 0."""
PHILOX_M1 = 0xCD9E8D57
"""Round multiplier applied to counter word 2."""
PHILOX_W0 = 0x9E3779B9
"""Key bump added to key word 0 before every round after the first (golden ratio)."""
PHILOX_W1 = 0xBB67AE85
"""Key bump added to key word 1 before every round after the first (sqrt(3) - 1)."""

_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF

#: whether CPU tensors take the compiled kernels (``TORCHSTORE_KERNELS=0`` turns them off)
KERNELS = os.environ.get("TORCHSTORE_KERNELS", "1") != "0"


def cpu_kernels(t: Tensor) -> ModuleType | None:
    """:mod:`torchstore.samplers.kernels` when ``t`` should take a compiled CPU kernel, else None.

    Kernels run for CPU tensors outside ``torch.compile`` tracing while :data:`KERNELS` is
    on; everything else (accelerators, compiled graphs) takes the tensor code. Imports the
    kernels (and numba) on first use only.
    """
    global _kernels
    if not KERNELS or not t.is_cpu or torch.compiler.is_compiling():
        return None
    if t.dtype in _HALF_DTYPES:  # numba has no bfloat16 and only partial float16
        return None
    if _kernels is None:
        from torchstore.samplers import kernels

        _kernels = kernels
    return _kernels


_kernels: ModuleType | None = None
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _as_words(x: Tensor) -> Tensor:
    """Return ``x`` as int64 holding uint32 values (uint32 and other int dtypes accepted)."""
    if x.dtype != torch.int64:
        x = x.to(torch.int64)
    return x & _MASK32


def _mulhilo32(a: Tensor | int, b: Tensor) -> tuple[Tensor, Tensor]:
    """Exact 32 x 32 -> 64-bit product, returned as (high 32 bits, low 32 bits).

    ``b`` is split into 16-bit halves so each partial product is below ``2**48``::

        a * b = a*bh * 2**16 + a*bl,   a*bh = q1 * 2**16 + q0
              = q1 * 2**32 + (q0 * 2**16 + a*bl)
    """
    bl = b & _MASK16
    bh = b >> 16
    p_lo = a * bl
    p_hi = a * bh
    s = ((p_hi & _MASK16) << 16) + p_lo
    hi = (p_hi >> 16) + (s >> 32)
    return hi, s & _MASK32


def philox4x32(counter: Tensor, key: Tensor, rounds: int = 10) -> Tensor:
    """Apply the Philox4x32 bijection.

    Args:
        counter: ``[..., 4]`` counter words (int64 holding uint32 values, or uint32).
        key: ``[..., 2]`` key words, broadcastable against ``counter[..., :2]``.
        rounds: number of rounds; 10 is the standard Philox4x32-10 (7 is the
            smallest variant Random123 publishes vectors for).

    Returns:
        ``[..., 4]`` int64 tensor of output words in ``[0, 2**32)``.

    Raises:
        ValueError: if the trailing dimensions are not 4 and 2, or ``rounds < 1``.
    """
    if counter.shape[-1:] != (4,):
        raise ValueError(f"counter must have a trailing dimension of 4, got {tuple(counter.shape)}")
    if key.shape[-1:] != (2,):
        raise ValueError(f"key must have a trailing dimension of 2, got {tuple(key.shape)}")
    positive_int("rounds", rounds)
    counter = _as_words(counter)
    key = _as_words(key)
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key.unbind(-1)
    for r in range(rounds):
        if r > 0:
            k0 = (k0 + PHILOX_W0) & _MASK32
            k1 = (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo32(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack(torch.broadcast_tensors(c0, c1, c2, c3), dim=-1)


def counters_from_offset(offset: Tensor, n: int, stream: Tensor | int = 0) -> Tensor:
    """Build ``n`` consecutive counters starting at a 64-bit ``offset``.

    Counter ``i`` is ``(lo32(offset + i), hi32(offset + i), lo32(stream), hi32(stream))``.
    ``offset`` may be a 0-d device tensor that the caller advances in place by ``n`` after
    each draw, so a compiled or graph-captured caller never leaves the device.

    Args:
        offset: 0-d int64 tensor (or int) with ``0 <= offset < 2**63 - n``.
        n: number of counters (static).
        stream: 0-d int64 tensor or int selecting an independent sub-stream.

    Returns:
        ``[n, 4]`` int64 counter words.
    """
    offset = torch.as_tensor(offset, dtype=torch.int64)
    stream = torch.as_tensor(stream, dtype=torch.int64, device=offset.device)
    pos = offset + torch.arange(n, dtype=torch.int64, device=offset.device)
    lo = pos & _MASK32
    hi = (pos >> 32) & _MASK32
    s_lo = (stream & _MASK32).expand(n)
    s_hi = ((stream >> 32) & _MASK32).expand(n)
    return torch.stack((lo, hi, s_lo, s_hi), dim=-1)


def uniform_from_words(words: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """Map Philox output words to floats in ``[0, 1)``.

    float64 takes the top 26 bits of word 0 and the top 27 bits of word 1 (53 bits, the
    full mantissa): ``u = (w0 >> 6) * 2**-26 + (w1 >> 5) * 2**-53``. float32 takes the top
    24 bits of word 0: ``u = (w0 >> 8) * 2**-24``. Both are exact multiples of the spacing,
    so ``u < 1`` always and every representable step is equally likely.

    Args:
        words: ``[..., k]`` int64 words with ``k >= 2`` (``k >= 1`` for float32).
        dtype: ``torch.float64`` or ``torch.float32``.

    Returns:
        ``[...]`` tensor of ``dtype``.

    Raises:
        ValueError: for any other dtype.
    """
    if dtype in (torch.float64, torch.float32) and words.ndim == 2:
        kernels = cpu_kernels(words)
        if kernels is not None:
            return kernels.uniform_words(words, dtype)
    if dtype == torch.float64:
        hi = (words[..., 0] & _MASK32) >> 6
        lo = (words[..., 1] & _MASK32) >> 5
        return ((hi << 27) + lo).to(torch.float64) * (2.0**-53)
    if dtype == torch.float32:
        top = (words[..., 0] & _MASK32) >> 8
        return top.to(torch.float32) * (2.0**-24)
    raise ValueError(f"dtype must be torch.float64 or torch.float32, got {dtype}")


def _host_int(n: Tensor | int) -> bool:
    return isinstance(n, int) or (n.device.type == "cpu" and n.numel() == 1)


def randint_below(words: Tensor, n: Tensor | int) -> Tensor:
    """Map two Philox words to integers in ``[0, n)`` by 64-bit multiply-shift (Lemire).

    With ``x = w0 * 2**32 + w1`` uniform on ``[0, 2**64)``, the result is
    ``floor(x * n / 2**64)``. Each outcome has ``floor(2**64 / n)`` or ``ceil(2**64 / n)``
    preimages, so its probability differs from ``1 / n`` by less than ``2**-64`` (relative
    bias below ``n / 2**64``, about 5e-13 for ``n = 10**7``). No rejection loop, so the
    shape and the control flow stay fixed. The 128-bit product is formed from exact 32-bit
    limbs; ``n`` may be a device tensor (``0 <= n < 2**62``); ``n == 0`` gives 0.

    Args:
        words: ``[..., k]`` int64 words, ``k >= 2``; words 0 and 1 are used.
        n: exclusive upper bound, a 0-d int64 tensor (or int) broadcastable to ``[...]``.

    Returns:
        ``[...]`` int64 tensor with values in ``[0, max(n, 1))``.
    """
    kernels = cpu_kernels(words)
    if kernels is not None and words.ndim == 2 and _host_int(n):
        return kernels.randint_words(words, int(n))
    x1 = words[..., 0] & _MASK32
    x0 = words[..., 1] & _MASK32
    n = torch.as_tensor(n, dtype=torch.int64, device=words.device)
    n1 = n >> 32
    n0 = n & _MASK32
    hi00, _ = _mulhilo32(x0, n0)
    hi01, lo01 = _mulhilo32(x0, n1)
    hi10, lo10 = _mulhilo32(x1, n0)
    mid = hi00 + lo01 + lo10  # < 3 * 2**32: fits
    # x1 * n1 < 2**32 * 2**30, so it is exact in int64 as is.
    return x1 * n1 + hi01 + hi10 + (mid >> 32)


class PhiloxStream:
    """The one Philox4x32-10 stream: key ``seed``, sub-stream ``stream``, a device position.

    Draw ``i`` is the Philox output for counter ``(lo32(i), hi32(i), lo32(stream),
    hi32(stream))`` (:func:`counters_from_offset`) under key ``(lo32(seed), hi32(seed))``;
    an integer below ``high`` is made from its words 0-1 by :func:`randint_below`, a float by
    :func:`uniform_from_words`. Every face of the sampling core (the torchrl samplers,
    :func:`~torchstore.samplers.sample_into`, the Lightning DataModules) draws this way, so
    one seed gives the same rows on all of them. ``stream`` (a rank or worker number)
    selects counters no other sub-stream ever uses.

    Two ways to compute the same draws:

    - ``block=0`` (the default): graph-safe. The position is a 0-d int64 device tensor that
      each draw advances in place; no host state changes between draws, so the same code
      runs eagerly, under ``torch.compile(fullgraph=True)`` and inside a captured CUDA graph,
      and each replay of a graph draws fresh numbers.
    - ``block=k`` (eager loops on the host's schedule): draws are computed ``k`` counters at
      a time (an eager Philox call is a few hundred small tensor operations, about a
      millisecond for any size up to a few thousand) and handed out in order; integers and
      floats made from a block are cached per bound. The position is counted on the host
      and written to the position tensor when the tensor is read, so a checkpoint holds
      the same numbers in both modes.

    Examples:
        >>> s = PhiloxStream(seed=7)
        >>> a = s.randint(4, torch.tensor(10))
        >>> int(s.position)
        4
        >>> b = PhiloxStream(seed=7, block=64)
        >>> torch.equal(b.randint(4, 10), a)
        True
    """

    def __init__(
        self,
        seed: int = 0,
        stream: int = 0,
        device: torch.device | str = "cpu",
        *,
        block: int = 0,
    ):
        seed = int_in_range("seed", seed, 0, 2**63, high_text="2**63")
        stream = int_in_range("stream", stream, 0, 2**63, high_text="2**63")
        block = non_negative_int("block", block)
        device = torch.device(device)
        self.seed = seed
        self.stream = stream
        self.block = block
        self.key = torch.tensor(
            [seed & _MASK32, (seed >> 32) & _MASK32], dtype=torch.int64, device=device
        )
        self.stream_id = torch.tensor(stream, dtype=torch.int64, device=device)
        self.position = torch.zeros((), dtype=torch.int64, device=device)
        self._forget_block()

    @property
    def position(self) -> Tensor:
        """The number of the next draw: a 0-d int64 tensor on the stream's device.

        Block mode counts draws on the host and writes the tensor here, when it is read: a
        ``fill_`` after every draw cost a few microseconds of a 256-row batch's 40."""
        if self._position_behind:
            self._position_behind = False
            self._position.fill_(self._host_position)
        return self._position

    @position.setter
    def position(self, value: Tensor) -> None:
        self._position = value
        self._position_behind = False

    def _forget_block(self) -> None:
        self._host_position: int | None = 0 if self.block else None
        self._block_start = 0
        self._block_end = -1  # the position after the block's last draw (none yet: -1)
        self._block_words: Tensor | None = None
        #: the block's words as a numpy array when a CPU kernel computed them
        self._block_array: Any = None
        self._derived: dict[Any, Tensor] = {}

    @property
    def device(self) -> torch.device:
        return self.key.device

    def __reduce__(self):
        """Pickled as its recipe (seed, sub-stream, device, block) and its position, never
        its live tensors: torch's worker pickler moves tensors into shared memory in place,
        which left a block's cached views of them dangling in the process that sent it."""
        state = (self.seed, self.stream, str(self.device), self.block, int(self.position))
        return (_stream_at, state)

    def to(self, device: torch.device | str) -> PhiloxStream:
        """Move the key and position (in place) to ``device``."""
        position = self.position  # synced
        self.key = self.key.to(device)
        self.stream_id = self.stream_id.to(device)
        self.position = position.to(device)
        self._block_words, self._block_array, self._derived = None, None, {}
        self._block_end = -1
        return self

    def seek(self, position: int) -> None:
        """Continue from draw ``position`` (``>= 0``)."""
        position = non_negative_int("position", position)
        self.position.fill_(position)
        if self.block:
            self._host_position = position

    def _span(self, n: int) -> slice:
        """Block mode: make sure draws ``[position, position + n)`` are computed; advance."""
        if self._host_position is None:  # a graph-safe draw moved the position: sync once
            self._host_position = int(self.position)
        pos = self._host_position
        lo = pos - self._block_start
        if lo < 0 or pos + n > self._block_end:
            size = max(n, self.block)
            self._block_words = words = self._compute(pos, size)
            self._block_array = words.numpy() if cpu_kernels(words) is not None else None
            self._block_start, self._block_end, self._derived, lo = pos, pos + size, {}, 0
        self._host_position = pos + n
        self._position_behind = True
        return slice(lo, lo + n)

    def block_words(self, n: int) -> tuple[Any, int]:
        """Block mode on the CPU (for a compiled kernel that reads the words itself): the
        words of the next ``n`` draws as ``(the block's [k, 4] int64 numpy array, the row
        of the first draw)``; the position advances by ``n``."""
        if not self.block or not self.key.is_cpu:
            raise ValueError("block_words needs a CPU stream in block mode (block > 0)")
        span = self._span(n)
        if self._block_array is None:  # the block was computed while tracing
            self._block_array = self._block_words.numpy()
        return self._block_array, span.start

    def _compute(self, position: int, n: int) -> Tensor:
        """Words of draws ``position .. position + n - 1`` (eager; a CPU kernel when it can)."""
        kernels = cpu_kernels(self.key)
        if kernels is not None:
            return kernels.philox_words(self.key, self.stream, position, n)
        offset = torch.tensor(position, dtype=torch.int64, device=self.device)
        return philox4x32(counters_from_offset(offset, n, self.stream_id), self.key)

    def words(self, n: int) -> Tensor:
        """``[n, 4]`` fresh words; advances the position by ``n``."""
        if self.block:
            return self._block_words[self._span(n)]
        if cpu_kernels(self.key) is not None:
            out = self._compute(int(self.position), n)
        else:
            out = philox4x32(counters_from_offset(self.position, n, self.stream_id), self.key)
        self.position.add_(n)
        return out

    def uniform(self, n: int, dtype: torch.dtype = torch.float64) -> Tensor:
        """``n`` floats in ``[0, 1)`` (see :func:`uniform_from_words`)."""
        if self.block:
            span = self._span(n)
            key = ("uniform", dtype)
            if key not in self._derived:
                self._derived[key] = uniform_from_words(self._block_words, dtype)
            return self._derived[key][span]
        return uniform_from_words(self.words(n), dtype)

    def randint(self, n: int, high: Tensor | int, offset: int = 0) -> Tensor:
        """``n`` integers in ``[offset, offset + high)``, a new tensor; ``high`` may be a
        device tensor (see :func:`randint_below`)."""
        if self.block and isinstance(high, int):
            kernels = None if self._block_array is None else cpu_kernels(self.key)
            if kernels is not None:
                first = self._span(n).start
                return kernels.randint_rows(self._block_array, first, n, high, offset)
            draws = self.randint_view(n, high)
            return draws + offset if offset else draws.clone()
        draws = randint_below(self.words(n), high)
        return draws + offset if offset else draws

    def randint_view(self, n: int, high: int) -> Tensor:
        """Block mode: :meth:`randint`'s draws as a view of the block's cached integers
        below ``high`` (made once per block and bound; read it, do not edit it). A caller
        that maps draws ahead reads the block's next draws through the view's ``_base``
        (the window's run lookup does)."""
        if not self.block:
            raise ValueError("randint_view needs a stream in block mode (block > 0)")
        span = self._span(n)
        key = ("int", high)
        if key not in self._derived:
            self._derived[key] = randint_below(self._block_words, high)
        return self._derived[key][span]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "stream": self.stream, "position": self.position.clone()}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["stream"]) != (self.seed, self.stream):
            raise ValueError(
                f"Philox stream (seed {state['seed']}, stream {state['stream']}) does not match "
                f"this one (seed {self.seed}, stream {self.stream})"
            )
        self.seek(int(torch.as_tensor(state["position"])))

    def __repr__(self) -> str:
        return (
            f"PhiloxStream(seed={self.seed}, stream={self.stream}, device={self.device}, "
            f"block={self.block})"
        )


def _stream_at(seed: int, stream: int, device: str, block: int, position: int) -> PhiloxStream:
    """A :class:`PhiloxStream` at draw ``position``: what a pickled one becomes."""
    out = PhiloxStream(seed, stream, device, block=block)
    out.seek(position)
    return out
