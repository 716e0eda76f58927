"""Plots of a store and of a training run, as PNG files (matplotlib, Agg, no display needed).

``plot_store`` is what ``torchstore viz STORE [--out DIR]`` writes, into ``DIR`` or, by
default, into a folder next to the store named for it (``runs/reach.h5`` ->
``runs/reach_viz/``; :func:`default_out`):

- ``episode_lengths.png``: histogram of episode lengths;
- ``traces.png``: every scalar and vector column over the first few episodes, one panel
  per column, episode boundaries marked;
- ``frames_<column>.png``: a grid of frames for each image column (per-row shape
  ``[H, W, C]`` with ``C`` in 1, 3 or 4).

``plot_metrics`` draws the loss curves of a recipe's ``metrics.csv``.

matplotlib comes with the ``train`` extra: ``pip install -e ".[train]"``.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from torchstore.data.columns import ColumnSpec
from torchstore.data.store.store import TrajectoryStore
from torchstore.extras import install_hint
from torchstore.validation import positive_int

__all__ = [
    "default_out",
    "plot_store",
    "plot_lerobot",
    "plot_episode_lengths",
    "plot_traces",
    "plot_frames",
    "plot_metrics",
    "image_columns",
]

_MAX_COMPONENTS = 8
_DPI = 110


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"torchstore.viz needs matplotlib: {install_hint('train')}") from exc
    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)  # a bare Figure renders with the Agg canvas: no pyplot, no global state
    return path


def _is_image(spec: ColumnSpec) -> bool:
    return len(spec.shape) == 3 and spec.shape[-1] in (1, 3, 4) and min(spec.shape[:2]) >= 4


def image_columns(columns: Sequence[ColumnSpec]) -> list[ColumnSpec]:
    """Columns whose per-row shape is an ``[H, W, C]`` image with ``C`` in 1, 3 or 4."""
    return [c for c in columns if _is_image(c)]


def _trace_columns(columns: Sequence[ColumnSpec]) -> list[ColumnSpec]:
    return [c for c in columns if len(c.shape) <= 1]


def plot_episode_lengths(store: TrajectoryStore, path: str | os.PathLike) -> Path:
    """Histogram of episode lengths, with count, mean and range in the title."""
    return _draw_lengths(store.episodes.lengths.numpy(), Path(path))


def _draw_lengths(lengths: np.ndarray, path: Path) -> Path:
    fig = _figure(6.0, 3.6)
    ax = fig.add_subplot()
    if len(lengths):
        lo, hi = int(lengths.min()), int(lengths.max())
        bins = np.arange(lo, hi + 2) - 0.5 if hi - lo < 60 else 40
        ax.hist(lengths, bins=bins, color="#3b6fb6", edgecolor="white")
        pad = max(2.0, 0.05 * (hi - lo)) + 0.5
        ax.set_xlim(lo - pad, hi + pad)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(
            f"{len(lengths)} episodes, {int(lengths.sum()):,} rows: "
            f"length mean {lengths.mean():.1f}, min {lo}, max {hi}"
        )
    else:
        ax.set_title("no episodes")
    ax.set_xlabel("episode length (rows)")
    ax.set_ylabel("episodes")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_traces(
    store: TrajectoryStore,
    path: str | os.PathLike,
    *,
    episodes: int = 3,
    columns: Sequence[str] | None = None,
) -> Path | None:
    """Scalar and vector columns over the first ``episodes`` episodes, one panel per column.

    The episodes are drawn one after the other along the x axis (dashed lines at the
    boundaries); a vector column draws its first 8 components in different colours.
    Returns ``None`` when the store has no such column.
    """
    specs = _trace_columns(store.columns if columns is None else [store.column(c) for c in columns])
    n_ep = min(episodes, store.num_episodes)
    if not specs or n_ep == 0:
        return None
    start = int(store.episodes.offsets[0])
    stop = int(store.episodes.offsets[n_ep - 1] + store.episodes.lengths[n_ep - 1])
    slab = store.read_slab(start, stop, [s.name for s in specs])
    series = [
        (
            spec.name,
            slab.get(spec.key).to(torch.float32).reshape(stop - start, -1).numpy(),
            spec.dtype == torch.bool,
        )
        for spec in specs
    ]
    lengths = store.episodes.lengths[:n_ep].numpy()
    return _draw_traces(
        series, lengths, f"{store.path.name}: columns over {n_ep} episode(s)", Path(path)
    )


def _draw_traces(
    series: Sequence[tuple[str, np.ndarray, bool]], lengths: np.ndarray, title: str, path: Path
) -> Path:
    """One panel per ``(name, values [rows, k], is_bool)``; episodes of ``lengths`` in a row."""
    n_ep = len(lengths)
    bounds = np.cumsum(lengths)[:-1]
    fig = _figure(9.0, 1.6 + 1.55 * len(series))
    axes = fig.subplots(len(series), 1, sharex=True, squeeze=False)[:, 0]
    x = np.arange(int(np.sum(lengths)))
    for ax, (name, values, is_bool) in zip(axes, series):
        shown = values[:, :_MAX_COMPONENTS]
        draw = ax.step if is_bool else ax.plot
        for j in range(shown.shape[1]):
            label = f"[{j}]" if values.shape[1] > 1 else None
            kwargs = {"where": "post"} if is_bool else {}
            draw(x, shown[:, j], lw=1.2, label=label, **kwargs)
        for b in bounds:
            ax.axvline(b - 0.5, color="0.4", ls="--", lw=0.8)
        more = (
            f" (first {_MAX_COMPONENTS} of {values.shape[1]})"
            if values.shape[1] > _MAX_COMPONENTS
            else ""
        )
        ax.set_ylabel(name + more, rotation=0, ha="right", va="center")
        if 1 < shown.shape[1] <= _MAX_COMPONENTS:
            ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(f"row within the first {n_ep} episode(s); dashed lines separate episodes")
    fig.suptitle(title)
    return _save(fig, path)


def _to_display(frames: np.ndarray, spec: ColumnSpec) -> np.ndarray:
    """Frames as floats in [0, 1] for imshow (quantisation range, uint8 or min-max)."""
    if spec.quantize is not None:
        q = spec.quantize
        out = (frames - q.low) / (q.high - q.low)
    elif frames.dtype == np.uint8:
        out = frames / 255.0
    else:
        lo, hi = float(frames.min()), float(frames.max())
        out = (frames - lo) / (hi - lo) if hi > lo else np.zeros_like(frames)
    return np.clip(out, 0.0, 1.0)


def plot_frames(
    store: TrajectoryStore,
    column: str,
    path: str | os.PathLike,
    *,
    episodes: int = 3,
    per_episode: int = 8,
) -> Path:
    """A grid of frames of an image column: one row per episode, evenly spaced steps."""
    spec = store.column(column)
    if not _is_image(spec):
        raise ValueError(
            f"column '{column}' has per-row shape {list(spec.shape)}; "
            "frames need [H, W, C] with C in 1, 3 or 4"
        )
    n_ep = min(episodes, store.num_episodes)
    if n_ep == 0:
        raise ValueError(f"{store.path} has no episodes to draw frames from")
    cols = max(1, per_episode)
    fig = _figure(1.25 * cols + 0.6, 1.45 * n_ep + 0.5)
    axes = fig.subplots(n_ep, cols, squeeze=False)
    for e in range(n_ep):
        start, stop = store.episodes.range(e)
        steps = np.unique(
            np.linspace(0, stop - start - 1, num=min(cols, stop - start)).round().astype(int)
        )
        frames = store.read_slab(start, stop, [column]).get(spec.key).numpy()[steps]
        frames = _to_display(frames, spec)
        for j, ax in enumerate(axes[e]):
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(steps):
                ax.axis("off")
                continue
            image = frames[j][..., 0] if spec.shape[-1] == 1 else frames[j]
            ax.imshow(
                image,
                cmap="gray" if spec.shape[-1] == 1 else None,
                vmin=0.0,
                vmax=1.0,
                interpolation="nearest",
            )
            ax.set_title(f"t={steps[j]}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"episode {e}", fontsize=8)
    fig.suptitle(f"{store.path.name}: '{column}' frames")
    return _save(fig, Path(path))


def _check_plot_args(out: Path, episodes: object) -> None:
    positive_int("episodes", episodes, hint="; nothing was drawn")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out ({out}) is a file; plots are written into a folder")


def default_out(store: TrajectoryStore | str | os.PathLike) -> Path:
    """Where :func:`plot_store` writes when not told: ``<name>_viz`` next to the store,
    ``<name>`` being the store file's name without its suffix (a folder's whole name).

    Examples:
        >>> default_out("runs/reach.h5")
        PosixPath('runs/reach_viz')
    """
    path = Path(store.path if isinstance(store, TrajectoryStore) else store)
    if not path.name:  # "." or "..": name the folder it stands for
        path = path.resolve()
    name = path.name if path.is_dir() else path.stem
    return path.parent / f"{name}_viz"


def plot_store(
    store: TrajectoryStore | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    episodes: int = 3,
    columns: Sequence[str] | None = None,
) -> list[Path]:
    """Write every plot of a store into folder ``out``; returns the files written.

    ``store`` may also be a LeRobot dataset folder (see :func:`plot_lerobot`). ``out``
    defaults to :func:`default_out` (``<store name>_viz`` next to the store). Arguments
    are checked before anything is drawn: a bad one writes no file.

    Examples:
        >>> plot_store("data/reach_demo.h5")  # doctest: +SKIP
        [PosixPath('data/reach_demo_viz/episode_lengths.png'), ...]
    """
    out = default_out(store) if out is None else Path(out)
    _check_plot_args(out, episodes)
    if not isinstance(store, TrajectoryStore) and Path(store).is_dir():
        if not (Path(store) / "meta" / "info.json").is_file():
            raise ValueError(
                f"{store} is a folder but not a LeRobot dataset (no meta/info.json); viz draws "
                "store files and LeRobot folders (Minari folders are not supported by viz yet)"
            )
        return plot_lerobot(store, out, episodes=episodes, columns=columns)
    owned = not isinstance(store, TrajectoryStore)
    if owned:
        store = TrajectoryStore(store)
    try:
        specs = store.columns if columns is None else [store.column(c) for c in columns]
        _figure(1.0, 1.0)  # matplotlib missing: say so before any file is written
        written = [plot_episode_lengths(store, out / "episode_lengths.png")]
        traces = plot_traces(
            store, out / "traces.png", episodes=episodes, columns=[s.name for s in specs]
        )
        if traces is not None:
            written.append(traces)
        for spec in image_columns(specs):
            if store.num_episodes:
                name = spec.name.replace("/", "_")
                written.append(
                    plot_frames(store, spec.name, out / f"frames_{name}.png", episodes=episodes)
                )
        return written
    finally:
        if owned:
            store.close()


def plot_lerobot(
    root: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    episodes: int = 3,
    columns: Sequence[str] | None = None,
) -> list[Path]:
    """Plot a LeRobot dataset folder read-only: episode lengths and numeric feature traces.

    Camera features are not decoded; ``torchstore import`` and :func:`plot_store` draw them.
    """
    from torchstore.lerobot import LeRobotSource

    out = default_out(root) if out is None else Path(out)
    _check_plot_args(out, episodes)
    with LeRobotSource(root) as source:
        numeric = [
            f
            for f in source.features.values()
            if f.dtype not in ("image", "video", "string", "language") and len(f.shape) <= 1
        ]
        if columns is not None:
            unknown = sorted(set(columns) - set(source.features))
            if unknown:
                raise ValueError(
                    f"{root} has no features {unknown}; it has {list(source.features)}"
                )
            numeric = [f for f in numeric if f.name in columns]
        _figure(1.0, 1.0)
        lengths = np.asarray([e.length for e in source.episodes], dtype=np.int64)
        written = [_draw_lengths(lengths, out / "episode_lengths.png")]
        shown = source.episodes[:episodes]
        if numeric and shown:
            names = [f.name for f in numeric]
            parts = [source.read_episode(e, names) for e in shown]
            series = [
                (
                    f.name,
                    np.concatenate([p[f.name] for p in parts])
                    .astype(np.float32)
                    .reshape(sum(e.length for e in shown), -1),
                    f.dtype == "bool",
                )
                for f in numeric
            ]
            title = f"{Path(root).name}: features over {len(shown)} episode(s)"
            written.append(
                _draw_traces(
                    series, np.asarray([e.length for e in shown]), title, out / "traces.png"
                )
            )
        return written


def _read_metrics(path: Path) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = row.get("step", "")
            if step in ("", None):
                continue
            for key, value in row.items():
                if key == "step" or value in ("", None):
                    continue
                try:
                    series.setdefault(key, []).append((float(step), float(value)))
                except ValueError:
                    continue
    return series


def plot_metrics(
    csv_path: str | os.PathLike, path: str | os.PathLike, *, keys: Sequence[str] | None = None
) -> Path:
    """Curves of a ``metrics.csv`` (a ``step`` column plus one column per metric), one panel each.

    Losses come first (log scale when positive and spanning more than 20x); a long, noisy
    series is drawn faint with a moving average on top; metrics logged once (final
    evaluations) share one bar panel with their values. ``keys`` picks the metrics.
    """
    series = _read_metrics(Path(csv_path))
    series.pop("time_s", None)
    if keys is not None:
        series = {k: v for k, v in series.items() if k in keys}
    curves = sorted((k for k in series if len(series[k]) > 1), key=lambda k: "loss" not in k)
    finals = {k: series[k][0][1] for k in series if len(series[k]) == 1}
    panels = len(curves) + bool(finals)
    ncols = min(3, max(1, panels))
    nrows = max(1, math.ceil(panels / ncols))
    fig = _figure(4.2 * ncols, 2.9 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).reshape(-1)
    for ax, key in zip(axes, curves):
        steps, values = np.array(series[key], dtype=np.float64).T
        noisy = len(values) > 20
        ax.plot(
            steps,
            values,
            lw=0.8,
            color="#3b6fb6",
            alpha=0.35 if noisy else 1.0,
            marker=None if noisy else "o",
            ms=3,
        )
        if noisy:
            width = max(2, len(values) // 25)
            smooth = np.convolve(values, np.ones(width) / width, mode="valid")
            ax.plot(steps[width - 1 :], smooth, lw=1.8, color="#3b6fb6")
        if "loss" in key and np.all(values > 0) and values.max() / max(values.min(), 1e-12) > 20:
            ax.set_yscale("log")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if finals:
        ax = axes[len(curves)]
        names = list(finals)[::-1]
        values = [finals[k] for k in names]
        bars = ax.barh(names, values, color="#c0392b")
        ax.bar_label(bars, labels=[f"{v:.4g}" for v in values], padding=3, fontsize=8)
        ax.set_title("logged once (final values)")
        ax.tick_params(axis="y", labelsize=8)
        ax.margins(x=0.25)
        ax.grid(alpha=0.3, axis="x")
    if not panels:
        axes[0].set_title("no metrics logged")
    for ax in axes[panels:]:
        ax.axis("off")
    return _save(fig, Path(path))
