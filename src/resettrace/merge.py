"""``resettrace merge RUN... -o merged.json``: the collector runs of many workers as one job.

Each run (a ``timing.json``; a folder stands for every one under it) keeps, per key, its
exact count, total and max and its calls in mergeable exponential buckets (``dist``,
:mod:`resettrace.distribution`). Merged per key: counts and totals add, the max is the
largest, the buckets add, and p50 / p90 / p99 are read from the merged buckets, within
:data:`~resettrace.distribution.RELATIVE_ERROR` (1.09%) of the percentile of all the calls
together. The cost model's sums add too (``model``). env/s adds: the workers ran at once.

Runs of different configurations (task, backend, envs, model, randomization, control_dt,
mode) are refused unless ``allow_mixed``: a merged p99 of two different jobs means nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resettrace import catalog as C
from resettrace.compare import CONFIG_FIELDS
from resettrace.costmodel import FitSums, model_section
from resettrace.distribution import RELATIVE_ERROR, Distribution
from resettrace.tables import format_table, timing_files

__all__ = ["merge_runs", "load_timing_files", "render_merge"]



def load_timing_files(paths: Sequence[str | Path]) -> list[tuple[str, dict[str, Any]]]:
    files = timing_files(paths)
    out = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{f}: not a readable timing.json ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("dist"), dict):
            raise ValueError(f"{f}: no mergeable distributions (a timing.json from "
                             "resettrace bench collector has a 'dist' section)")
        out.append((str(f), data))
    return out


def merge_runs(runs: Sequence[tuple[str, Mapping[str, Any]]], *,
               allow_mixed: bool = False) -> dict[str, Any]:
    """Per-rank facts and the merged statistics of ``runs`` (``(source, timing.json)``)."""
    if not runs:
        raise ValueError("no runs to merge")
    configs = [dict(d.get("config") or {}) for _, d in runs]
    differ = [f"{k}: " + ", ".join(sorted({json.dumps(c.get(k)) for c in configs}))
              for k in CONFIG_FIELDS if len({json.dumps(c.get(k)) for c in configs}) > 1]
    if differ and not allow_mixed:
        raise ValueError("the runs have different configurations (" + "; ".join(differ)
                         + "): --allow-mixed merges them anyway")
    ranks: list[dict[str, Any]] = []
    stats: dict[str, dict[str, Any]] = {}
    dists: dict[str, Distribution] = {}
    sums: dict[str, FitSums] = {}
    for source, d in runs:
        ranks.append({"source": source, "rank": d.get("rank"), "env_per_s": d.get("env_per_s"),
                      "interrupted": d.get("interrupted"),
                      "steps": (d.get("config") or {}).get("steps"),
                      "reset_fraction": d.get("reset_fraction"),
                      "stats": d.get("stats") or {}})
        for key, s in (d.get("stats") or {}).items():
            m = stats.setdefault(key, {"count": 0, "total_ms": 0.0, "max_ms": float("-inf")})
            m["count"] += int(s["count"])
            m["total_ms"] += float(s["total_ms"])
            m["max_ms"] = max(m["max_ms"], float(s["max_ms"]))
        for key, raw in d["dist"].items():
            dists.setdefault(key, Distribution()).merge(Distribution.from_dict(raw))
        for key, v in ((d.get("model") or {}).get("keys") or {}).items():
            sums.setdefault(key, FitSums()).merge(FitSums.from_dict(v["sums"]))
    for key, m in stats.items():
        dist = dists.get(key)
        m["mean_ms"] = m["total_ms"] / m["count"] if m["count"] else float("nan")
        for q in (50, 90, 99):
            m[f"p{q}_ms"] = dist.quantile(q / 100) if dist is not None else None
        if dist is not None and dist.count != m["count"]:
            raise ValueError(f"{key}: the distributions hold {dist.count} calls, the counts "
                             f"{m['count']}: a run is inconsistent")
    order = {k: i for i, k in enumerate(C.CATALOG.all_keys())}
    ordered = sorted(stats, key=lambda k: (order.get(k, len(order)), k))
    return {
        "runs": [s for s, _ in runs],
        "mixed": differ,
        "relative_error": RELATIVE_ERROR,
        "ranks": ranks,
        "merged": {
            "workers": len(runs),
            "env_per_s": sum(float(r["env_per_s"] or 0.0) for r in ranks),
            "stats": {k: stats[k] for k in ordered},
            "dist": {k: dists[k].as_dict() for k in ordered if k in dists},
            "model": model_section({k: sums[k] for k in ordered if k in sums}),
        },
    }


_SHOWN = (C.ENV_STEP.key, C.PHYSICS.key, C.RESET_DONE.key, C.SET_STATE.key)


def render_merge(result: Mapping[str, Any]) -> str:
    parts = []
    if result["mixed"]:
        parts.append("MIXED configurations: " + "; ".join(result["mixed"]))
    rows = []
    for r in result["ranks"]:
        s = r["stats"]
        rows.append([r["rank"], r["env_per_s"], r["steps"], 100 * float(r["reset_fraction"] or 0.0),
                     *[s.get(k, {}).get("p50_ms", float("nan")) for k in _SHOWN],
                     s.get(C.SET_STATE.key, {}).get("p99_ms", float("nan"))])
    m = result["merged"]
    ms = m["stats"]
    rows.append(["merged", m["env_per_s"], sum(int(r["steps"] or 0) for r in result["ranks"]),
                 float("nan"), *[ms.get(k, {}).get("p50_ms", float("nan")) for k in _SHOWN],
                 ms.get(C.SET_STATE.key, {}).get("p99_ms", float("nan"))])
    parts.append(format_table(
        f"{m['workers']} workers (p50/p99 in ms; merged percentiles from the summed buckets, "
        f"within {100 * result['relative_error']:.2f}%; env/s of the merged row: the sum)",
        ["rank", "env/s", "steps", "reset %", "env_step p50", "physics p50", "reset_done p50",
         "set_state p50", "set_state p99"], rows))
    table = [[k, s["count"], s["mean_ms"], s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"]]
             for k, s in ms.items() if k.endswith("_ms")]
    parts.append(format_table("merged, per key (ms)",
                              ["key", "count", "mean", "p50", "p90", "p99", "max"], table))
    return "\n\n".join(parts)
