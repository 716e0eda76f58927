"""What both DataModules share: the store, the split, the device, the policy and its state.

A DataModule is a store + an index policy of the sampling core + a batch layout. It reads
the store's columns and episode count when it is built (to check columns and the split at
the boundary) and, with ``resident="all"`` (the default), makes the columns it needs
resident on the training device once in :meth:`setup` (with a budget, see below).
Given a path, it opens the store only for those two moments; given an open
:class:`~torchstore.data.TrajectoryStore`, it uses it and leaves it open.

Rows are drawn on that device by the core's policies (:mod:`torchstore.samplers.draws`:
uniform over the training rows, ERE's newest ``c_k`` of them, or prioritized through a
:class:`~torchstore.samplers.PrioritizedSampler`) from the core's one Philox4x32-10 stream
(:class:`~torchstore.samplers.PhiloxStream`) keyed by ``seed`` whose sub-stream is the DDP
rank, so ranks never draw the same numbers, a run is reproducible whatever the number of
ranks, and the same seed gives the same rows as ``UniformSampler(seed=...)``,
``PrioritizedSampler(seed=...)`` and :func:`~torchstore.samplers.sample_into` over the same
rows.

A store larger than memory (``resident=`` rows or bytes): instead of loading the columns,
:meth:`setup` builds a :class:`~torchstore.window.block_window.BlockWindow` over the training
episodes and keeps the store open for it (:meth:`close` stops its thread and closes the
store). Rows are drawn by the refill schedule of :mod:`torchstore.samplers.refill` from the
same Philox stream; every row keeps the expected frequency of whole-store sampling, ranks
read disjoint blocks, and the window's schedule state is checkpointed with the stream.
``resident_blocks`` (default 4) is how many blocks are sampled from at once (one more slot
is read in the background); ``resident_reuse`` (default 1) is how many draws per row a
block gives per read (larger: fewer reads, the same expected frequencies). A budget
refuses ``ere`` and ``shard_episodes``; prioritized draws keep the bias documented in
:class:`~torchstore.window.block_window.BlockWindow` (a priority changed while its block
is away counts on the block's next turn).

Processes. A DataModule draws its batches in the process that trains (its window refills on
a thread of its own): it needs no ``DataLoader`` workers. One that crosses a process boundary
travels as its recipe: pickled (``strategy="ddp_spawn"``, a spawned worker) it is its
options and, once set up, its rank's position (stream, window schedule, priorities; a copy
with no trainer or process group of its own draws as that rank), and the other side opens
the store, its window and its threads itself; a forked copy's window
reads its blocks again on a thread of the child's own (see
:class:`~torchstore.window.block_window.BlockWindow`). Live slots, streams and threads are
never shared: a copy in each of ``n`` workers draws the batches the original would have
drawn next, so ``n`` workers hand out every batch ``n`` times.

Checkpoints. :meth:`state_dict` holds every rank's stream position (and sampler state,
such as priorities) gathered from all ranks, so that rank ``r`` of a resumed run takes
up exactly where rank ``r`` stopped. Under DDP it is a collective: Lightning calls it on
every rank when it saves a checkpoint, and so must any caller.
"""

from __future__ import annotations

import abc
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum, StrEnum
from typing import Any, TypeVar

import lightning.pytorch as pl
import torch
from tensordict import TensorDict
from torch import Tensor

from torchstore.data.columns import column_key, set_nested
from torchstore.data.file.layout import store_location
from torchstore.data.rows.packed import PackedColumns, tensordict_of
from torchstore.data.store.store import TrajectoryStore
from torchstore.data.store.store_set import open_store
from torchstore.errors import ResidencyError
from torchstore.io.frames.decode_device import check_decode_device
from torchstore.io.frames.resize import frame_resizes, is_camera_shape
from torchstore.lightning.augment import apply_augments, batch_augments
from torchstore.lightning.batches import (
    Batches,
    EvalBatches,
    gather_rank_states,
    rank_info,
    to_cpu,
)
from torchstore.lightning.split import EpisodeSplit, shard_episodes, split_episodes
from torchstore.samplers.draws import uniform_rows
from torchstore.samplers.ere import ERE
from torchstore.samplers.philox import PhiloxStream
from torchstore.samplers.prioritized import PrioritizedSampler
from torchstore.samplers.refill import parse_budget
from torchstore.samplers.windows import RowSet
from torchstore.validation import (
    int_at_least,
    int_in_range,
    non_negative_number,
    positive_number,
)
from torchstore.window.block_window import BlockWindow

