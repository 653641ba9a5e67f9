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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["FitSums", "Fit", "NFit", "FIXED_SHARE", "fit_with_n", "fit_cells", "model_section",
           "fit_runs", "fit_set_state_ab", "render_fit", "load_fit_inputs"]

#: a phase whose k-dependent part (b times the mean k) is below this share of its mean cost
#: is reported as fixed cost
FIXED_SHARE = 0.05
_CONFIDENCE = 0.95


def _t(dof: int) -> float:
    from scipy import stats

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


def model_section(sums: Mapping[str, FitSums]) -> dict[str, Any]:
    """The ``model`` section of ``timing.json``: per key its fit and its sums (the sums
    let later tools merge runs and fit the dependence on N)."""
    return {"form": "ms = a + b * k per call, k = envs reset by the call (OLS, 95% intervals)",
            "fixed_share": FIXED_SHARE,
            "keys": {k: {"fit": s.fit().as_dict(), "sums": s.as_dict()}
                     for k, s in sums.items() if s.n}}


# -- ``resettrace fit RUN...`` ---------------------------------------------------------------
def _reset_path_keys() -> list[str]:
    from resettrace import catalog as C

    # reset_done and everything below it (the env step's other keys are not reset work)
    return [k for k in C.CATALOG.all_keys() if k.endswith("_ms")
            and (k not in C.ENV_STEP_KEYS or k == C.RESET_DONE.key)]


def fit_runs(runs: Sequence[tuple[str, int, Mapping[str, FitSums]]]) -> dict[str, Any]:
    """Per key: each run's fit and, with two or more env counts, the joint fit on N.

    ``runs``: ``(source, num_envs, sums per key)``, e.g. collector ``timing.json`` files at
    several ``--num-envs`` (runs at one env count are merged)."""
    by_n: dict[int, dict[str, FitSums]] = {}
    for _, num_envs, sums in runs:
        merged = by_n.setdefault(int(num_envs), {})
        for k, s in sums.items():
            merged.setdefault(k, FitSums()).merge(s)
    keys = [k for k in _reset_path_keys() if any(k in m for m in by_n.values())]
    out: dict[str, Any] = {}
    for k in keys:
        per_n = {n: m[k].fit() for n, m in sorted(by_n.items()) if k in m and m[k].n}
        if not per_n or all(not f.mean_ms for f in per_n.values()):
            continue
        joint = fit_with_n([(n, m[k]) for n, m in by_n.items() if k in m])
        out[k] = {"per_env_count": {str(n): f.as_dict() for n, f in per_n.items()},
                  "with_n": None if joint is None else joint.as_dict()}
    return {"sources": [s for s, _, _ in runs], "env_counts": sorted(by_n), "keys": out}


def fit_set_state_ab(data: Mapping[str, Any]) -> dict[str, Any]:
    """The joint fit ``a + b*k + c*N`` of the shipped set_state's p50 per cell of a
    ``bench set-state-ab`` JSON, per backend and key (and the set_state span itself)."""
    cells = data.get("cells") or []
    out: dict[str, Any] = {}
    for backend in sorted({c["backend"] for c in cells}):
        mine = [c for c in cells if c["backend"] == backend]
        keys: dict[str, Any] = {}
        series = {"set_state_ms": [(c["num_envs"], c["k"], c["optimized_ms"]) for c in mine]}
        for c in mine:
            for key, v in (c.get("keys") or {}).items():
                if v.get("optimized_ms") is not None:
                    series.setdefault(key, []).append((c["num_envs"], c["k"], v["optimized_ms"]))
        for key, points in series.items():
            if not any(ms for _, _, ms in points):
                continue
            joint = fit_cells(points)
            keys[key] = None if joint is None else joint.as_dict()
        fixed = [f for f in data.get("fixed_k") or [] if f.get("backend") == backend]
        out[backend] = {"cells": len(mine), "keys": keys, "fixed_k": fixed}
    return {"source": "bench set-state-ab", "backends": out}


