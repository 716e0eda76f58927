"""Whether CSV files hold LAFAN1 motions retargeted to the Unitree G1, from their first lines.

Sniffing claims LAFAN1 only on positive evidence: every ``.csv`` file of the source (the
one file, or each of a folder's) starts with lines of :data:`G1_CSV_COLUMNS` numbers
(root position, root quaternion xyzw, 29 joint positions; no header), the layout
:func:`torchstore.motion.import_lafan` reads. Anything else (a header row, another
column count, text that is not UTF-8) is an unrelated CSV, not a damaged LAFAN1 one.

Only the first :data:`PROBE_BYTES` of each file are read, and torch is not imported.
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["G1_CSV_COLUMNS", "PROBE_BYTES", "PROBE_LINES", "csv_files", "not_lafan"]

#: Columns of a retargeted G1 CSV (3 root position + 4 root quaternion + 29 joints);
#: ``torchstore.motion.lafan`` reads the same layout.
G1_CSV_COLUMNS = 36
#: Bytes read from the start of each file: a G1 line is about 400 characters.
PROBE_BYTES = 16 * 2**10
#: Lines (at most) of each file that must have the G1 layout.
PROBE_LINES = 3


def csv_files(path: Path) -> list[Path]:
    """The ``.csv`` files an import of ``path`` reads: ``path`` itself, or a folder's."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.suffix.lower() == ".csv" and p.is_file())


def _first_lines(path: Path) -> list[tuple[int, str]]:
    """(1-based line number, text) of the first non-empty lines of ``path``."""
    with open(path, "rb") as fh:
        head = fh.read(PROBE_BYTES)
        whole = not fh.read(1)
    text = head.decode("utf-8-sig")  # UnicodeDecodeError: not text
    lines = text.splitlines()
    if not whole and lines and not text.endswith(("\n", "\r")):
        lines = lines[:-1]  # cut by the read, not by the file
    return [(n, line) for n, line in enumerate(lines, start=1) if line.strip()][:PROBE_LINES]


def _line_problem(line: str) -> str | None:
    cells = line.split(",")
    if len(cells) != G1_CSV_COLUMNS:
        return f"{len(cells)} comma-separated columns, not {G1_CSV_COLUMNS}"
    for cell in cells:
        try:
            value = float(cell)
        except ValueError:
            return f"{cell.strip()[:20]!r}, not a number"
        if not math.isfinite(value):
            return f"{cell.strip()!r}, not a finite number"
    return None


def not_lafan(path: Path) -> str | None:
    """None when every CSV file at ``path`` starts with G1 rows; else why not, naming the
    first file (and line) that does not, such as ``data.csv line 1: 5 comma-separated
    columns, not 36``."""
    files = csv_files(path)
    if not files:
        return "no .csv files"
    for file in files:
        try:
            lines = _first_lines(file)
        except UnicodeDecodeError:
            return f"{file.name} is not UTF-8 text"
        except OSError as exc:
            return f"{file.name} cannot be read ({exc.strerror or exc})"
        if not lines:
            return f"{file.name} holds no rows"
        for number, line in lines:
            problem = _line_problem(line)
            if problem is not None:
                return f"{file.name} line {number}: {problem}"
    return None
