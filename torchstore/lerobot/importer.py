"""``import_lerobot``: a LeRobot dataset (folder or Hub repo) into a trajectory store.

One store episode per LeRobot episode, in order, lengths preserved. Every feature becomes a
column (see :mod:`torchstore.lerobot.features`). A video feature keeps its MP4's packets,
byte for byte, in an encoded column (:mod:`torchstore.lerobot.video_columns`), each
episode's located frame-accurately by timestamp, one episode in memory at a time; reads
decode them. ``video="decode"`` (or a stream that cannot be kept as packets) decodes the
frames into a raw ``uint8`` column instead, as earlier releases did. The store is written
under a temporary name beside ``dest`` and renamed into place only when complete, so a
failed import leaves nothing half-written at ``dest``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from torchstore.errors import LeRobotFormatError
from torchstore.lerobot.sidecar import read_sidecar
from torchstore.lerobot.source import LeRobotSource, select_features
from torchstore.lerobot.video_columns import check_video_mode, episode_video, plan_video_columns

__all__ = ["import_lerobot", "ImportSummary", "locate_dataset"]

log = logging.getLogger(__name__)

# Default features not imported unless asked for by name: "index" numbers the frames of the
# whole dataset, which the store's rows already do (the episode's first one is in its
# metadata as dataset_from_index); a column of that name would clash with the "index" key
# every DataModule batch carries.
_NOT_IMPORTED = ("index",)

# Rows decoded and written per commit: big enough that per-commit costs vanish, small
# enough for memory (a 640x480 camera: about 700 frames).
_SLAB_BYTES = 256 * 2**20

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True, slots=True)
class ImportSummary:
    """What an import wrote."""

    path: Path
    source: str
    episodes: int
    frames: int
    skipped_rejected: tuple[int, ...]
    seconds: float
    #: video features kept as their MP4 packets
    packet_cameras: tuple[str, ...] = ()
    #: video features decoded to raw frames although packets were asked for: why
    decoded_cameras: dict[str, str] = field(default_factory=dict)
    #: episodes (LeRobot's numbers) of a packet camera whose packets could not be kept:
    #: decoded and encoded into the column with its codec
    reencoded: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __str__(self) -> str:
        skipped = (
            f", skipped {len(self.skipped_rejected)} rejected" if self.skipped_rejected else ""
        )
        rate = self.frames / self.seconds if self.seconds > 0 else float("inf")
        decoded = "".join(
            f"; camera {name!r} decoded to raw frames: {why}"
            for name, why in self.decoded_cameras.items()
        ) + "".join(
            f"; camera {name!r} re-encoded {len(episodes)} episodes"
            for name, episodes in self.reencoded.items()
        )
        return (
            f"imported {self.episodes} episodes, {self.frames} frames from {self.source} to "
            f"{self.path}{skipped} in {self.seconds:.1f} s ({rate:,.0f} frames/s){decoded}"
        )


def locate_dataset(
    source: str | os.PathLike, *, revision: str | None = None, progress: bool = True
) -> Path:
    """A local folder as is; a Hub repo id (``"user/name"``) downloaded into the Hub cache."""
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise LeRobotFormatError(f"{path} is a file; a LeRobot dataset is a folder")
        return path
    text = str(source)
    if _REPO_ID.fullmatch(text):
        from torchstore.lerobot.hub import download_lerobot

        return download_lerobot(text, revision=revision, progress=progress)
    raise FileNotFoundError(
        f"{source} is neither a local folder nor a Hub repo id like 'user/name'"
    )


def _selected(source: LeRobotSource, episodes: Iterable[int] | None, include_rejected: bool):
    available = {e.index: e for e in source.episodes}
    if episodes is None:
        wanted = list(available)
    else:
        wanted = sorted(set(int(i) for i in episodes))
        missing = [i for i in wanted if i not in available]
        if missing:
            raise LeRobotFormatError(
                f"{source.root} has episodes 0..{len(available) - 1}; no {missing}"
            )
    skipped = tuple(i for i in wanted if i in source.rejected and not include_rejected)
    return [available[i] for i in wanted if i not in skipped], skipped


def _column_names(src: LeRobotSource, sidecar, columns: Iterable[str] | None) -> list[str]:
    """The features an import reads: ``columns``, else an exported store's own columns, else
    every feature but LeRobot's global frame ``index``."""
    if columns is None and sidecar is not None:
        return list(sidecar.columns)  # the exported store's columns, no more
    names = select_features(src, None if columns is None else list(columns))
    if columns is None:
        # LeRobot's global frame index is the store row itself, and "index" is the
        # key every DataModule batch adds for the rows it holds
        names = [n for n in names if n not in _NOT_IMPORTED]
    return names