__all__ = ["StoreDataModule", "Output", "SamplerKind"]

_STATE_FORMAT = 2
#: draws computed per Philox block (eager Philox costs about the same for 1 or 10^4 counters)
STREAM_BLOCK = 1 << 14
E = TypeVar("E", bound=Enum)


class SamplerKind(StrEnum):
    """How training rows are drawn."""

    UNIFORM = "uniform"
    PRIORITIZED = "prioritized"


class Output(StrEnum):
    """What a batch is: a ``TensorDict`` or a plain nested ``dict`` of tensors."""

    TENSORDICT = "tensordict"
    DICT = "dict"


def choice(enum: type[E], value: Any, name: str) -> E:
    """``value`` as a member of the closed set ``enum`` (a member or its string)."""
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum)
        raise ValueError(f"{name} ({value!r}) must be one of {allowed}") from None


def check_int(name: str, value: Any, minimum: int) -> int:
    return int_at_least(name, value, minimum)


def _in_process_group() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def _leaf_of(tree: dict, key: str | tuple[str, ...]) -> Any:
    """``tree[key]`` where a tuple key walks nested dicts."""
    for part in (key,) if isinstance(key, str) else key:
        tree = tree[part]
    return tree


def _check_device(device: Any) -> None:
    if device == "auto":
        return
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device ({device!r}) must be 'auto' or a torch device ({exc})") from None


