"""The body-pose cache every backend keeps in the contract layout (xyz + wxyz).

Rows go stale after a physics step or a ``set_state`` and are read back from the
engine only when someone asks for them (:meth:`PoseCache.rows`), for those rows only:
the cost of a pose read lands where the poses are used.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["PoseCache"]


class PoseCache:
    """``(num_envs, bodies, 7)`` poses; ``refresh(ids)`` writes sorted unique stale rows."""

    def __init__(self, num_envs: int, body_names: tuple[str, ...],
                 refresh: Callable[[np.ndarray], None]) -> None:
        self.pose = np.zeros((num_envs, len(body_names), 7))
        self.pose[..., 3] = 1.0  # identity until read
        self.fresh = np.zeros(num_envs, dtype=bool)
        self._names = body_names
        self._cols: dict[tuple[str, ...], np.ndarray] = {}
        self._refresh = refresh

    def mark_stale(self, ids: np.ndarray | None = None) -> None:
        """After the engine moved these rows (all rows for ``None``)."""
        if ids is None:
            self.fresh[:] = False
        else:
            self.fresh[ids] = False

    def rows(self, rows: np.ndarray, body_names: tuple[str, ...] | list[str]) -> np.ndarray:
        """``(len(rows), len(body_names), 7)`` poses, stale rows read back first."""
        cols = self.columns(tuple(body_names))
        stale = rows[~self.fresh[rows]]  # O(len(rows)), never O(num_envs)
        if stale.size:
            stale = np.unique(stale).astype(np.int32)  # sorted, unique
            self._refresh(stale)
            self.fresh[stale] = True
        return self.pose[rows[:, None], cols]

    def columns(self, names: tuple[str, ...]) -> np.ndarray:
        cols = self._cols.get(names)
        if cols is None:
            lookup = {n: i for i, n in enumerate(self._names)}
            missing = [n for n in names if n not in lookup]
            if missing:
                raise ValueError(f"unknown body name(s) {missing}; known: "
                                 f"{', '.join(self._names)}")
            cols = self._cols[names] = np.array([lookup[n] for n in names], np.intp)
        return cols