def _string_tables(src: LeRobotSource, names: list[str], specs: list, sidecar) -> dict:
    """``{feature: its strings in code order}`` for every text feature imported."""
    known_tables = (
        ((sidecar.metadata.get("lerobot") or {}).get("string_tables") or {}) if sidecar else {}
    )
    strings = {}
    for n, spec in zip(names, specs, strict=True):
        if src.features[n].is_text:
            seen = _scan_strings(src, n)
            known = known_tables.get(spec.name)
            # an exported store's codes stay its own when its table still covers the strings
            strings[n] = (
                list(known) if isinstance(known, list) and set(seen) <= set(known) else seen
            )
    return strings


def import_lerobot(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    episodes: Iterable[int] | None = None,
    columns: Iterable[str] | None = None,
    revision: str | None = None,
    include_rejected: bool = False,
    overwrite: bool = False,
    tolerance_s: float | None = None,
    video: str = "packets",
    progress: bool = True,
) -> ImportSummary:
    """Import a LeRobot v3.0 (or v2.1) dataset into a new trajectory store at ``dest``.

    Args:
        source: a local dataset folder, or a Hub repo id (downloaded with huggingface_hub
            into its cache; ``HF_HUB_OFFLINE=1`` answers from the cache only).
        dest: the store file to write (never a source file, a folder or a non-store file;
            see :func:`torchstore.io.destination.check_destination`).
        episodes: LeRobot episode indices to import (default: all).
        columns: feature names to import (default: all but ``index``, the global frame
            number, which the store rows are; for a folder exported by torchstore, the
            store's own columns). ``string`` features and ``language`` annotations become
            int64 codes into ``metadata["lerobot"]["string_tables"]`` (a language cell's
            code stands for its JSON).
        revision: Hub revision (default: the ``v3.0`` tag, resolved like LeRobot does).
        include_rejected: keep episodes listed in ``meta/rejected_episodes.json``.
        overwrite: replace an existing ``dest``.
        tolerance_s: allowed distance between a video frame's timestamp and where the
            episode table says it is (default: a quarter of a frame period).
        video: ``"packets"`` (default): each video feature becomes an encoded column
            holding its MP4's packets as they are (AV1 / H.264; reads decode them); a
            stream that cannot be kept so is decoded instead, with the reason in a warning
            and in the summary's ``decoded_cameras``. ``"decode"``: every video feature
            decoded into a raw ``uint8 [H, W, C]`` column.
        progress: show a progress bar over frames.
    """
    from torchstore.data.file.writer import TrajectoryStoreWriter
    from torchstore.io.destination import check_destination, written_beside

    started = time.perf_counter()
    video = check_video_mode(video)
    local = Path(source)
    dest = check_destination(dest, sources=[local] if local.exists() else [], overwrite=overwrite)
    root = locate_dataset(source, revision=revision, progress=progress)
    with LeRobotSource(root) as src:
        sidecar = read_sidecar(root, src.features)
        names = _column_names(src, sidecar, columns)
        chosen, skipped = _selected(src, episodes, include_rejected)
        if skipped:
            log.warning(
                "skipping %d rejected episodes of %s: %s", len(skipped), root, list(skipped)
            )
        if not chosen:
            raise LeRobotFormatError(
                f"{root}: no episodes left to import ({len(skipped)} rejected, skipped)"
            )
        specs = [
            sidecar.columns[n]
            if sidecar is not None and n in sidecar.columns
            else src.features[n].column_spec()
            for n in names
        ]
        specs, decoded = plan_video_columns(src, names, specs, chosen[0], video, tolerance_s)
        for name, why in decoded.items():
            log.warning("camera %r is decoded to raw frames: %s", name, why)
        packet_names = [
            n
            for n, spec in zip(names, specs, strict=True)
            if src.features[n].is_video and spec.codec is not None
        ]
        strings = _string_tables(src, names, specs, sidecar)
        for name, table in strings.items():
            src._string_tables[name] = {s: i for i, s in enumerate(table)}
        if sidecar is not None:
            metadata, env_id, seed = sidecar.metadata, sidecar.env_id, sidecar.seed
        else:
            env_id = seed = None
            metadata = {
                "lerobot": {
                    "source": str(source),
                    "codebase_version": src.version,
                    "fps": src.fps,
                    "robot_type": src.info.get("robot_type"),
                    "features": {n: src.features[n].to_json() for n in names},
                    "tasks": src.tasks,
                    "string_tables": strings,
                    "stats": src.stats,
                    "info": src.info,
                    "rejected": {str(i): r.reason for i, r in src.rejected.items()},
                }
            }
        specs_of = dict(zip(names, specs, strict=True))
        reencoded: dict[str, list[int]] = {}
        frames = 0
        total_rows = sum(e.length for e in chosen)
        bar = _bar(total_rows, progress, f"import {root.name}")
        try:
            with (
                written_beside(dest, "importing") as partial,
                TrajectoryStoreWriter(
                    partial,
                    specs,
                    env_id=env_id,
                    seed=seed,
                    metadata=metadata,
                    overwrite=True,
                    expected_rows=total_rows,
                ) as writer,
            ):
                # the store is renamed into place only when complete, so a commit per episode
                # buys nothing: episodes go in slabs of up to _SLAB_BYTES, one commit each
                # (cameras kept as packets: an episode at a time, not counted in the slab)
                read = [(n, s) for n, s in zip(names, specs, strict=True) if n not in packet_names]
                frame_bytes = sum(
                    int(np.prod(s.shape, dtype=np.int64)) * s.storage_dtype.itemsize
                    for _, s in read
                )
                for batch in _batches(chosen, max(1, _SLAB_BYTES // max(frame_bytes, 1))):
                    values = src.read_episodes(batch, [n for n, _ in read], tolerance_s=tolerance_s)
                    total = sum(e.length for e in batch)
                    rows = {spec.name: values[n].reshape(total, *spec.shape) for n, spec in read}
                    metas = [_episode_meta(src, sidecar, e) for e in batch]
                    if packet_names:
                        _add_with_packets(
                            src,
                            writer,
                            batch,
                            rows,
                            metas,
                            packet_names,
                            specs_of,
                            tolerance_s,
                            reencoded,
                        )
                    else:
                        writer.add_episodes(rows, [e.length for e in batch], metas)
                    frames += total
                    if bar is not None:
                        bar.update(total)
        finally:
            if bar is not None:
                bar.close()
    return ImportSummary(
        dest,
        str(source),
        len(chosen),
        frames,
        skipped,
        time.perf_counter() - started,
        tuple(packet_names),
        decoded,
        {name: tuple(episodes) for name, episodes in reencoded.items()},
    )


def _add_with_packets(
    src: LeRobotSource,
    writer,
    batch: list,
    rows: dict,
    metas: list,
    packet_names: list[str],
    specs_of: dict,
    tolerance_s: float | None,
    reencoded: dict[str, list[int]],
) -> None:
    """Commit the episodes of ``batch`` one by one, each camera of ``packet_names`` as its
    MP4's packets (taken out of the file for that episode only: memory stays one episode's)
    or, where they cannot be kept, as its decoded frames (``reencoded`` notes which)."""
    at = 0
    for entry, meta in zip(batch, metas, strict=True):
        episode = {name: value[at : at + entry.length] for name, value in rows.items()}
        for name in packet_names:
            spec = specs_of[name]
            episode[spec.name], why = episode_video(src, entry, name, spec, tolerance_s)
            if why is not None:
                if name not in reencoded:
                    log.warning(
                        "camera %r: the packets of episode %d cannot be kept (%s); its frames "
                        "are decoded and encoded as %s (so are later such episodes)",
                        name, entry.index, why, spec.codec.kind,
                    )  # fmt: skip
                reencoded.setdefault(name, []).append(entry.index)
        writer.add_episode(episode, meta)
        at += entry.length


def _episode_meta(src: LeRobotSource, sidecar, entry) -> dict:
    """The store metadata of one imported episode: the exported store's own, else where it
    came from."""
    if sidecar is not None and entry.index < len(sidecar.episodes):
        return sidecar.episodes[entry.index]
    meta = {
        "lerobot_episode_index": entry.index,
        "dataset_from_index": entry.from_index,
        "tasks": list(entry.tasks),
    }
    if entry.index in src.rejected:
        meta["rejected"] = src.rejected[entry.index].reason
    return meta


def _batches(entries: list, max_frames: int) -> Iterator[list]:
    """Consecutive entries of one data file, at most ``max_frames`` frames (or one episode) each."""
    batch: list = []
    frames = 0
    for entry in entries:
        if batch and (
            frames + entry.length > max_frames
            or entry.data_file != batch[-1].data_file
            or entry.from_index != batch[-1].from_index + batch[-1].length
        ):
            yield batch
            batch, frames = [], 0
        batch.append(entry)
        frames += entry.length
    if batch:
        yield batch


def _scan_strings(src: LeRobotSource, name: str) -> list[str]:
    """Every distinct value of a text feature, in order of first appearance."""
    from torchstore.lerobot.features import cell_text
    from torchstore.lerobot.parquet_files import read_table

    seen: dict[str, None] = {}
    for rel in dict.fromkeys(e.data_file for e in src.episodes):
        table = read_table(src.root / rel, columns=[name], what=str(src.root / rel))
        feature = src.features[name]
        seen.update(
            dict.fromkeys(
                cell_text(feature, v)
                for v in table.column(name).to_pylist()
                if v is not None or feature.dtype == "language"
            )
        )
    return list(seen)


def _bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from torchstore.io.progress import progress_bar

    return progress_bar(total=total, unit="frame", desc=desc, leave=False)
