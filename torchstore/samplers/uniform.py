"""Uniform index policy as a torchrl ``Sampler``, and the pieces every torchstore sampler shares.

What the samplers read from a storage (the ``StoreReplay`` ring and the read-only
``ResidentStorage`` of ``store.resident()`` provide it; plain torchrl storages provide the
first part):

- ``len(storage)``: valid rows, which are physical rows ``0 .. len - 1``;
- ``storage.capacity`` (falls back to torchrl's ``max_size``) and ``storage.cursor``, the
  row the next write goes to (falls back to ``len`` while not full, then to torchrl's
  ``_last_cursor_index + 1``, then to 0); only ERE and windows read the cursor;
- ``storage.device`` (``None`` or ``"auto"`` means CPU);
- ``storage.episode_segments()`` for windows (see :mod:`torchstore.samplers.sequence`).

Randomness: a sampler built with ``seed=`` draws from the sampling core's one Philox stream
(:class:`~torchstore.samplers.philox.PhiloxStream`; the same seed gives the same rows as
:func:`~torchstore.samplers.sample_into` and the Lightning DataModules). Otherwise it draws
from the generator the replay buffer set (``_rng``, which the buffer checkpoints itself),
else from its own ``generator`` (an int seeds a new one), else from torch's global
generator. The sampler's own stream or generator state is part of its ``state_dict``, so
sampling continues identically after a load.

Under ``torch.compile`` a sampler never recompiles as the buffer fills: a seeded draw reads
the fill level from the storage's device scalar (``fill_level``, when it has one), and a
draw from a torch generator runs outside the graph (``torch.compiler.disable``, as
torchrl's own samplers do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import Sampler

from torchstore.errors import EmptyStorageError
from torchstore.samplers.draws import uniform_rows
from torchstore.samplers.ere import ERE
from torchstore.samplers.philox import PhiloxStream
from torchstore.validation import int_in_range

__all__ = ["UniformSampler", "ring_geometry", "storage_device", "fill_count", "unravel_rows"]

_STATE_FILE = "sampler_state.pt"


def ring_geometry(storage: Any) -> tuple[int, int, int]:
    """``(rows, capacity, cursor)`` of a storage, with fallbacks for torchrl storages."""
    n = len(storage)
    capacity = ring_geometry_capacity(storage)
    cursor = getattr(storage, "cursor", None)
    if cursor is None:
        last = getattr(storage, "_last_cursor_index", None) if n >= capacity else None
        # A full torchrl storage whose last write is unknown (e.g. after load_state_dict)
        # is taken to have wrapped exactly: cursor 0.
        # torchrl's cursor counts time rows; with ndim > 1 a row holds the inner elements.
        width = _inner_numel(storage) if getattr(storage, "ndim", 1) > 1 else 1
        cursor = n if n < capacity else (0 if last is None else (int(last) + 1) * width)
    return n, capacity, int(cursor) % capacity


def _inner_numel(storage: Any) -> int:
    inner = 1
    for size in tuple(storage.shape)[1:]:
        inner *= int(size)
    return inner


def unravel_rows(storage: Any, index: Tensor) -> Tensor | tuple[Tensor, ...]:
    """Flat element indices as the storage's ``get`` takes them.

    A 1-D storage takes them as they are. An N-d one (torchrl's ``ndim=2`` multi-env
    layout, time-major) takes a tuple of per-dim indices, as torchrl's samplers return:
    ``(flat // n_envs, flat % n_envs)`` for two dims. Only the inner dims are read (fixed
    after the first write), so a compiled caller does not recompile as time rows fill.
    """
    if getattr(storage, "ndim", 1) <= 1:
        return index
    width = getattr(storage, "n_envs", None)
    inner = (int(width),) if width is not None else tuple(int(d) for d in storage.shape[1:])
    numel = 1
    for size in inner:
        numel *= size
    time = torch.div(index, numel, rounding_mode="floor")
    rest = index - time * numel
    if len(inner) == 1:
        return time, rest
    return (time, *torch.unravel_index(rest, inner))


def ring_geometry_capacity(storage: Any) -> int:
    """The ring's capacity (``storage.capacity``, else torchrl's ``max_size``)."""
    capacity = getattr(storage, "capacity", None)
    return int(storage.max_size if capacity is None else capacity)


def storage_device(storage: Any) -> torch.device:
    """The storage's device; ``None`` or ``"auto"`` read as CPU."""
    device = getattr(storage, "device", None)
    if type(device) is torch.device:
        return device
    if device is None or device == "auto":
        return torch.device("cpu")
    return torch.device(device)


