"""Statistics the benchmarks share."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def paired_ratio_ci(a: Sequence[float], b: Sequence[float],
                    reduce: Callable[..., np.ndarray] = np.median) -> list[float] | None:
    """95% paired bootstrap interval (percentile; rounds resampled with both samples'
    values of each) of ``reduce(a) / reduce(b)`` (``np.median``: the p50 ratio;
    ``np.sum``: the total's). None below 3 rounds."""
    if len(a) < 3:
        return None
    from scipy import stats

    def ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return reduce(x, axis=axis) / reduce(y, axis=axis)

    res = stats.bootstrap((np.asarray(a), np.asarray(b)), ratio, paired=True,
                          vectorized=True, confidence_level=0.95, method="percentile",
                          n_resamples=2000, random_state=0)
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]
