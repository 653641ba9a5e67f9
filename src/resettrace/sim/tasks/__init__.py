"""Task registry: task names to classes, imported only when asked for."""

from __future__ import annotations

from typing import Any

from resettrace.registry import resolve

__all__ = ["TASKS", "task_class"]

TASKS: dict[str, str] = {
    "g1_walk_flat": "resettrace.sim.tasks.g1_walk_flat:G1WalkFlat",
    "g1_motion_tracking": "resettrace.sim.tasks.g1_motion_tracking:G1MotionTracking",
}


def task_class(name: str) -> Any:
    """The task class registered as ``name``; unknown names list the known ones."""
    return resolve(TASKS, "task", name)
