"""Name-to-class tables whose modules load on first use (``import resettrace`` stays light)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["resolve"]


def resolve(table: Mapping[str, str], kind: str, name: str) -> Any:
    """The object ``"module:attr"`` registered as ``name``; unknown names list the known ones."""
    try:
        target = table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}") \
            from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
