"""Uniform index policy as a torchrl ``Sampler``, and the pieces every torchstore sampler shares.

What the samplers read from a storage (the lead's ``StoreReplay`` ring and the read-only
``ResidentStore`` provide it; plain torchrl storages provide the first part):

- ``len(storage)``: valid rows, which are physical rows ``0 .. len - 1``;
- ``storage.capacity`` (falls back to torchrl's ``max_size``) and ``storage.cursor``, the
  row the next write goes to (falls back to ``len`` while not full, then to torchrl's
  ``_last_cursor_index + 1``, then to 0); only ERE and windows read the cursor;
- ``storage.device`` (``None`` or ``"auto"`` means CPU);
- ``storage.episode_segments()`` for windows (see :mod:`torchstore.samplers.sequence`).

Randomness: a sampler draws from the generator the replay buffer set (``_rng``, which the
buffer checkpoints itself), else from its own ``generator`` (an int seeds a new one), else
from torch's global generator. The sampler's own generator state is part of its
``state_dict``, so sampling continues identically after a load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import Sampler

from torchstore.errors import EmptyStorageError
from torchstore.samplers.ere import ERE

__all__ = ["UniformSampler", "ring_geometry"]

_STATE_FILE = "sampler_state.pt"


def ring_geometry(storage: Any) -> tuple[int, int, int]:
    """``(rows, capacity, cursor)`` of a storage, with fallbacks for torchrl storages."""
    n = len(storage)
    capacity = getattr(storage, "capacity", None)
    if capacity is None:
        capacity = storage.max_size
    capacity = int(capacity)
    cursor = getattr(storage, "cursor", None)
    if cursor is None:
        last = getattr(storage, "_last_cursor_index", None) if n >= capacity else None
        # A full torchrl storage whose last write is unknown (e.g. after load_state_dict)
        # is taken to have wrapped exactly: cursor 0.
        cursor = n if n < capacity else (0 if last is None else int(last) + 1)
    return n, capacity, int(cursor) % capacity


def storage_device(storage: Any) -> torch.device:
    """The storage's device; ``None`` or ``"auto"`` read as CPU."""
    device = getattr(storage, "device", None)
    if device is None or device == "auto":
        return torch.device("cpu")
    return torch.device(device)


class _SamplerCommon:
    """Generator, ERE and checkpoint plumbing shared by the torchstore samplers."""

    _rng: torch.Generator | None = None
    _generator: torch.Generator | None
    _ere: ERE | None

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
            "ere": None if self._ere is None else self._ere.state_dict(),
            "generator": None if gen is None else gen.get_state().clone(),
            "generator_device": None if gen is None else str(gen.device),
        }

    def _load_common_state(self, state: dict[str, Any]) -> None:
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
    ) -> None:
        self._init_common(generator, ere)
        self.with_replacement = bool(with_replacement)

    def _sampleable_count(self, storage: Any, batch_size: int) -> int:
        return self._recent_range(storage)[1] if len(storage) else 0

    def sample(self, storage: Any, batch_size: int) -> tuple[Tensor, dict[str, Any]]:
        """Draw ``batch_size`` row indices.

        Raises:
            EmptyStorageError: if the storage holds no rows.
            ValueError: without replacement, if ``batch_size`` exceeds the sampleable rows.
        """
        if len(storage) == 0:
            raise EmptyStorageError(
                "Cannot sample from an empty storage: UniformSampler needs at least one row"
            )
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
        return index.to(device), {}

    def state_dict(self) -> dict[str, Any]:
        """Replacement flag, ERE schedule and own generator state."""
        return {"with_replacement": self.with_replacement, **self._common_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.with_replacement = bool(state_dict["with_replacement"])
        self._load_common_state(state_dict)

    def _empty(self) -> None:
        return

    def __repr__(self) -> str:
        return f"UniformSampler(with_replacement={self.with_replacement}, ere={self._ere})"
