"""Mergeable latency distributions and the one percentile rule every figure follows.

**The percentile.** Every p50 / p90 / p99 resettrace reports (a process's statistics, a
record's, a job's) estimates one definition: numpy's default (``method="linear"``), the
value at fractional rank ``q * (n - 1)`` (0-based) of the sorted calls, interpolated between
the two order statistics beside it (:func:`percentile`). It is exact when every call's
value is at hand (a process's reservoir of samples, or a record's ``samples`` of a key,
hold every call: ``len(samples) == count``); otherwise it is read from the buckets below
(:meth:`Distribution.quantile`), within :data:`RELATIVE_ERROR` of the exact value.

**The buckets.** Bucket ``i`` holds the values in ``(base**i, base**(i + 1)]`` ms with
``base = 2 ** (2 ** -scale)`` (OpenTelemetry's exponential histogram layout), so a value's
index is ``ceil(log2(v) * 2**scale) - 1``; zeros (a phase that took no time, or a backend
that has no such step) have a bucket of their own, and the exact smallest positive and
largest values are kept beside them. At :data:`SCALE` 6 the base is ``2 ** (1/64)`` and
the geometric middle of a bucket is within ``sqrt(base) - 1`` = :data:`RELATIVE_ERROR`
(0.54%) of every value in it. :meth:`Distribution.quantile` takes each of the two order
statistics around the rank as its bucket's middle (0 for a zero; clamped to the exact
minimum and maximum) and interpolates: a convex combination of values each within 0.54%
of theirs is within 0.54% of the exact percentile.

**Merging** is adding counts, so the buckets of many workers are exactly the ones a single
process would have kept for all their calls, with the same bound. A distribution carries
its scale: records written at scale 5 (before 0.54%: ``base = 2 ** (1/32)``, 1.09%) are
still read, and merging two scales brings the finer one down to the coarser (bucket ``k``
at scale ``s`` lies in bucket ``floor(k / 2)`` at scale ``s - 1``), whose bound
(:func:`relative_error`) the result then carries. Count, total and max stay exact beside it
(:class:`~resettrace.tracing.processor.TimingSpanProcessor`).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Distribution", "SCALE", "BASE", "RELATIVE_ERROR", "relative_error", "percentile"]

#: the scale every distribution is built at (older records hold scale 5)
SCALE = 6
BASE = 2.0 ** (2.0 ** -SCALE)
#: the scales a distribution may have (OpenTelemetry's exponential histogram range)
MIN_SCALE, MAX_SCALE = -10, 20
#: the scale of a distribution written without one (every record before the field: 5)
_LEGACY_SCALE = 5


def relative_error(scale: int = SCALE) -> float:
    """The largest relative distance of a value from the geometric middle of its bucket at
    ``scale``: the bound of every percentile read from buckets of that scale."""
    return math.sqrt(2.0 ** (2.0 ** -scale)) - 1.0


#: the bound at :data:`SCALE` (0.54%)
RELATIVE_ERROR = relative_error(SCALE)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of already sorted values, numpy's default (linear)
    definition: the value at fractional rank ``q / 100 * (n - 1)``, interpolated between
    its two neighbours. NaN when empty."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


#: the buckets a distribution's dense span holds at most (a span of 2**16 buckets at scale 6
#: is a factor of 2**1024: values far apart go to the dict)
_DENSE_MAX = 1 << 16


def _merge_counts(counts: dict[int, int], keys: list[int], many: list[int]) -> None:
    """Add ``many[i]`` to ``counts[keys[i]]`` for each i (the loops in C: a fold adds a
    hundred buckets a key)."""
    if counts:
        many = list(map(operator.add, map(counts.get, keys, itertools.repeat(0)), many))
    counts.update(zip(keys, many, strict=True))


class Distribution:
    """Counts per exponential bucket of one key's values (ms), mergeable by addition."""

    __slots__ = ("scale", "zero", "_counts", "min", "max", "_dense", "_dense_lo")

    def __init__(self, scale: int = SCALE) -> None:
        if not MIN_SCALE <= scale <= MAX_SCALE:
            raise ValueError(f"scale {scale} is not between {MIN_SCALE} and {MAX_SCALE}")
        self.scale = scale
        self.zero = 0
        self._counts: dict[int, int] = {}
        # counts added a block at a time (:meth:`add_rows`) wait in one array over a span
        # of buckets (bucket ``_dense_lo + i`` at ``i``): a fold adds each key's block in
        # one numpy pass, and the dict takes them when read
        self._dense: np.ndarray | None = None
        self._dense_lo = 0
        #: the smallest positive value added (exact; inf when none)
        self.min = math.inf
        #: the largest value added (exact; -inf when none; None: not known, a
        #: distribution read from a record that did not keep it)
        self.max: float | None = -math.inf

    @property
    def counts(self) -> dict[int, int]:
        """The count of each bucket that holds any (bucket index: count). A read moves the
        counts :meth:`add_rows` left waiting into the dict: like a write, it needs the
        caller's lock when other threads share the distribution."""
        if self._dense is not None:
            self._settle()
        return self._counts

    @counts.setter
    def counts(self, value: dict[int, int]) -> None:
        self._dense = None
        self._counts = value

    def _settle(self) -> None:
        """Move the counts waiting in the dense span into the dict."""
        dense, self._dense = self._dense, None
        if dense is not None:
            hit = np.flatnonzero(dense)
            _merge_counts(self._counts, (hit + self._dense_lo).tolist(), dense[hit].tolist())

    def _add_dense(self, lo: int, n: np.ndarray) -> None:
        """Add ``n[i]`` to bucket ``lo + i``'s count (in the dense span, which grows to
        hold them up to :data:`_DENSE_MAX` buckets; beyond it, into the dict)."""
        dense = self._dense
        if dense is None:
            if len(n) <= _DENSE_MAX:
                self._dense, self._dense_lo = n.astype(np.int64), lo
                return
        else:
            a, b = self._dense_lo, self._dense_lo + len(dense)
            if lo >= a and lo + len(n) <= b:
                dense[lo - a:lo - a + len(n)] += n
                return
            a2, b2 = min(a, lo), max(b, lo + len(n))
            if b2 - a2 <= _DENSE_MAX:
                grown = np.zeros(b2 - a2, dtype=np.int64)
                grown[a - a2:b - a2] = dense
                grown[lo - a2:lo - a2 + len(n)] += n
                self._dense, self._dense_lo = grown, a2
                return
            self._settle()
        hit = np.flatnonzero(n)
        _merge_counts(self._counts, (hit + lo).tolist(), n[hit].tolist())

    @property
    def count(self) -> int:
        return self.zero + sum(self.counts.values())

    @property
    def relative_error(self) -> float:
        """The bound of this distribution's percentiles (:func:`relative_error`)."""
        return relative_error(self.scale)

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64)
        if not v.size:
            return
        if self.max is not None:
            self.max = max(self.max, float(v.max()))
        positive = v[v > 0]
        self.zero += int(v.size - positive.size)
        if not positive.size:
            return
        self.min = min(self.min, float(positive.min()))
        idx = np.ceil(np.log2(positive) * 2.0 ** self.scale).astype(np.int64) - 1
        lo = int(idx.min())
        if int(idx.max()) - lo < 1 << 16:  # a count per bucket in the span: no sort
            n = np.bincount(idx - lo)
            keys = np.flatnonzero(n)
            n = n[keys]
            keys += lo
        else:
            keys, n = np.unique(idx, return_counts=True)
        _merge_counts(self.counts, keys.tolist(), n.tolist())

    @staticmethod
    def add_rows(dists: Sequence[Distribution], values: np.ndarray,
                 lows: np.ndarray | None = None, tops: np.ndarray | None = None) -> None:
        """``dists[j].add(values[j])`` for every row ``j`` of a ``(len(dists), n)`` array
        (``lows``, ``tops``: its rows' min and max, when already known): the same counts,
        zeros, min and max. The rows of positive values (a phase's durations) are counted
        together, in one bucket count, each bucket range found from its row's min and max;
        a row of zeros (a closed account's phase that did not run) is a count of zeros;
        any other row goes through :meth:`add`."""
        width, m = values.shape
        if not m or not width:
            return
        lows = values.min(axis=1) if lows is None else lows
        tops = values.max(axis=1) if tops is None else tops
        scale = dists[0].scale
        if any(d.scale != scale or d.max is None for d in dists):
            fast = np.zeros(width, dtype=bool)
        else:
            fast = lows > 0
        if fast.any():
            block = values if fast.all() else values[fast]
            mine = [d for d, f in zip(dists, fast.tolist(), strict=True) if f]
            f = 2.0 ** scale
            # each row's bucket range, from its min and max (a bucket wider each side:
            # a log2 of one value may differ in its last bit between numpy's loops)
            lo = (np.ceil(np.log2(lows[fast]) * f) - 2).astype(np.int64)
            spans = (np.ceil(np.log2(tops[fast]) * f)).astype(np.int64) - lo + 1
            if int(spans.sum()) > 1 << 22:  # far apart (hand-written values): each alone
                for i, d in enumerate(mine):
                    d.add(block[i])
            else:
                ends = np.cumsum(spans)
                idx = np.log2(block)
                idx *= f
                np.ceil(idx, out=idx)
                # a row's buckets after those before (whole numbers: exact in float64),
                # cast in the same pass
                keys = np.empty(idx.shape, dtype=np.int64)
                np.add(idx, (ends - spans - lo - 1)[:, None].astype(np.float64), out=keys,
                       casting="unsafe")
                n = np.bincount(keys.ravel(), minlength=int(ends[-1]))
                for d, a, b, low, low_v, top_v in zip(
                        mine, (ends - spans).tolist(), ends.tolist(), lo.tolist(),
                        lows[fast].tolist(), tops[fast].tolist(), strict=True):
                    d._add_dense(low, n[a:b])
                    d.max = max(d.max, top_v)
                    d.min = min(d.min, low_v)
        for j in np.flatnonzero(~fast).tolist():
            d = dists[j]
            if tops[j] <= 0 and d.max is not None:  # zeros only (or what counts as them)
                d.zero += m
                d.max = max(d.max, float(tops[j]))
            else:
                d.add(values[j])

    def add_zeros(self, m: int) -> None:
        """``add`` of ``m`` zeros."""
        self.zero += m
        if m and self.max is not None:
            self.max = max(self.max, 0.0)

    def add_one(self, value: float) -> None:
        if self.max is not None and value > self.max:
            self.max = value
        if value > 0:
            self.min = min(self.min, value)
            k = math.ceil(math.log2(value) * 2.0 ** self.scale) - 1
            self.counts[k] = self.counts.get(k, 0) + 1
        else:
            self.zero += 1

    def downscaled(self, scale: int) -> Distribution:
        """A copy at the coarser ``scale`` (bucket ``k`` goes to ``k >> (self.scale -
        scale)``, the bucket that holds it whole)."""
        if scale > self.scale:
            raise ValueError(f"cannot refine scale {self.scale} buckets to scale {scale}")
        out = Distribution(scale)
        out.zero, out.min, out.max = self.zero, self.min, self.max
        shift = self.scale - scale
        for k, c in self.counts.items():
            j = k >> shift  # floor(k / 2**shift), negative indices too
            out.counts[j] = out.counts.get(j, 0) + c
        return out

    def merge(self, other: Distribution) -> None:
        """Add ``other``'s counts; of two scales, the result has the coarser."""
        if other.scale < self.scale:
            coarse = self.downscaled(other.scale)
            self.scale, self.counts = coarse.scale, coarse.counts
        elif other.scale > self.scale:
            other = other.downscaled(self.scale)
        self.zero += other.zero
        self.min = min(self.min, other.min)
        if other.max is None or self.max is None:
            empty = (self.count == 0, other.count == 0)
            self.max = other.max if empty[0] else self.max if empty[1] else None
        else:
            self.max = max(self.max, other.max)
        theirs = other.counts
        _merge_counts(self.counts, list(theirs), list(theirs.values()))

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0-1) by :func:`percentile`'s definition (rank ``q * (n -
        1)``, interpolated), each order statistic taken as its bucket's geometric middle
        (0 for a zero) clamped to the exact min and max: within :attr:`relative_error` of
        the exact value. NaN when empty."""
        n = self.count
        if not n:
            return math.nan
        pos = (n - 1) * q
        lo = math.floor(pos)
        frac = pos - lo
        a, b = self._order_statistics((lo, min(lo + 1, n - 1)))
        return a + (b - a) * frac

    def _order_statistics(self, ranks: Sequence[int]) -> list[float]:
        """The estimates of the values at ``ranks`` (0-based, ascending, below ``count``)."""
        scale_base = 2.0 ** (2.0 ** -self.scale)
        hi = math.inf if self.max is None else self.max
        buckets = iter(sorted(self.counts))
        out = []
        seen, k = self.zero, 0
        for r in ranks:
            if r < self.zero:
                out.append(0.0)
                continue
            while seen <= r:
                k = next(buckets)
                seen += self.counts[k]
            out.append(min(max(scale_base ** (k + 0.5), self.min), hi))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "zero": self.zero,
                "min": None if math.isinf(self.min) else self.min,
                "max": None if self.max is None or math.isinf(self.max) else self.max,
                "buckets": {str(k): c for k, c in sorted(self.counts.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Distribution:
        scale = d.get("scale", _LEGACY_SCALE)
        if not isinstance(scale, int) or isinstance(scale, bool) \
                or not MIN_SCALE <= scale <= MAX_SCALE:
            raise ValueError(f"scale {scale!r} is not an integer between {MIN_SCALE} and "
                             f"{MAX_SCALE}")
        out = cls(scale)
        out.zero = int(d.get("zero", 0))
        if d.get("min") is not None:
            out.min = float(d["min"])
        out.counts = {int(k): int(c) for k, c in (d.get("buckets") or {}).items()}
        if "max" in d:  # written with it: exact (None: empty)
            out.max = -math.inf if d["max"] is None else float(d["max"])
        else:  # a record from before the max was kept
            out.max = None if out.count else -math.inf
        return out

    @classmethod
    def merged(cls, parts: Iterable[Distribution]) -> Distribution:
        out: Distribution | None = None
        for p in parts:
            if out is None:
                out = cls(p.scale)
            out.merge(p)
        return cls() if out is None else out
