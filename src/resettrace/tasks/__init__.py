"""Task registry: task names to classes, imported only when asked for."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TASKS", "task_class"]

TASKS: dict[str, str] = {
    "g1_walk_flat": "resettrace.tasks.g1_walk_flat:G1WalkFlat",
    "g1_motion_tracking": "resettrace.tasks.g1_motion_tracking:G1MotionTracking",
}


def task_class(name: str) -> Any:
    """The task class registered as ``name``; unknown names list the known ones."""
    try:
        target = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)
