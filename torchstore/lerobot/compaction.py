"""Merge a recording session's one-episode files into LeRobot-sized files; repair on resume.

:class:`~torchstore.lerobot.writer.LeRobotWriter` saves every episode into files of its
own (a data Parquet, an episodes-table Parquet and an MP4 per camera), so a save costs the
same for the 500th episode as for the first. On ``close()`` the session's files are merged,
within the size caps, as LeRobot would have written them: data row groups copied into one
file, MP4 packets concatenated by stream copy, the session's episode rows rewritten into
one table that points at the merged files. That costs one pass over the session, once.

The merged files are written under temporary names, then renamed into place over the
session's first files, the episodes table last; the files they replace are deleted
after. A kill between those renames leaves either the old episode rows (pointing at files
that still exist; a merged data file may then hold rows of episodes the table places
elsewhere) or the new table beside episode files it covers;
:meth:`LeRobotWriter.resume` repairs both (:func:`drop_covered_tables`, then
:func:`trim_to_table`), and merges what a session killed before ``close()`` left in
one-episode files (:func:`merge_trailing_run`).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchstore.io.durable import fsync_folder
from torchstore.io.records.parquet import require_pyarrow, write_table_atomically, write_tables
from torchstore.lerobot.episodes_table import concat_episode_tables
from torchstore.lerobot.layout import SCRATCH_DIR, data_path, episodes_path, video_path, writer_lock
from torchstore.lerobot.parquet_files import read_table

__all__ = [
    "SavedEpisode",
    "compact_session",
    "drop_covered_tables",
    "merge_trailing_run",
    "pack_by_size",
    "trim_to_table",
]


@dataclass
class SavedEpisode:
    """Where one episode saved in this session lives: its own data, table and video files."""

    index: int
    data: tuple[int, int]
    meta: tuple[int, int]
    videos: dict[str, tuple[int, int]] = field(default_factory=dict)
    row: Any = None  # its one-row episodes table (pyarrow)


def pack_by_size(
    episodes: Sequence[Any],
    path_of: Callable[[Any], Path],
    cap: float,
    *,
    split_streams: bool = False,
) -> list[list[Any]]:
    """Consecutive episodes packed into files below ``cap`` bytes (LeRobot's roll-over rule:
    a file is full when its size plus the next episode's would reach the cap).

    ``split_streams``: the episodes' MP4s may hold different streams (packets copied from
    a store, whose episodes came from files encoded apart): a file also ends where the
    next episode's stream headers differ, as one MP4 stream cannot hold both."""
    groups: list[list[SavedEpisode]] = []
    size, stream = 0, None
    for episode in episodes:
        path = path_of(episode)
        n = path.stat().st_size
        same = True
        if split_streams:
            previous, stream = stream, video_stream_key(path)
            same = previous is None or previous == stream
        if groups and size + n < cap and same:
            groups[-1].append(episode)
            size += n
        else:
            groups.append([episode])
            size = n
    return groups


def video_stream_key(path: Path) -> tuple:
    """What MP4s joined by stream copy must share: codec, size, pix_fmt, rate, headers."""
    from torchstore.io.frames.video_container import _append_facts, _open_input

    container, stream = _open_input(Path(path))
    try:
        facts = _append_facts(Path(path), container, stream)
    finally:
        container.close()
    return tuple(sorted(facts.items()))


def _staging(target: Path) -> Path:
    return target.parent / f".{target.name}.{os.getpid()}.compact.tmp"


