"""Checks of the arrays a compiled kernel is bound to (numba-free: imported by the tasks)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_array"]


def check_array(name: str, a: Any, shape: tuple[int, ...], dtype: type,
                rows_only: bool = False) -> None:
    """``a`` is an ndarray of ``shape`` and ``dtype``, C-contiguous (``rows_only``: each row
    contiguous, rows at any stride, as the engine's state views are)."""
    if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape:
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"use_numba: {name} must be a {np.dtype(dtype)} array of shape {shape},"
                         f" got {got}")
    ok = a.strides[-1] == a.itemsize if rows_only else a.flags.c_contiguous
    if not ok:
        raise ValueError(f"use_numba: {name} must be "
                         + ("row-contiguous" if rows_only else "C-contiguous"))
