"""The cost model of each phase: ``ms = a + b * k`` per call, k the envs that call reset.

``a`` is the fixed cost of a call (the Python boundary, O(N) work, engine call overhead),
``b`` the cost per reset row. The fit is ordinary least squares over every call, kept as
exact running sums (:class:`FitSums`: count, sums of k, k², y, k·y, y² and the k range),
so that it costs the processor a few numpy sums per fold, needs no samples, and merges
across runs and workers by addition. It models the *mean* cost at k: timing spikes stay
in it and widen its intervals, as they should.

Reported per key (:class:`Fit`): a and b with their standard errors and 95% intervals
(Student t), R², the k range, and ``fixed`` when the per-row part does not matter: b's
interval holds 0, or b times the mean k is under :data:`FIXED_SHARE` of the mean cost.

Across runs at several env counts N (collector runs, or a ``bench set-state-ab`` JSON),
:func:`fit_with_n` fits ``ms = a + b * k + c * N`` jointly (exact, from the same sums:
N is constant within a run), so that work that grows with N rather than k shows as c.
This module holds what a run keeps (the sums, the fits); ``resettrace fit`` over run
records is :mod:`resettrace.analysis.fit`.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from resettrace.extras import need

__all__ = ["FitSums", "Fit", "NFit", "FIXED_SHARE", "fit_with_n", "fit_cells", "model_section"]

#: a phase whose k-dependent part (b times the mean k) is below this share of its mean cost
#: is reported as fixed cost
FIXED_SHARE = 0.05
_CONFIDENCE = 0.95


def _t(dof: int) -> float:
    stats = need("scipy.stats", "report", "the cost model's intervals")
    return float(stats.t.ppf(0.5 + _CONFIDENCE / 2, dof)) if dof > 0 else math.inf


class FitSums:
    """Exact running sums of one key's (k, ms) calls."""

    __slots__ = ("n", "sk", "skk", "sy", "sky", "syy", "kmin", "kmax")

    def __init__(self) -> None:
        self.n = 0
        self.sk = self.skk = self.sy = self.sky = self.syy = 0.0
        self.kmin = math.inf
        self.kmax = -math.inf

    def add(self, k: np.ndarray, y: np.ndarray) -> None:
        if not len(k):
            return
        self.n += len(k)
        self.sk += float(k.sum())
        self.skk += float(k @ k)
        self.sy += float(y.sum())
        self.sky += float(k @ y)
        self.syy += float(y @ y)
        self.kmin = min(self.kmin, float(k.min()))
        self.kmax = max(self.kmax, float(k.max()))

    @staticmethod
    def add_rows(sums: Sequence[FitSums], k: np.ndarray, y: np.ndarray | None,
                 sy: np.ndarray | None = None) -> None:
        """``sums[j].add(k, y[j])`` for every row ``j`` of ``y``, ``(len(sums), len(k))``:
        the sums of ``k`` once, those of ``y`` in one pass per kind over each row (numpy's
        own loops, not BLAS: a product this size would wake BLAS's threads, CPU taken
        from training on the aggregation thread's behalf). ``sy``: the rows' sums, when
        already known; ``y`` None: rows of zeros."""
        if not len(k) or not len(sums):
            return
        n, sk, skk = len(k), float(k.sum()), float(np.einsum("i,i->", k, k))
        kmin, kmax = float(k.min()), float(k.max())
        if y is None:
            sy_ = sky = syy = [0.0] * len(sums)
        else:
            sy_ = (y.sum(axis=1) if sy is None else sy).tolist()
            sky = np.einsum("ji,i->j", y, k).tolist()
            syy = np.einsum("ji,ji->j", y, y).tolist()
        for j, s in enumerate(sums):
            s.n += n
            s.sk += sk
            s.skk += skk
            s.sy += sy_[j]
            s.sky += sky[j]
            s.syy += syy[j]
            s.kmin = min(s.kmin, kmin)
            s.kmax = max(s.kmax, kmax)

    def merge(self, other: FitSums) -> None:
        for f in ("n", "sk", "skk", "sy", "sky", "syy"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.kmin = min(self.kmin, other.kmin)
        self.kmax = max(self.kmax, other.kmax)

    def copy(self) -> FitSums:
        out = FitSums()
        out.merge(self)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "sum_k": self.sk, "sum_k2": self.skk, "sum_ms": self.sy,
                "sum_k_ms": self.sky, "sum_ms2": self.syy,
                "k_min": self.kmin if self.n else None, "k_max": self.kmax if self.n else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitSums:
        out = cls()
        out.n = int(d["n"])
        out.sk, out.skk = float(d["sum_k"]), float(d["sum_k2"])
        out.sy, out.sky, out.syy = float(d["sum_ms"]), float(d["sum_k_ms"]), float(d["sum_ms2"])
        if out.n:
            out.kmin, out.kmax = float(d["k_min"]), float(d["k_max"])
        return out

    def fit(self) -> Fit:
        """OLS of ms on k (see the module docstring)."""
        n = self.n
        mean_k = self.sk / n if n else math.nan
        mean_y = self.sy / n if n else math.nan
        sxx = max(self.skk - self.sk * mean_k, 0.0) if n else 0.0
        syy = max(self.syy - self.sy * mean_y, 0.0) if n else 0.0
        sxy = self.sky - self.sk * mean_y if n else 0.0
        if n < 3 or sxx <= 1e-12 * max(1.0, self.skk):  # k never varied: a and b inseparable
            return Fit(n=n, a_ms=mean_y, b_ms=None, a_se=None, b_se=None, a_ci=None, b_ci=None,
                       r2=None, k_min=self.kmin if n else None,
                       k_max=self.kmax if n else None, k_mean=mean_k, mean_ms=mean_y,
                       per_k_share=None, fixed=True)
        b = sxy / sxx
        a = mean_y - b * mean_k
        sse = max(syy - b * sxy, 0.0)
        r2 = 1.0 - sse / syy if syy > 0 else None
        s2 = sse / (n - 2)
        b_se = math.sqrt(s2 / sxx)
        a_se = math.sqrt(s2 * (1.0 / n + mean_k * mean_k / sxx))
        t = _t(n - 2)
        share = b * mean_k / mean_y if mean_y > 0 else None
        fixed = abs(b) <= t * b_se or (share is not None and abs(share) < FIXED_SHARE)
        return Fit(n=n, a_ms=a, b_ms=b, a_se=a_se, b_se=b_se,
                   a_ci=(a - t * a_se, a + t * a_se), b_ci=(b - t * b_se, b + t * b_se),
                   r2=r2, k_min=self.kmin, k_max=self.kmax, k_mean=mean_k, mean_ms=mean_y,
                   per_k_share=share, fixed=fixed)


@dataclass(frozen=True)
class Fit:
    """``ms = a + b * k`` of one key (``b`` None: k never varied, ``a`` is the mean)."""

    n: int
    a_ms: float
    b_ms: float | None
    a_se: float | None
    b_se: float | None
    a_ci: tuple[float, float] | None
    b_ci: tuple[float, float] | None
    r2: float | None
    k_min: float | None
    k_max: float | None
    k_mean: float
    mean_ms: float
    #: b times the mean k over the mean cost: the share of a call that scales with k
    per_k_share: float | None
    fixed: bool

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for f in ("a_ci", "b_ci"):
            d[f] = None if d[f] is None else list(d[f])
        return d


@dataclass(frozen=True)
class NFit:
    """``ms = a + b * k + c * N`` over runs at several env counts (c per 1,000 envs)."""

    n: int
    env_counts: list[int]
    a_ms: float
    b_ms: float
    c_ms_per_1k_envs: float
    a_se: float
    b_se: float
    c_se: float
    c_ci: tuple[float, float]
    #: c's interval excludes 0: the phase does work that grows with N at fixed k
    grows_with_n: bool
    #: c * N at the largest N over the mean cost there: how much of a call that is
    n_share: float | None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["c_ci"] = list(d["c_ci"])
        return d


def fit_with_n(runs: Sequence[tuple[int, FitSums]]) -> NFit | None:
    """Joint OLS over runs ``(num_envs, sums)`` of one key; None with fewer than two env
    counts or too few calls."""
    counts = sorted({int(n) for n, s in runs if s.n})
    total = sum(s.n for _, s in runs)
    if len(counts) < 2 or total < 4:
        return None
    xtx = np.zeros((3, 3))
    xty = np.zeros(3)
    syy = 0.0
    for num_envs, s in runs:
        if not s.n:
            continue
        m = num_envs / 1000.0
        xtx += np.array([[s.n, s.sk, m * s.n], [s.sk, s.skk, m * s.sk],
                         [m * s.n, m * s.sk, m * m * s.n]])
        xty += np.array([s.sy, s.sky, m * s.sy])
        syy += s.syy
    try:
        inv = np.linalg.inv(xtx)
    except np.linalg.LinAlgError:
        return None
    beta = inv @ xty
    sse = max(syy - float(beta @ xty), 0.0)
    dof = total - 3
    if dof <= 0:
        return None
    cov = inv * (sse / dof)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    t = _t(dof)
    a, b, c = (float(x) for x in beta)
    c_ci = (c - t * float(se[2]), c + t * float(se[2]))
    big = max(counts)
    at_big = [s for n, s in runs if n == big and s.n]
    mean_big = sum(s.sy for s in at_big) / sum(s.n for s in at_big)
    return NFit(n=total, env_counts=counts, a_ms=a, b_ms=b, c_ms_per_1k_envs=c,
                a_se=float(se[0]), b_se=float(se[1]), c_se=float(se[2]), c_ci=c_ci,
                grows_with_n=not (c_ci[0] <= 0.0 <= c_ci[1]),
                n_share=c * big / 1000.0 / mean_big if mean_big > 0 else None)


def fit_cells(cells: Iterable[tuple[int, int, float]]) -> NFit | None:
    """The same joint fit over ``(num_envs, k, ms)`` points, one per call group (e.g. the
    p50 of each cell of a ``bench set-state-ab`` run)."""
    by_n: dict[int, FitSums] = {}
    for num_envs, k, ms in cells:
        s = by_n.setdefault(int(num_envs), FitSums())
        s.add(np.array([float(k)]), np.array([float(ms)]))
    return fit_with_n(sorted(by_n.items()))


def model_section(sums: Mapping[str, FitSums], *, fit: bool = True) -> dict[str, Any]:
    """The ``model`` section of ``timing.json``: per key its fit and its sums (the sums
    let later tools merge runs and fit the dependence on N). ``fit`` false: the sums only
    (``fit`` null; a snapshot of a running process, which never loads SciPy for it; and
    without SciPy, the ``report`` extra: ``resettrace fit`` and ``report`` fit the sums)."""
    fit = fit and importlib.util.find_spec("scipy") is not None
    return {"form": "ms = a + b * k per call, k = envs reset by the call (OLS, 95% intervals)",
            "fixed_share": FIXED_SHARE,
            "keys": {k: {"fit": s.fit().as_dict() if fit else None, "sums": s.as_dict()}
                     for k, s in sums.items() if s.n}}