def _sync(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def compact_session(
    root: Path,
    episodes: Sequence[SavedEpisode],
    *,
    cameras: Sequence[str],
    data_cap: float,
    video_cap: float,
    durable: bool = False,
    use_dictionary: bool | Sequence[str] = True,
    split_streams: Sequence[str] = (),
) -> None:
    """Merge the one-episode files of ``episodes`` (consecutive, in order) within the caps;
    ``split_streams``: cameras whose episodes may hold different streams (see
    :func:`pack_by_size`)."""
    if len(episodes) < 2:
        return
    staged: list[tuple[Path, Path]] = []  # (temporary, target), renamed in this order
    replaced: list[Path] = []  # files the merged ones take the place of
    try:
        columns = _merge_data(root, episodes, data_cap, use_dictionary, staged, replaced)
        for key in cameras:
            columns |= _merge_videos(
                root, episodes, key, video_cap, staged, replaced, key in split_streams
            )
        meta = episodes[0].meta
        columns["meta/episodes/chunk_index"] = [meta[0]] * len(episodes)
        columns["meta/episodes/file_index"] = [meta[1]] * len(episodes)
        target = root / episodes_path(*meta)
        tmp = _staging(target)
        staged.append((tmp, target))  # renamed last: the commit point
        write_tables(tmp, _repointed_table(episodes, columns))
        if durable:
            for tmp, _ in staged:
                _sync(tmp)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    old_tables = [root / episodes_path(*e.meta) for e in episodes[1:]]
    _swap_in(root, staged, [*old_tables, *replaced], durable=durable)


def _merge_data(
    root: Path,
    episodes: Sequence[SavedEpisode],
    cap: float,
    use_dictionary: bool | Sequence[str],
    staged: list[tuple[Path, Path]],
    replaced: list[Path],
) -> dict[str, list]:
    """Stage the merged data files; returns the episodes' new ``data/*`` columns."""
    data_of: dict[int, tuple[int, int]] = {}
    for group in pack_by_size(episodes, lambda e: root / data_path(*e.data), cap):
        first = group[0].data
        data_of.update({e.index: first for e in group})
        if len(group) > 1:
            target = root / data_path(*first)
            tmp = _staging(target)
            staged.append((tmp, target))
            write_tables(
                tmp,
                [read_table(root / data_path(*e.data)) for e in group],
                use_dictionary=use_dictionary,
            )
            replaced += [root / data_path(*e.data) for e in group[1:]]
    return {
        "data/chunk_index": [data_of[e.index][0] for e in episodes],
        "data/file_index": [data_of[e.index][1] for e in episodes],
    }


def _merge_videos(
    root: Path,
    episodes: Sequence[SavedEpisode],
    key: str,
    cap: float,
    staged: list[tuple[Path, Path]],
    replaced: list[Path],
    split_streams: bool = False,
) -> dict[str, list]:
    """Stage camera ``key``'s merged MP4s; returns the episodes' new ``videos/<key>/*``
    columns."""
    from torchstore.io.frames.video import concat_videos

    spans: dict[int, tuple[tuple[int, int], float, float]] = {}
    for group in pack_by_size(
        episodes,
        lambda e: root / video_path(key, *e.videos[key]),
        cap,
        split_streams=split_streams,
    ):
        first = group[0].videos[key]
        if len(group) == 1:
            row = group[0].row
            spans[group[0].index] = (
                first,
                row.column(f"videos/{key}/from_timestamp")[0].as_py(),
                row.column(f"videos/{key}/to_timestamp")[0].as_py(),
            )
            continue
        target = root / video_path(key, *first)
        tmp = _staging(target)
        staged.append((tmp, target))
        sources = [root / video_path(key, *e.videos[key]) for e in group]
        for e, (begin, end) in zip(group, concat_videos(sources, tmp), strict=True):
            spans[e.index] = (first, begin, end)
        replaced += sources[1:]
    return {
        f"videos/{key}/chunk_index": [spans[e.index][0][0] for e in episodes],
        f"videos/{key}/file_index": [spans[e.index][0][1] for e in episodes],
        f"videos/{key}/from_timestamp": [spans[e.index][1] for e in episodes],
        f"videos/{key}/to_timestamp": [spans[e.index][2] for e in episodes],
    }


def _repointed_table(episodes: Sequence[SavedEpisode], columns: dict[str, list]):
    """The episodes' rows as one table, ``columns`` replaced (where the merged files are)."""
    pa = require_pyarrow()
    table = concat_episode_tables([e.row for e in episodes])
    for name, values in columns.items():
        i = table.schema.get_field_index(name)
        table = table.set_column(
            i, table.schema.field(i), pa.array(values, table.schema.field(i).type)
        )
    return table


def _swap_in(
    root: Path, staged: list[tuple[Path, Path]], old: list[Path], *, durable: bool
) -> None:
    """Rename the staged files into place (the episodes table last), delete the ``old``
    ones and the chunk folders that leaves empty."""
    with writer_lock(root):
        for tmp, target in staged:
            os.replace(tmp, target)
        for path in old:
            path.unlink(missing_ok=True)
    folders = {p.parent for p in old}
    for folder in sorted(folders, reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # a chunk folder the merge emptied
    if durable:
        for folder in {t.parent for _, t in staged} | {f.parent for f in folders}:
            fsync_folder(folder, best_effort=True)


def drop_covered_tables(files: Sequence[Path]) -> list[Any]:
    """The episodes tables of ``files`` (in sorted order), deleting those a merged table covers.

    A merge killed after its table was renamed into place leaves the one-episode tables it
    replaced; their episodes are all in the merged table, which sorts first.
    """
    tables, covered = [], set()
    for path in files:
        table = read_table(path, what=str(path))
        episodes = (
            set(table.column("episode_index").to_pylist())
            if "episode_index" in table.column_names
            else set()
        )
        if episodes and episodes <= covered:
            path.unlink()
            continue
        covered |= episodes
        tables.append(table)
    return tables


def merge_trailing_run(
    root: Path,
    tables: list,
    cameras: Sequence[str],
    *,
    data_cap: float,
    video_cap: float,
    durable: bool = False,
    use_dictionary: bool | Sequence[str] = True,
) -> bool:
    """Merge the trailing episodes that each have files of their own (what a session
    killed before ``close()`` leaves); ``tables`` are the episodes tables in file order.
    Returns whether anything was merged."""
    if not tables:
        return False
    whole = concat_episode_tables(tables)
    if not {"meta/episodes/chunk_index", "meta/episodes/file_index"} <= set(whole.column_names):
        return False  # not a table this writer can re-point

    def positions(prefix: str) -> list[tuple[int, int]]:
        return list(
            zip(
                whole.column(f"{prefix}chunk_index").to_pylist(),
                whole.column(f"{prefix}file_index").to_pylist(),
            )
        )

    data = positions("data/")
    videos = {key: positions(f"videos/{key}/") for key in cameras}
    shared = Counter(data)
    shared_video = {key: Counter(v) for key, v in videos.items()}
    run: list[SavedEpisode] = []
    i = whole.num_rows
    for table in reversed(tables):
        i -= table.num_rows
        alone = table.num_rows == 1 and shared[data[i]] == 1
        if not alone or any(shared_video[k][videos[k][i]] != 1 for k in videos):
            break
        meta = (
            table.column("meta/episodes/chunk_index")[0].as_py(),
            table.column("meta/episodes/file_index")[0].as_py(),
        )
        run.append(
            SavedEpisode(
                table.column("episode_index")[0].as_py(),
                data[i],
                meta,
                {k: videos[k][i] for k in videos},
                table,
            )
        )
    if len(run) < 2:
        return False
    compact_session(
        root,
        run[::-1],
        cameras=cameras,
        data_cap=data_cap,
        video_cap=video_cap,
        durable=durable,
        use_dictionary=use_dictionary,
        split_streams=cameras,  # a dead session's episodes may have come as packets
    )
    return True


def trim_to_table(
    root: Path,
    table,
    cameras: Sequence[str],
    *,
    durable: bool = False,
    use_dictionary: bool | Sequence[str] = True,
) -> None:
    """Make the files match the episodes ``table`` (None: no episode): delete files it does
    not name and rows of episodes it places elsewhere (a killed save's, or a killed
    merge's), and the scratch and temporary files of a dead writer."""
    episodes_in, referenced_video = _named_files(table, cameras)
    for path in sorted((root / "data").glob("*/*.parquet")):
        rel = path.relative_to(root).as_posix()
        if rel not in episodes_in:
            path.unlink()
        else:  # rows of a killed save, or of episodes a killed merge left in their own files
            _keep_rows_of(path, episodes_in[rel], durable=durable, use_dictionary=use_dictionary)
    for path in sorted((root / "videos").glob("*/*/*.mp4")):
        if path.relative_to(root).as_posix() not in referenced_video:
            path.unlink()
    scratch = root / SCRATCH_DIR
    for path in scratch.rglob("*"):
        if path.is_file() and not path.name.startswith(".torchstore-"):
            path.unlink()
    for folder in (root / "data", root / "videos", root / "meta"):
        for path in folder.rglob(".*.tmp") if folder.exists() else ():
            path.unlink()


def _named_files(table, cameras: Sequence[str]) -> tuple[dict[str, set[int]], set[str]]:
    """``({data file: its episodes}, {video files})`` the episodes ``table`` names."""
    episodes_in: dict[str, set[int]] = {}
    referenced_video: set[str] = set()
    if table is None:
        return episodes_in, referenced_video
    indices = table.column("episode_index").to_pylist()
    chunks = table.column("data/chunk_index").to_pylist()
    files = table.column("data/file_index").to_pylist()
    for e, c, f in zip(indices, chunks, files, strict=True):
        episodes_in.setdefault(data_path(c, f), set()).add(e)
    for key in cameras:
        for c, f in zip(
            table.column(f"videos/{key}/chunk_index").to_pylist(),
            table.column(f"videos/{key}/file_index").to_pylist(),
        ):
            referenced_video.add(video_path(key, c, f))
    return episodes_in, referenced_video


def _keep_rows_of(
    path: Path, episodes: set[int], *, durable: bool, use_dictionary: bool | Sequence[str]
) -> None:
    """Rewrite the data file ``path`` without the rows of episodes other than ``episodes``
    (one row group per episode); a file holding only those is left as it is."""
    pa = require_pyarrow()
    episode = (
        read_table(path, columns=["episode_index"], what=str(path))
        .column("episode_index")
        .to_numpy()
    )
    keep = np.isin(episode, sorted(episodes))
    if keep.all():
        return
    kept = read_table(path, what=str(path)).filter(pa.array(keep))
    episode = episode[keep]
    groups = [kept.filter(pa.array(episode == e)) for e in dict.fromkeys(episode.tolist())]
    write_table_atomically(path, groups, durable=durable, use_dictionary=use_dictionary)
