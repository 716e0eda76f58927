"""The LeRobot v3.0 bridge: import, a crash-safe writer, export, rejected episodes, Hub push/pull.

Needs the ``lerobot`` extra (pyarrow, PyAV, Pillow, huggingface_hub):
``pip install -e ".[lerobot]"``.

* :func:`import_lerobot`: a LeRobot folder or Hub repo (v3.0 or v2.1) into a trajectory store.
* :class:`LeRobotWriter`: record episodes; after every ``save_episode`` the folder is a
  complete dataset, and a killed recorder loses at most the episode in progress.
* :func:`export_lerobot`: a trajectory store to a v3.0 folder.
* :func:`push_to_hub` / :func:`download_lerobot`: the Hub, with the ``v3.0`` tag LeRobot needs.
* :class:`LeRobotSource`: read a folder episode by episode without importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.lerobot.export import (
        ExportSummary,
        export_lerobot,
    )
    from torchstore.lerobot.hub import (
        download_lerobot,
        is_lerobot_dataset,
        push_to_hub,
    )
    from torchstore.lerobot.importer import (
        ImportSummary,
        import_lerobot,
    )
    from torchstore.lerobot.source import (
        EpisodeEntry,
        LeRobotSource,
    )
    from torchstore.lerobot.writer import LeRobotWriter

_EXPORTS = {
    "ExportSummary": "torchstore.lerobot.export",
    "export_lerobot": "torchstore.lerobot.export",
    "download_lerobot": "torchstore.lerobot.hub",
    "is_lerobot_dataset": "torchstore.lerobot.hub",
    "push_to_hub": "torchstore.lerobot.hub",
    "ImportSummary": "torchstore.lerobot.importer",
    "import_lerobot": "torchstore.lerobot.importer",
    "EpisodeEntry": "torchstore.lerobot.source",
    "LeRobotSource": "torchstore.lerobot.source",
    "LeRobotWriter": "torchstore.lerobot.writer",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "EpisodeEntry",
    "ExportSummary",
    "ImportSummary",
    "LeRobotSource",
    "LeRobotWriter",
    "download_lerobot",
    "export_lerobot",
    "import_lerobot",
    "is_lerobot_dataset",
    "push_to_hub",
]
