"""Mergeable latency distributions: base-2 exponential buckets at a fixed scale.

Bucket ``i`` holds the values in ``(base**i, base**(i + 1)]`` ms with ``base = 2 ** (2 **
-SCALE)`` (OpenTelemetry's exponential histogram layout); zeros (a phase that took no time,
or a backend that has no such step) have a bucket of their own. At :data:`SCALE` 5 the base
is 1.0219, and a percentile read from the buckets (the geometric middle of the bucket that
holds it) is within :data:`RELATIVE_ERROR` (1.09%) of the sample it stands for.

The scale is fixed, so merging is adding counts: the distribution of many workers is
exactly the one a single process would have kept for all their calls, and its percentiles
carry the same stated error. Count, total and max stay exact beside it
(:class:`~resettrace.tracing.processor.TimingSpanProcessor`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["Distribution", "SCALE", "BASE", "RELATIVE_ERROR"]

SCALE = 5
BASE = 2.0 ** (2.0 ** -SCALE)
#: the largest relative distance of a value from the geometric middle of its bucket
RELATIVE_ERROR = math.sqrt(BASE) - 1.0
_FACTOR = 2.0 ** SCALE


class Distribution:
    """Counts per exponential bucket of one key's values (ms), mergeable by addition."""

    __slots__ = ("zero", "counts", "min")

    def __init__(self) -> None:
        self.zero = 0
        self.counts: dict[int, int] = {}
        #: the smallest positive value added (exact; inf when none)
        self.min = math.inf

    @property
    def count(self) -> int:
        return self.zero + sum(self.counts.values())

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64)
        positive = v[v > 0]
        self.zero += int(v.size - positive.size)
        if not positive.size:
            return
        self.min = min(self.min, float(positive.min()))
        idx = np.ceil(np.log2(positive) * _FACTOR).astype(np.int64) - 1
        keys, n = np.unique(idx, return_counts=True)
        counts = self.counts
        for k, c in zip(keys.tolist(), n.tolist(), strict=True):
            counts[k] = counts.get(k, 0) + c

    def add_one(self, value: float) -> None:
        if value > 0:
            self.min = min(self.min, value)
            k = math.ceil(math.log2(value) * _FACTOR) - 1
            self.counts[k] = self.counts.get(k, 0) + 1
        else:
            self.zero += 1

    def merge(self, other: Distribution) -> None:
        self.zero += other.zero
        self.min = min(self.min, other.min)
        for k, c in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + c

    def quantile(self, q: float) -> float:
        """The value at rank ``ceil(q * count)`` (the sample numpy's ``inverted_cdf``
        percentile picks), as the geometric middle of its bucket: within
        :data:`RELATIVE_ERROR` of it. NaN when empty."""
        n = self.count
        if not n:
            return math.nan
        rank = max(1, math.ceil(q * n))
        if rank <= self.zero:
            return 0.0
        seen = self.zero
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                return BASE ** (k + 0.5)
        return BASE ** (max(self.counts) + 0.5)

    def as_dict(self) -> dict[str, Any]:
        return {"scale": SCALE, "zero": self.zero,
                "min": None if math.isinf(self.min) else self.min,
                "buckets": {str(k): c for k, c in sorted(self.counts.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Distribution:
        if int(d.get("scale", SCALE)) != SCALE:
            raise ValueError(f"a distribution at scale {d.get('scale')} cannot merge with "
                             f"scale {SCALE}")
        out = cls()
        out.zero = int(d.get("zero", 0))
        if d.get("min") is not None:
            out.min = float(d["min"])
        out.counts = {int(k): int(c) for k, c in (d.get("buckets") or {}).items()}
        return out

    @classmethod
    def merged(cls, parts: Iterable[Distribution]) -> Distribution:
        out = cls()
        for p in parts:
            out.merge(p)
        return out
