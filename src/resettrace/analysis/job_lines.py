"""Text tables the analysis commands share: a job's line per rank, and per-key statistics
without the phases that never ran."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from resettrace import catalog as C
from resettrace.record import RunRecord, per_parent
from resettrace.tables import format_table

__all__ = ["render_job", "render_keys", "ran"]

#: the phases a job's per-rank line shows (those the job has)
_PER_RANK = (C.ENV_STEP.key, C.PHYSICS.key, C.RESET_DONE.key, C.SET_STATE.key)


def ran(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The keys that took time or counted something (a phase that never ran, or a
    canonical key at 0.0 in every call, is left out)."""
    return {k: s for k, s in stats.items()
            if s.get("count") and float(s.get("total_ms") or 0.0) != 0.0}


def render_keys(rec: RunRecord, title: str) -> str:
    """Per key that ran: count, calls per call of its parent, mean, p50 / p90 / p99, max,
    total and share of parent (ms; reset counts in envs), in the record's phase order, then
    how many were idle. A phase called several times under one parent (physics substeps,
    each manager's reset) has a sample per call: "per parent" says how many."""
    stats = rec.stats
    shown = ran(stats)
    cat = rec.catalog()
    rows = []
    for key, s in shown.items():
        share = s.get("share_of_parent")
        per = per_parent(stats, cat, key)
        rows.append([key, s["count"], float("nan") if per is None else per, s.get("mean_ms"),
                     s.get("p50_ms"), s.get("p90_ms"), s.get("p99_ms"), s.get("max_ms"),
                     s["total_ms"], float("nan") if share is None else 100.0 * share])
    table = format_table(title, ["key", "count", "per parent", "mean", "p50", "p90", "p99",
                                 "max", "total", "% of parent"], rows)
    idle = len(stats) - len(shown)
    return table + (f"\n({idle} keys that never took time not shown)" if idle else "")


def _p(stats: Mapping[str, Any], key: str, field: str = "p50_ms") -> float:
    v = (stats.get(key) or {}).get(field)
    return float("nan") if v is None else float(v)


def _percentile_note(job: RunRecord) -> str:
    """How the job's percentiles were had (:func:`resettrace.merging.merge_records`)."""
    err = job.extra.get("relative_error")
    exact = job.extra.get("exact_percentiles")
    shown = ran(job.stats)
    within = f"within {100 * err:.2f}%" if err else ""
    if exact is None:  # a job record from before exact percentiles
        return f"; the job's percentiles from the summed buckets, {within}" if err else ""
    if shown and all(k in exact for k in shown):
        return "; the job's percentiles exact, from every call"
    if any(k in exact for k in shown):
        return ("; the job's percentiles exact where every call's sample was kept, else "
                f"from the summed buckets, {within}")
    return f"; the job's percentiles from the summed buckets, {within}"


def _member(m: Mapping[str, Any]) -> Any:
    """A member's name in the job's table: its rank where its identity is one (``rank 3``:
    3), else its identity (``ray actor 5f0c...``), else its rank."""
    who = m.get("identity")
    if isinstance(who, str) and who:
        return who[len("rank "):] if who.startswith("rank ") else who
    return m.get("rank")


def _member_name(m: Mapping[str, Any]) -> str:
    who = m.get("identity")
    return str(who) if who else f"rank {m.get('rank')}"


def render_merge(job: RunRecord | dict[str, Any]) -> str:
    """``resettrace merge``'s output: :func:`render_job` of the job (or of its JSON)."""
    return render_job(job if isinstance(job, RunRecord) else RunRecord.from_json(job))


def render_job(job: RunRecord) -> str:
    """A job (a merged record): one line per process (its rank or identity, pid, env steps,
    env/s, reset share and the p50 of its main phases), the merged line, then the merged
    keys."""
    parts = []
    mixed = job.extra.get("mixed")
    if mixed:
        parts.append("MIXED configurations: " + "; ".join(mixed))
    twice = job.extra.get("duplicates")
    if twice:
        parts.append("DUPLICATE identities, merged anyway: " + "; ".join(map(str, twice)))
    members: Sequence[Mapping[str, Any]] = job.members
    snapshots = [m for m in members if m.get("complete") is False]
    if snapshots and "incomplete" not in job.extra:  # (resettrace run says its own line)
        parts.append("INCOMPLETE: " + "; ".join(
            f"{_member_name(m)} (pid {m.get('pid')}): a snapshot taken while it ran"
            + (f" (it may miss up to {m['period_s']:g} s, if it was killed then)"
               if m.get("period_s") else "") for m in snapshots))
    cols = [k for k in _PER_RANK if k in ran(job.stats)]
    tail = [C.SET_STATE.key] if C.SET_STATE.key in cols else []  # its p99 too
    cat = job.catalog()
    rows = []
    for m in members:
        s = m.get("stats") or {}
        rows.append([_member(m), m.get("pid"), m.get("env_steps"), m.get("env_per_s"),
                     None if m.get("reset_fraction") is None
                     else 100 * float(m["reset_fraction"]),
                     *[_p(s, k) for k in cols], *[_p(s, k, "p99_ms") for k in tail]])
    ms = job.stats
    rows.append(["job", len(members), job.env_steps, job.env_per_s,
                 None if job.reset_fraction is None else 100 * float(job.reset_fraction),
                 *[_p(ms, k) for k in cols], *[_p(ms, k, "p99_ms") for k in tail]])
    note = _percentile_note(job)
    parts.append(format_table(
        f"{len(members)} process{'' if len(members) == 1 else 'es'} (p50/p99 in ms{note}; "
        "the job's env steps and env/s: the sums)",
        ["member", "pid", "env steps", "env/s", "reset %",
         *[f"{cat.label(k)} p50" for k in cols], *[f"{cat.label(k)} p99" for k in tail]],
        rows))
    parts.append(render_keys(job, f"the job, per key ({job.title}; ms)"))
    return "\n\n".join(parts)