def fill_count(storage: Any) -> Tensor | int:
    """The storage's row count: its device scalar ``fill_level`` when it has one, else ``len``.

    Under ``torch.compile`` the count is always a tensor (for a storage without a device
    scalar, made outside the graph), so the graph never holds the host value: no guard on
    it, no recompile as the buffer fills.
    """
    level = getattr(storage, "fill_level", None)
    if isinstance(level, Tensor):
        return level
    return _host_tensor(len(storage)) if _is_compiling() else len(storage)


def ring_tensors(storage: Any) -> tuple[Tensor, Tensor]:
    """``(rows, cursor)`` as 0-d int64 tensors (device scalars when the storage has them)."""
    level = getattr(storage, "fill_level", None)
    cursor = getattr(storage, "cursor_tensor", None)
    if isinstance(level, Tensor) and isinstance(cursor, Tensor):
        return level, cursor
    return _ring_host_tensors(storage)


@torch.compiler.disable
def _host_tensor(value: int) -> Tensor:
    return torch.tensor(value, dtype=torch.int64)


@torch.compiler.disable
def _ring_host_tensors(storage: Any) -> tuple[Tensor, Tensor]:
    n, _, cursor = ring_geometry(storage)
    return torch.tensor(n, dtype=torch.int64), torch.tensor(cursor, dtype=torch.int64)


def _is_compiling() -> bool:
    return torch.compiler.is_compiling()


def check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    return int_in_range("seed", seed, 0, 2**63, high_text="2**63")