class StoreDataModule(pl.LightningDataModule, abc.ABC):
    """Base of the DataModules over a trajectory store (see the module docstring).

    Subclasses name the columns they need (:meth:`_required_columns`), build their
    resident views in :meth:`_load`, and make batches in :meth:`_draw_train` and
    :meth:`_make_val` from the rows :meth:`_draw_rows` draws.
    """

    def __init__(
        self,
        store: str | os.PathLike | TrajectoryStore,
        *,
        batch_size: int,
        steps_per_epoch: int | None,
        device: str | torch.device,
        val_episodes: float | int | str,
        seed: int,
        shard_episodes: bool,
        output: str | Output,
        sampler: str | SamplerKind = "uniform",
        prioritized_alpha: float = 0.6,
        prioritized_beta: float = 0.4,
        ere: ERE | None = None,
        resident: int | str = "all",
        resident_blocks: int = 4,
        resident_reuse: float = 1.0,
        resize: Any = None,
        augment: Any = None,
        decode_device: str = "cpu",
    ):
        super().__init__()
        #: where video frames are decoded (``"cuda"``: the GPU's decoder, where there is one)
        self.decode_device = check_decode_device(decode_device)
        self.sampler = choice(SamplerKind, sampler, "sampler")
        self._set_residency(resident, resident_blocks, resident_reuse, ere, shard_episodes)
        #: the :class:`~torchstore.window.block_window.BlockWindow` sampled with a budget
        #: (else None)
        self.window: BlockWindow | None = None
        self.prioritized_alpha = float(non_negative_number("prioritized_alpha", prioritized_alpha))
        self.prioritized_beta = float(non_negative_number("prioritized_beta", prioritized_beta))
        if ere is not None and not isinstance(ere, ERE):
            raise TypeError(f"ere ({type(ere).__name__}) must be an ERE schedule or None")
        #: the ERE schedule (``None``: all training rows); call ``ere.set_progress(k, K)``
        self.ere = ere
        self.batch_size = check_int("batch_size", batch_size, 1)
        if steps_per_epoch is not None:
            check_int("steps_per_epoch", steps_per_epoch, 1)
        seed = int_in_range("seed", seed, 0, 2**63, high_text="2**63")
        _check_device(device)
        self.seed = seed
        if self.windowed and isinstance(val_episodes, str):
            raise ValueError(
                f"a named validation set (val_episodes={val_episodes!r}) is scattered over "
                f"the store; with resident={resident!r} use a count or a fraction"
            )
        self.val_episodes = val_episodes
        self.shard_episodes = bool(shard_episodes)
        self.output = choice(Output, output, "output")
        self.device_request = device
        if isinstance(store, TrajectoryStore):
            #: the caller's open store (used as it is, never closed here), or None
            self._store: TrajectoryStore | None = store
            self.store_path = store.path
        elif isinstance(store, (str, os.PathLike)):
            self._store = None
            self.store_path = store_location(store)  # a URL stays one (read in place)
        else:
            raise TypeError(
                f"store must be a path or a TrajectoryStore, got {type(store).__name__}"
            )
        with self._opened() as opened:
            if opened.num_episodes == 0:
                raise ValueError(f"store {self.store_path} holds no committed episodes")
            self.split: EpisodeSplit = split_episodes(
                opened.num_episodes, val_episodes, opened.manifest.metadata.get("episode_sets")
            )
            for name in self._required_columns():
                opened.column(name)  # ColumnError naming the columns there are
            shapes = {name: tuple(opened.column(name).shape) for name in self._read_columns(opened)}
            #: camera columns kept at training resolution: ``{column: FrameResize}``
            self.resize = frame_resizes(resize, shapes)
            #: per camera column, what augments it in training batches (``augment``)
            self.augments = batch_augments(
                augment, [name for name, shape in shapes.items() if is_camera_shape(shape)]
            )
            self._check_options(opened)
        self._steps_per_epoch = steps_per_epoch
        self._ready = False
        self._pending_state: dict[str, Any] | None = None
        self.rank, self.world_size = 0, 1

    @staticmethod
    def _shared_options(values: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of this constructor picked out of ``values``, a subclass
        constructor's ``locals()``: each DataModule names them in its own signature
        (documented there, checked against the Hydra configs) and forwards them in one
        line, ``super().__init__(store, **self._shared_options(locals()))``."""
        import inspect

        parameters = inspect.signature(StoreDataModule.__init__).parameters.values()
        return {p.name: values[p.name] for p in parameters if p.kind is p.KEYWORD_ONLY}

    def _set_residency(
        self,
        resident: int | str,
        resident_blocks: int,
        resident_reuse: float,
        ere: ERE | None,
        shard_episodes: bool,
    ) -> None:
        """Check and keep ``resident=``, ``resident_blocks=``, ``resident_reuse=``."""
        #: ``"all"``, or the budget of a store larger than memory (rows, or a size string)
        self.resident = resident
        self._budget = parse_budget(resident)
        self.windowed = self._budget[0] != "all"
        self.resident_blocks = check_int("resident_blocks", resident_blocks, 1)
        self.resident_reuse = float(
            positive_number("resident_reuse", resident_reuse, error=ResidencyError)
        )
        if self.windowed and ere is not None:
            raise ValueError(
                f"ere draws from the newest rows of the whole store; with resident={resident!r} "
                "only resident blocks can be drawn: use resident='all' with ere"
            )
        if self.windowed and shard_episodes:
            raise ValueError(
                f"with resident={resident!r} DDP ranks already read disjoint blocks of the "
                "store; drop shard_episodes"
            )

    # ------------------------------------------------------------ subclass hooks
    @abc.abstractmethod
    def _required_columns(self) -> list[str]:
        """Implemented by each DataModule."""

    def _read_columns(self, store: TrajectoryStore) -> list[str]:
        """The columns batches hold (what ``resize`` and ``augment`` may name)."""
        return self._required_columns()

    def _check_options(self, store: TrajectoryStore) -> None:
        """Validate subclass options against the open store (called from ``__init__``)."""

    @abc.abstractmethod
    def _load(self, store: TrajectoryStore, device: torch.device) -> None:
        """Implemented by each DataModule."""

    @abc.abstractmethod
    def _draw_train(self) -> Any:
        """Implemented by each DataModule."""

    @abc.abstractmethod
    def _make_val(self, i: int) -> Any:
        """Implemented by each DataModule."""

    def _train_units(self) -> int:
        """What one training pass covers, in draws (rows here; windows in window mode)."""
        return len(self.train_rows)

    # ------------------------------------------------------------ setup
    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch: as given, else one pass over the training rows (>= 1)."""
        if self._steps_per_epoch is not None:
            return self._steps_per_epoch
        self._ensure_ready()
        return max(1, self._train_units() // self.batch_size)

    def setup(self, stage: str | None = None) -> None:
        """Make the store resident on the training device (once; later calls do nothing).

        ``device="auto"`` takes the trainer's root device under a Trainer, else cuda when
        available, else cpu. The split is made over the episodes committed at this point.
        """
        if self._ready:
            return
        if "_recipe_names" not in self.__dict__:
            #: what this module holds before setup: its options (what it pickles as)
            self._recipe_names = frozenset(self.__dict__)
        trainer = getattr(self, "trainer", None)
        if self.device_request == "auto":
            if trainer is not None:
                device = trainer.strategy.root_device
            else:
                device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            device = torch.device(self.device_request)
        self.rank, self.world_size = rank_info(trainer)
        position = self.__dict__.pop("_pickled_position", None)
        if position is not None and trainer is None and not _in_process_group():
            # a copy in a worker process of the rank that pickled it draws as that rank
            self.rank, self.world_size = position["where"]
        with self._opened() as store:
            self.split = split_episodes(
                store.num_episodes, self.val_episodes, store.manifest.metadata.get("episode_sets")
            )
            train = self.split.train
            if self.shard_episodes:
                train = shard_episodes(train, self.rank, self.world_size)
            if not self.windowed:
                self._load(store, device)
            episodes = store.episodes.to(device)
        self.device = device
        self.num_rows = episodes.num_rows
        self.train_rows = RowSet.of_episodes(episodes, train)
        self.val_rows = RowSet.of_episodes(episodes, self.split.val)
        #: the core's Philox stream (key ``seed``, sub-stream the rank), computed in blocks
        self.philox = PhiloxStream(self.seed, self.rank, device, block=STREAM_BLOCK)
        self._setup_policy()
        if self.windowed:
            self._setup_window(device)
        self._after_load()
        self._ready = True
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self.load_state_dict(state)
        if position is not None and position["where"] == (self.rank, self.world_size):
            self.philox.seek(int(position["state"]["position"]))
            self._load_extra_state(position["state"])

    def _after_load(self) -> None:
        """Called at the end of setup, once rows, the stream and the policy exist."""

    # ------------------------------------------------------------ windowed residency
    def _window_columns(self) -> list[str]:
        """Columns the window holds (windowed mode)."""
        return self._required_columns()

    def _window_align(self) -> bool:
        """Whether blocks must hold whole episodes (windows or context steps need them)."""
        return False

    def _window_length(self) -> int | None:
        """Length of sequence windows drawn from the window, ``None`` for rows."""
        return None

    def _after_window(self, window: BlockWindow) -> None:
        """Called once the window exists (statistics, derived keys)."""

    def _setup_window(self, device: torch.device) -> None:
        """Open the store for the run and build the :class:`BlockWindow` over the training rows."""
        store = self._store if self._store is not None else open_store(self.store_path)
        self._window_store = store
        rows = self.train_rows
        self.window = BlockWindow(
            store,
            self._window_columns(),
            resize=self.resize or None,
            decode_device=self.decode_device,
            segments=(rows.start, rows.length, rows.episode),
            budget=self.resident,
            resident_blocks=self.resident_blocks,
            batch_size=self.batch_size,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
            device=device,
            align=self._window_align(),
            window=self._window_length(),
            priorities=None if self.priorities is None else self.priorities.tree,
            beta=self.prioritized_beta,
            reuse=self.resident_reuse,
        )
        self._after_window(self.window)

    def _val_packed(self, index: Tensor, packed: PackedColumns) -> tuple[PackedColumns, Tensor]:
        """``(packed, positions)`` to gather validation rows ``index`` from.

        Resident: ``packed`` itself. Windowed: the rows ``index`` spans, read now in one
        contiguous read per column (validation episodes are not in the window).
        """
        if self.window is None:
            return packed, index
        lo, hi = int(index.min()), int(index.max()) + 1
        return self.window.read_rows(lo, hi), index - lo

    def close(self) -> None:
        """Stop the window's refill thread and close the store it reads (windowed mode)."""
        if self.window is not None:
            self.window.close()
            self.window = None
            self._ready = False
        store = getattr(self, "_window_store", None)
        if store is not None and store is not self._store:
            store.close()
        self._window_store = None

    def _setup_policy(self) -> None:
        self.priorities: PrioritizedSampler | None = None
        if self.sampler is not SamplerKind.PRIORITIZED:
            return
        if self.ere is not None and self.train_rows.first_row is None:
            raise ValueError(
                "ere with sampler='prioritized' needs the training rows to be one contiguous "
                "block; drop shard_episodes or use sampler='uniform'"
            )
        rows = self.train_rows.rows(
            torch.arange(len(self.train_rows), dtype=torch.int64, device=self.device)
        )
        self._trainable = torch.zeros(self.num_rows, dtype=torch.bool, device=self.device)
        self._trainable[rows] = True
        self.priorities = PrioritizedSampler(
            max(self.num_rows, 1),
            alpha=self.prioritized_alpha,
            beta=self.prioritized_beta,
            device=self.device,
            philox=self.philox,
        )
        self.priorities.update_priority(rows, 1.0)

    def _draw_rows(
        self, n: int, *, segments: bool = False
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``n`` training rows by the policy: ``(row, segment or None, weight or None)``.

        ``segment`` (with ``segments=True``) indexes ``train_rows``' episodes; ``weight`` is
        the prioritized policy's importance weight.
        """
        rows = self.train_rows
        total = len(rows)
        if self.priorities is None:
            count = total if self.ere is None else int(self.ere.recent_count(total))
            g = uniform_rows(self.philox, n, count, start=total - count)
            if segments:
                row, seg = rows.locate(g)
                return row, seg, None
            # a new tensor even when row numbers are rows: ``g`` is a view of the stream's
            # cached block, which a caller editing the batch's index must not reach
            return rows.rows(g) if rows.first_row else g.clone(), None, None
        if self.ere is None:
            row, weight = self.priorities.draw(n)
        else:
            count = int(self.ere.recent_count(total))
            start = rows.first_row + total - count
            row, weight = self.priorities.draw(n, count=count, start=start)
        return row, rows.segment_of(row) if segments else None, weight

    # ------------------------------------------------------------ priorities
    def update_priority(self, index: Tensor, priority: Tensor | float) -> None:
        """Set raw priorities of training rows (``sampler="prioritized"`` only).

        Args:
            index: store rows, as a batch's ``"index"`` holds them.
            priority: one value or one per row; finite and ``>= 0`` (a TD error's size).

        Raises:
            RuntimeError: with ``sampler="uniform"``.
            ValueError: for rows outside this rank's training rows, or bad priorities.
        """
        if self.sampler is not SamplerKind.PRIORITIZED:
            raise RuntimeError(
                "update_priority needs sampler='prioritized'; this datamodule samples uniformly"
            )
        self._ensure_ready()
        index = torch.as_tensor(index, dtype=torch.int64, device=self.device).reshape(-1)
        if index.numel() and (
            int(index.min()) < 0
            or int(index.max()) >= self.num_rows
            or not bool(self._trainable[index].all())
        ):
            raise ValueError(
                "update_priority index holds rows outside this rank's training rows; pass the "
                "'index' of a training batch"
            )
        if isinstance(priority, Tensor):
            priority = priority.detach().to(self.device)
        self.priorities.update_priority(index, priority)
        if self.window is not None:
            self.window.refresh_priorities(index)

    def _extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.priorities is not None:
            priorities = self.priorities.state_dict()
            priorities.pop("philox", None)  # the stream is saved once, as "position"
            state["priorities"] = to_cpu(priorities)
        if self.ere is not None:
            state["ere"] = self.ere.state_dict()
        if self.window is not None:
            state["window"] = self.window.state_dict()
        return state

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        if self.ere is not None and "ere" in state:
            self.ere.load_state_dict(state["ere"])
        if self.priorities is not None:
            if "priorities" not in state:
                raise ValueError(
                    "the checkpoint holds no priorities; it was saved with sampler='uniform'"
                )
            self.priorities.load_state_dict(state["priorities"])
        if (self.window is None) != ("window" not in state):
            raise ValueError(
                "the checkpoint was saved with resident="
                f"{'a budget' if 'window' in state else 'all'}, this datamodule has "
                f"resident={self.resident!r}; resume with the same residency"
            )
        if self.window is not None:
            self.window.load_state_dict(state["window"])

    def _ensure_ready(self) -> None:
        if not self._ready:
            self.setup()

    @contextmanager
    def _opened(self) -> Iterator[TrajectoryStore]:
        """The caller's store, or the store at ``store_path`` opened for the block only.

        A store this module opens is never held open between calls: two open handles on
        one file in one process fail to read (HDF5), and a DataModule may wait long
        between construction and setup.
        """
        if self._store is not None:
            yield self._store
            return
        with open_store(self.store_path) as store:
            yield store

    def __getstate__(self) -> dict[str, Any]:
        """The recipe (see the module docstring): the options the module held before
        :meth:`setup` and, once set up, this rank's position, pickled here into bytes of
        their own. So nothing of this process's memory travels: a pickler that moves
        tensors into shared memory in place (``DataLoader`` workers') moves none of the
        batches' streams and slots, and none that is gone by the time a child starts."""
        names = self.__dict__.get("_recipe_names", self.__dict__.keys())
        live = ("trainer", "_store")  # the trainer attaches itself again (ddp_spawn does)
        state = {k: v for k, v in self.__dict__.items() if k in names and k not in live}
        state.update(_store=None, trainer=None, window=None, _ready=False)  # store: by path
        if self._ready:
            state["_pickled_position"] = {
                "where": (self.rank, self.world_size),
                "state": self._rank_state(),
            }
        return {"recipe": pickle.dumps(state)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(pickle.loads(state["recipe"]))

    # ------------------------------------------------------------ dataloaders
    def train_dataloader(self) -> Batches:
        """``steps_per_epoch`` batches per epoch, drawn on the device as they are asked for
        (augmented when ``augment`` says so)."""
        self._ensure_ready()
        return Batches(self._train_batch, self.steps_per_epoch)

    def _train_batch(self) -> Any:
        generator = self._augment_generator()
        batch = self._draw_train()
        if generator is not None:
            self._augment_batch(batch, generator)
        return batch

    def _augment_generator(self) -> torch.Generator | None:
        """A generator for one batch's augmentations, seeded from the seed, the rank and the
        stream position before the batch is drawn (a resumed run augments as the original
        did); None without augmentations."""
        if not self.augments:
            return None
        generator = torch.Generator(device=self.device)
        position = int(self.philox.position)
        generator.manual_seed(hash((self.seed, self.rank, position)) & (2**63 - 1))
        return generator

    def _batch_key(self, name: str) -> str | tuple[str, ...]:
        """Where column ``name`` lies in a batch."""
        return column_key(name)

    def _augment_batch(self, batch: Any, generator: torch.Generator) -> None:
        """Augment the camera columns of a drawn training batch in place."""
        for name, fns in self.augments.items():
            key = self._batch_key(name)
            if isinstance(batch, TensorDict):
                batch.set(key, apply_augments(fns, batch.get(key), generator))
            else:
                set_nested(batch, key, apply_augments(fns, _leaf_of(batch, key), generator))

    def val_dataloader(self) -> EvalBatches | list:
        """The validation rows in order, ``batch_size`` at a time (``[]`` without validation)."""
        self._ensure_ready()
        n = self._val_units()
        if n == 0:
            return []
        return EvalBatches(self._make_val, -(-n // self.batch_size))

    def _val_units(self) -> int:
        """What one validation pass covers (rows here; windows in window mode)."""
        return len(self.val_rows)

    def _val_numbers(self, i: int) -> torch.Tensor:
        stop = min((i + 1) * self.batch_size, self._val_units())
        return torch.arange(i * self.batch_size, stop, dtype=torch.int64, device=self.device)

    def _finish(self, leaves: dict, batch_size: int) -> TensorDict | dict:
        if self.output is Output.DICT:
            return leaves
        return tensordict_of(leaves, torch.Size([batch_size]), self.device)

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Every rank's sampler state (a collective under DDP; see the module docstring).

        Empty before :meth:`setup` (nothing has been drawn).
        """
        if not self._ready:
            return dict(self._pending_state or {})
        return {
            "format": _STATE_FORMAT,
            "seed": self.seed,
            "world_size": self.world_size,
            "ranks": gather_rank_states(self._rank_state()),
        }

    def _rank_state(self) -> dict[str, Any]:
        """This rank's part of :meth:`state_dict`: stream position and sampler state."""
        return {"rank": self.rank, "position": int(self.philox.position), **self._extra_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output: rank ``r`` takes rank ``r``'s state.

        Raises:
            ValueError: if the checkpoint was drawn with another seed or format, or holds
                per-rank sampler state (priorities) for a different number of ranks.
        """
        if not state_dict:
            return
        if state_dict.get("format") != _STATE_FORMAT:
            raise ValueError(
                f"datamodule state format ({state_dict.get('format')!r}) must be {_STATE_FORMAT}"
            )
        if state_dict["seed"] != self.seed:
            raise ValueError(
                f"the checkpoint's batches were drawn with seed {state_dict['seed']}, this "
                f"datamodule has seed {self.seed}; build it with the checkpoint's seed"
            )
        if not self._ready:
            self._pending_state = state_dict
            return
        ranks = state_dict["ranks"]
        if len(ranks) == self.world_size:
            mine = ranks[self.rank]
        elif (
            all(set(r) <= {"rank", "position", "ere"} for r in ranks)
            and len({r["position"] for r in ranks}) == 1
        ):
            mine = ranks[0]  # uniform streams stand at one position on every rank
        else:
            raise ValueError(
                f"the checkpoint holds per-rank sampler state for {len(ranks)} ranks, this run "
                f"has {self.world_size}; resume with the same number of ranks"
            )
        self.philox.seek(int(mine["position"]))
        self._load_extra_state(mine)
