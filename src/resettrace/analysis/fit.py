"""``resettrace fit RUN...``: the cost model ``ms = a + b * k`` of every reset-path phase of
run records (collector ``timing.json`` files, a ``resettrace run`` job or process record,
folders of them), and with runs at two or more env counts the joint ``a + b*k + c*N``; or
the same joint fit of a ``bench set-state-ab`` JSON. The sums come from each record's
``model`` section (:mod:`resettrace.costmodel`); runs at one env count are merged. A run
whose env count is unknown (a process whose recorders did not say it) is fitted on its own
(``?`` in the table) and kept out of the fit on N.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from resettrace.costmodel import FitSums, fit_cells, fit_with_n

log = logging.getLogger("resettrace")

__all__ = ["fit_runs", "fit_set_state_ab", "render_fit", "load_fit_inputs"]


def _reset_path_keys(catalog: Any) -> list[str]:
    from resettrace import catalog as C

    # every timed key but the env step's own (physics, actions, update_state are not reset
    # work): reset_done and below it, and a user's phases elsewhere
    skip = set(C.ENV_STEP_KEYS) - {C.RESET_DONE.key}
    return [k for k in catalog.all_keys() if k.endswith("_ms") and k not in skip]


#: the env count of a run whose recorders did not say it
UNKNOWN_ENVS = 0


def fit_runs(runs: Sequence[tuple[str, int | None, Mapping[str, FitSums]]],
             catalog: Any = None) -> dict[str, Any]:
    """Per key: each env count's fit and, with two or more known env counts, the joint fit
    on N.

    ``runs``: ``(source, num_envs or None, sums per key)``, e.g. collector ``timing.json``
    files at several ``--num-envs`` (runs at one env count are merged); ``catalog``: the
    phases, in order (default: this process's)."""
    from resettrace import catalog as C

    by_n: dict[int, dict[str, FitSums]] = {}
    for _, num_envs, sums in runs:
        merged = by_n.setdefault(int(num_envs or UNKNOWN_ENVS), {})
        for k, s in sums.items():
            merged.setdefault(k, FitSums()).merge(s)
    cat = C.CATALOG if catalog is None else catalog
    keys = [k for k in _reset_path_keys(cat) if any(k in m for m in by_n.values())]
    out: dict[str, Any] = {}
    for k in keys:
        per_n = {n: m[k].fit() for n, m in sorted(by_n.items()) if k in m and m[k].n}
        if not per_n or all(not f.mean_ms for f in per_n.values()):
            continue
        joint = fit_with_n([(n, m[k]) for n, m in by_n.items()
                            if k in m and n != UNKNOWN_ENVS])
        out[k] = {"per_env_count": {(str(n) if n else "?"): f.as_dict()
                                    for n, f in per_n.items()},
                  "with_n": None if joint is None else joint.as_dict()}
    return {"sources": [s for s, _, _ in runs],
            "env_counts": sorted(n for n in by_n if n != UNKNOWN_ENVS), "keys": out}


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
                         "-" if joint is None or not counts or n != str(counts[-1])
                         else _pm(joint["c_ms_per_1k_envs"], joint["c_ci"], 1e3, 2)
                         + (" grows" if joint["grows_with_n"] else "")])
    return format_table(
        "cost model per call: ms = a + b*k (a in ms, b in us per env reset; 95% intervals; "
        "fixed: the per-env part is not significant or under 5%)"
        + ("; c: a + b*k + c*N fitted over the env counts, us per 1,000 envs"
           if len(counts) > 1 else ""),
        ["key", "envs", "calls", "k", "a ms", "b us/env", "R2", "c us/1k envs"], rows)


def load_fit_inputs(paths: Sequence[str]) -> dict[str, Any]:
    """``resettrace fit``'s result for ``paths``: run records (files, or folders of
    ``timing.json``) or one ``bench set-state-ab`` JSON."""
    from resettrace.record import RecordError, RunRecord, leave_out_jobs, load_json, record_files

    files = record_files(paths)
    runs: list[tuple[str, int | None, dict[str, FitSums]]] = []
    catalogs = []
    records = []
    for f in files:
        data = load_json(f)
        if isinstance(data, dict) and "cells" in data:
            if len(files) > 1:
                raise RecordError(f"{f}: a set-state-ab JSON is fitted on its own")
            try:
                return fit_set_state_ab(data)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise RecordError(f"{f}: a damaged bench set-state-ab JSON "
                                  f"({type(e).__name__}: {e})") from None
        records.append(RunRecord.from_json(data, str(f)))
    records, left_out = leave_out_jobs(records)  # a job beside its processes: once
    for line in left_out:
        log.warning("%s", line)
    for rec in records:
        source = rec.source
        keys = (rec.model or {}).get("keys")
        if not rec.model:
            raise RecordError(f"{source}: no cost model in this run record (a timing.json written "
                              "before resettrace kept one; run it again)")
        if not isinstance(keys, dict) or not keys:
            raise RecordError(f"{source}: no cost model in this run record (its 'model' section "
                              "is empty: no call with a reset count ran)")
        try:
            sums = {k: FitSums.from_dict(v["sums"]) for k, v in keys.items()}
        except (KeyError, TypeError, ValueError) as e:
            raise RecordError(f"{source}: malformed cost model ({e})") from None
        # a job's env count is the sum of its batches: the cost of a call is its batch's
        counts = rec.config.get("env_counts") if rec.kind == "job" else None
        n = counts[0] if isinstance(counts, list) and len(counts) == 1 else rec.num_envs
        runs.append((source, n, sums))
        catalogs.append(rec.catalog())
    from resettrace.catalog import Catalog

    return fit_runs(runs, Catalog.union(catalogs))