class _SamplerCommon:
    """Generator, ERE and checkpoint plumbing shared by the torchstore samplers."""

    _rng: torch.Generator | None = None
    _generator: torch.Generator | None
    _ere: ERE | None
    #: the core's Philox stream when the sampler was built with ``seed=`` (else ``None``)
    philox: PhiloxStream | None = None
    _follow_stream_device = True

    def _init_stream(
        self, seed: int | None, stream: int = 0, device: torch.device | str | None = None
    ) -> None:
        seed = check_seed(seed)
        if seed is None:
            return
        self.philox = PhiloxStream(seed, stream, "cpu" if device is None else device)
        self._follow_stream_device = device is None

    def _follow_stream(self, storage: Any) -> PhiloxStream:
        philox = self.philox
        if self._follow_stream_device and not _is_compiling():
            device = storage_device(storage)
            if device != philox.device:
                philox.to(device)
        return philox

    def _init_common(self, generator: torch.Generator | int | None, ere: ERE | None) -> None:
        if isinstance(generator, bool) or not (
            generator is None or isinstance(generator, (int, torch.Generator))
        ):
            raise TypeError(
                f"generator must be a torch.Generator, an int seed or None, got {generator!r}"
            )
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        if ere is not None and not isinstance(ere, ERE):
            raise TypeError(f"ere must be an ERE schedule or None, got {type(ere).__name__}")
        self._generator = generator
        self._ere = ere

    @property
    def ere(self) -> ERE | None:
        """The ERE schedule, or ``None``; call ``sampler.ere.set_progress(k, K)`` per update."""
        return self._ere

    @property
    def generator(self) -> torch.Generator | None:
        """The generator draws come from: the buffer's when it set one, else the sampler's."""
        return self._rng if self._rng is not None else self._generator

    def _draw_device(self, device: torch.device) -> torch.device:
        gen = self.generator
        return gen.device if gen is not None else device

    def _recent_range(self, storage: Any) -> tuple[int, int, int]:
        """``(start, count, capacity)`` of the rows this draw may use (all, or ERE's newest)."""
        if self._ere is None:
            n = len(storage)
            return 0, n, n
        n, capacity, cursor = ring_geometry(storage)
        count = int(self._ere.recent_count(n))
        return (cursor - count) % capacity, count, capacity

    def _common_state(self) -> dict[str, Any]:
        gen = self._generator
        return {
            "philox": None if self.philox is None else self.philox.state_dict(),
            "ere": None if self._ere is None else self._ere.state_dict(),
            "generator": None if gen is None else gen.get_state().clone(),
            "generator_device": None if gen is None else str(gen.device),
        }

    def _load_common_state(self, state: dict[str, Any]) -> None:
        philox = state.get("philox")
        if philox is not None:
            if self.philox is None:
                raise ValueError(
                    f"the checkpoint was drawn from a Philox stream (seed {philox['seed']}); "
                    f"build the sampler with seed={philox['seed']} before loading it"
                )
            self.philox.load_state_dict(philox)
        ere = state.get("ere")
        if ere is None:
            self._ere = None
        elif self._ere is None:
            self._ere = ERE.from_state_dict(ere)
        else:
            self._ere.load_state_dict(ere)
        gen_state = state.get("generator")
        if gen_state is not None:
            if self._generator is None:
                self._generator = torch.Generator(device=state.get("generator_device") or "cpu")
            self._generator.set_state(gen_state)

    def dumps(self, path: str | Path) -> None:
        """Write ``state_dict()`` to ``path/sampler_state.pt`` (creating ``path``)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / _STATE_FILE)  # type: ignore[attr-defined]

    def loads(self, path: str | Path) -> None:
        """Read what :meth:`dumps` wrote and ``load_state_dict`` it.

        Raises:
            FileNotFoundError: if ``path`` holds no sampler state.
        """
        file = Path(path) / _STATE_FILE
        if not file.is_file():
            raise FileNotFoundError(f"no sampler state at {file}; was it written by dumps()?")
        self.load_state_dict(torch.load(file, weights_only=True))  # type: ignore[attr-defined]


class _ReplacementAlias(type(Sampler)):
    """Accept torchrl's ``replacement=`` spelling as ``with_replacement=``.

    torchrl's ``_SamplerMeta`` pops ``replacement=`` before ``__init__`` and, for a class it
    does not know, raises on ``replacement=False``; this maps the keyword first. It never
    returns a different class than the one called.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if "replacement" in kwargs:
            if "with_replacement" in kwargs:
                raise TypeError("pass either replacement= or with_replacement=, not both")
            kwargs["with_replacement"] = kwargs.pop("replacement")
        return super().__call__(*args, **kwargs)