def _pm(value: float | None, ci: Sequence[float] | None, scale: float = 1.0,
        digits: int = 4) -> str:
    if value is None:
        return "-"
    text = f"{scale * value:.{digits}f}"
    return text + (f" +-{scale * (ci[1] - value):.{digits}f}" if ci else "")


def render_fit(result: Mapping[str, Any]) -> str:
    from resettrace.tables import format_table

    if "backends" in result:  # a set-state-ab JSON
        parts = []
        for backend, r in result["backends"].items():
            rows = [[k, "-" if f is None else f"{f['a_ms']:.4f}",
                     "-" if f is None else f"{1e3 * f['b_ms']:.2f}",
                     "-" if f is None else _pm(f["c_ms_per_1k_envs"], f["c_ci"], 1e3, 2),
                     "-" if f is None else ("yes" if f["grows_with_n"] else "no")]
                    for k, f in r["keys"].items()]
            parts.append(format_table(
                f"{backend}: set_state p50 per cell ({r['cells']} cells) fitted as ms = a + "
                "b*k + c*N (b in us per env reset, c in us per 1,000 envs, 95% interval)",
                ["key", "a ms", "b us/env", "c us/1k envs", "grows with N"], rows))
            for f in r["fixed_k"]:
                parts.append(f"{backend}: k = {f['k']} on N = {f['num_envs']}: set_state p50 "
                             + " -> ".join(f"{ms:.4f}" for ms in f["optimized_ms"])
                             + f" ms (ratio {f['ratio']:.3f})")
        return "\n\n".join(parts)
    counts = result["env_counts"]
    rows = []
    for k, r in result["keys"].items():
        for n, f in r["per_env_count"].items():
            b = "k constant" if f["b_ms"] is None else (
                _pm(f["b_ms"], f["b_ci"], 1e3, 2) + (" (fixed)" if f["fixed"] else ""))
            joint = r["with_n"]
            rows.append([k, n, f["n"], f"{f['k_min']:.0f}-{f['k_max']:.0f}",
                         _pm(f["a_ms"], f["a_ci"]), b,
                         "-" if f["r2"] is None else f"{f['r2']:.3f}",
                         "-" if joint is None or n != str(counts[-1])
                         else _pm(joint["c_ms_per_1k_envs"], joint["c_ci"], 1e3, 2)
                         + (" grows" if joint["grows_with_n"] else "")])
    return format_table(
        "cost model per call: ms = a + b*k (a in ms, b in us per env reset; 95% intervals; "
        "fixed: the per-env part is not significant or under 5%)"
        + ("; c: a + b*k + c*N fitted over the env counts, us per 1,000 envs"
           if len(counts) > 1 else ""),
        ["key", "envs", "calls", "k", "a ms", "b us/env", "R2", "c us/1k envs"], rows)


def load_fit_inputs(paths: Sequence[str]) -> dict[str, Any]:
    """``resettrace fit``'s result for ``paths``: collector runs (``timing.json`` files or
    folders of them) or one ``bench set-state-ab`` JSON."""
    import json

    from resettrace.tables import timing_files

    files = timing_files(paths)
    runs: list[tuple[str, int, dict[str, FitSums]]] = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{f}: not readable JSON ({e})") from None
        if isinstance(data, dict) and "cells" in data:
            if len(files) > 1:
                raise ValueError(f"{f}: a set-state-ab JSON is fitted on its own")
            return fit_set_state_ab(data)
        model = data.get("model") if isinstance(data, dict) else None
        if not isinstance(model, dict) or not isinstance(model.get("keys"), dict):
            raise ValueError(f"{f}: no cost model (a timing.json from resettrace bench "
                             "collector has a 'model' section)")
        try:
            sums = {k: FitSums.from_dict(v["sums"]) for k, v in model["keys"].items()}
            num_envs = int(data["config"]["num_envs"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{f}: malformed cost model ({e})") from None
        runs.append((str(f), num_envs, sums))
    return fit_runs(runs)
