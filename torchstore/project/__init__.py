"""Project bundles: push and pull a training project (configs, recipes, runs, weights, pinned
datasets).

The bundle format and its rules are defined in :mod:`torchstore.project.bundle`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstore._lazy import lazy_exports

if TYPE_CHECKING:
    from torchstore.errors import ProjectError
    from torchstore.project.bundle import (
        MANIFEST_NAME,
        ProjectDataset,
        ProjectListing,
        ProjectManifest,
        ProjectPlan,
        ProjectRun,
        PulledProject,
        PushedProject,
        plan_project,
        pull_project,
        push_project,
    )

_EXPORTS = {
    name: "torchstore.project.bundle"
    for name in (
        "MANIFEST_NAME",
        "ProjectDataset",
        "ProjectListing",
        "ProjectManifest",
        "ProjectPlan",
        "ProjectRun",
        "PulledProject",
        "PushedProject",
        "plan_project",
        "pull_project",
        "push_project",
    )
}
_EXPORTS["ProjectError"] = "torchstore.errors"

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "MANIFEST_NAME",
    "ProjectDataset",
    "ProjectListing",
    "ProjectError",
    "ProjectManifest",
    "ProjectPlan",
    "ProjectRun",
    "PulledProject",
    "PushedProject",
    "plan_project",
    "pull_project",
    "push_project",
]