class UniformSampler(_SamplerCommon, Sampler, metaclass=_ReplacementAlias):
    """Rows uniformly from ``[0, len)``, or from ERE's newest ``c_k`` rows.

    Args:
        with_replacement: ``False`` draws distinct rows within each batch (the batch may not
            exceed the sampleable rows). ``replacement=`` is accepted as an alias.
        generator: a ``torch.Generator`` or an int seed; the buffer's generator, when it
            set one, takes precedence.
        ere: an :class:`~torchstore.samplers.ERE` schedule restricting draws to the newest
            rows of the ring.
        seed: draw from the core's Philox stream with this key (same rows as
            ``sample_into`` and the DataModules with this seed); needs
            ``with_replacement=True``. The buffer's generator is then not used.
        stream: the Philox sub-stream (a rank or worker number), with ``seed``.
        device: where the Philox state lives; ``None`` follows the storage.

    Raises:
        ValueError: for ``seed`` without replacement, or a bad ``seed``/``stream``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=UniformSampler(generator=0))
        >>> _ = rb.extend(torch.arange(5))
        >>> rb.sample(3).shape
        torch.Size([3])
    """

    def __init__(
        self,
        *,
        with_replacement: bool = True,
        generator: torch.Generator | int | None = None,
        ere: ERE | None = None,
        seed: int | None = None,
        stream: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        self._init_common(generator, ere)
        self.with_replacement = bool(with_replacement)
        if seed is not None and not self.with_replacement:
            raise ValueError(
                "seed= draws rows with replacement from a Philox stream; sampling without "
                "replacement takes a generator= instead"
            )
        self._init_stream(seed, stream, device)

    def _sampleable_count(self, storage: Any, batch_size: int) -> int:
        return self._recent_range(storage)[1] if len(storage) else 0

    def sample(
        self, storage: Any, batch_size: int
    ) -> tuple[Tensor | tuple[Tensor, ...], dict[str, Any]]:
        """Draw ``batch_size`` row indices (per-dim index tuples on an N-d storage).

        Raises:
            EmptyStorageError: if the storage holds no rows.
            ValueError: without replacement, if ``batch_size`` exceeds the sampleable rows.
        """
        compiling = _is_compiling()
        n = None if compiling else len(storage)
        if n == 0:
            raise EmptyStorageError(
                "Cannot sample from an empty storage: UniformSampler needs at least one row"
            )
        if self.philox is not None:
            return unravel_rows(storage, self._sample_seeded(storage, batch_size)), {}
        if compiling:
            index = self._sample_generator(storage, batch_size)
        else:  # the same draw, without the compiler.disable wrapper's per-call work
            index = self._draw_generator(storage, batch_size, n)
        return unravel_rows(storage, index), {}

    def _sample_seeded(self, storage: Any, batch_size: int) -> Tensor:
        philox = self._follow_stream(storage)
        if self._ere is None:
            return uniform_rows(philox, batch_size, fill_count(storage))
        if _is_compiling():  # tensors only, so a growing ring never recompiles
            rows, cursor = ring_tensors(storage)
            count = self._ere.recent_count(rows.to(philox.device))
            capacity = ring_geometry_capacity(storage)
            start = (cursor.to(philox.device) - count) % capacity
            return uniform_rows(philox, batch_size, count, start=start, capacity=capacity)
        start, count, capacity = self._recent_range(storage)
        return uniform_rows(philox, batch_size, count, start=start, capacity=capacity)

    @torch.compiler.disable
    def _sample_generator(self, storage: Any, batch_size: int) -> Tensor:
        return self._draw_generator(storage, batch_size, None)

    def _draw_generator(self, storage: Any, batch_size: int, n: int | None) -> Tensor:
        """Draw from the torch generator; ``n`` is ``len(storage)`` when already read."""
        if self._ere is None and n is not None:
            start, count, capacity = 0, n, n
        else:
            start, count, capacity = self._recent_range(storage)
        device = storage_device(storage)
        draw_device = self._draw_device(device)
        if self.with_replacement:
            offset = torch.randint(
                count, (batch_size,), generator=self.generator, device=draw_device
            )
        else:
            if batch_size > count:
                raise ValueError(
                    f"batch_size ({batch_size}) must be <= the sampleable rows ({count}) when "
                    "sampling without replacement"
                )
            perm = torch.randperm(count, generator=self.generator, device=draw_device)
            offset = perm[:batch_size]
        index = offset if start == 0 else (offset + start) % capacity
        return index if index.is_cpu and device.type == "cpu" else index.to(device)

    def state_dict(self) -> dict[str, Any]:
        """Replacement flag, ERE schedule and own generator state."""
        return {"with_replacement": self.with_replacement, **self._common_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.with_replacement = bool(state_dict.get("with_replacement", True))
        self._load_common_state(state_dict)

    def _empty(self) -> None:
        return

    def __repr__(self) -> str:
        return (
            f"UniformSampler(with_replacement={self.with_replacement}, ere={self._ere}, "
            f"philox={self.philox})"
        )
