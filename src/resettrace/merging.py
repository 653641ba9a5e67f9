"""Many run records as one job: ``resettrace merge RUN... -o merged.json`` and
``resettrace run``'s job record.

Each run is a run record (a collector ``timing.json``, ``resettrace run``'s per-process
records, ...); a folder stands for every run record under it (each ``timing.json``, and
each other ``*.json`` that is a record: ``resettrace run --stats-json out/job.json`` leaves
``job.json`` and a ``job.PID.json`` per process there). A job record whose processes'
records are among the runs is left out, said in one line (merged with them it would count
every call twice); one with only some of them there is refused. One process's record
given twice is refused; two processes that claim one identity (two "rank 0": the records
of two jobs?) are refused unless ``allow_duplicates``, which merges them and lists them in
the job (``extra["duplicates"]``).

Merged per key (:func:`merge_records`): counts and totals add, the max
is the largest, the mergeable buckets (``dist``, :mod:`resettrace.distribution`) add.
p50 / p90 / p99 follow the one rule every resettrace percentile follows (numpy's linear
definition): exact from every call's value when each run kept all of its samples of the
key (up to 20,000), else read from the merged buckets within
:data:`~resettrace.distribution.RELATIVE_ERROR` (0.54%; 1.09% when a run from before was
written with scale 5 buckets; the job states its bound in ``extra["relative_error"]``).
The cost model's sums add too (``model``). env/s and env steps add: the workers ran at
once; the env count is the sum of the batches the workers step. The result is itself a run
record (kind ``job``, with a line per worker in ``members``), which every other command
reads.

Runs of different configurations (task, backend, envs, model, randomization, control_dt,
mode) are refused unless ``allow_mixed``: a merged p99 of two different jobs means nothing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resettrace.record import (
    CONFIG_FIELDS,
    MAX_RECORD_SAMPLES,
    RecordError,
    RunRecord,
    identity_of,
    leave_out_jobs,
    name_of,
    read_records,
    set_shares,
    thin,
)

__all__ = ["merge_records", "merge_runs", "load_runs", "config_differences", "duplicates",
           "member_summary", "same_process"]


def config_differences(records: Sequence[RunRecord]) -> list[str]:
    """The configuration fields on which ``records`` differ, with their values. A record
    that does not know a field does not differ on it; nor, on the env count, does one that
    never steps the batch beside one that does (a Gymnasium or SB3 worker that resets its
    sub-envs, one each: the batch is its main process's)."""
    configs = [dict(r.config or {}, mode=r.mode) for r in records]
    stepping = [c for c, r in zip(configs, records, strict=True) if r.env_steps > 0]
    out = []
    for k in CONFIG_FIELDS:
        which = stepping if k == "num_envs" and stepping else configs
        values = {json.dumps(c.get(k)) for c in which if c.get(k) is not None}
        if len(values) > 1:
            out.append(f"{k}: " + ", ".join(sorted(values)))
    return out


def member_summary(r: RunRecord) -> dict[str, Any]:
    """One process's line in a job: who it was (its host, pid and start identify it: a
    job read beside its processes' records is then known as theirs) and what it did."""
    return {"source": r.source, "host": r.host, "pid": r.pid, "start": r.start,
            "parent_pid": r.parent_pid, "rank": r.rank,
            "identity": identity_of(r) if r.kind != "job" else None,
            "kind": r.kind, "command": r.command, "env_steps": r.env_steps,
            "env_per_s": r.env_per_s, "reset_fraction": r.reset_fraction,
            "steps": (r.config or {}).get("steps"), "interrupted": r.interrupted,
            "num_envs": r.num_envs, "complete": r.complete, "snapshot_at": r.snapshot_at,
            "period_s": r.period_s, "stats": r.stats}


def _process_key(m: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies a job's member line (see :func:`is_member`)."""
    if m.get("kind") == "job":
        return ("job", Path(str(m.get("source") or "")).name, m.get("start"),
                m.get("env_steps"))
    if "start" in m:
        return ("process", m.get("host"), m.get("pid"), m.get("start"))
    return ("file", Path(str(m.get("source") or "")).name, m.get("pid"))


def duplicates(records: Sequence[RunRecord]) -> list[str]:
    """The identities (:func:`identity_of`) that two or more processes among ``records``
    claim, one line each: ``"rank 0: pid 11 (a.json), pid 12 (b.json)"``. A job record
    counts as a unit of its own (two jobs each have a rank 0), and records of one process
    (the sessions of one pytest run, say) are one claim. Raises a :class:`RecordError`
    naming both sources where one process's record is there twice, or two job records
    share a process: merged, they would count its calls twice."""
    for i, a in enumerate(records):
        for b in records[i + 1:]:
            if a.source and b.source and Path(a.source).resolve() == Path(b.source).resolve():
                raise RecordError(f"{name_of(a)}: given twice: merged, it would count its "
                                  "calls twice")
            if a.kind != "job" and b.kind != "job" and same_process(a, b):
                raise RecordError(f"{name_of(a)} and {name_of(b)}: the same process's record "
                                  f"twice (pid {a.pid} on {a.host or 'an unknown host'}, "
                                  "started at the same time): merged, it would count its "
                                  "calls twice")
            if a.kind == b.kind == "job" and a.members and b.members:
                shared = ({_process_key(m) for m in a.members}
                          & {_process_key(m) for m in b.members})
                if shared:
                    raise RecordError(f"{name_of(a)} and {name_of(b)}: job records that share "
                                      f"{len(shared)} process{'' if len(shared) == 1 else 'es'}"
                                      " (the same job twice?): merged, they would count "
                                      "their calls twice")
    claims: dict[str, dict[tuple[str, int | None], RunRecord]] = {}
    for r in records:
        if r.kind != "job":
            claims.setdefault(identity_of(r), {}).setdefault((r.host, r.pid), r)
    return [f"{who}: " + ", ".join(f"pid {r.pid} ({Path(r.source).name or 'no file'})"
                                   for r in by.values())
            for who, by in claims.items() if len(by) > 1]


def _pool(parts: Sequence[tuple[Sequence[float], int]],
          limit: int = MAX_RECORD_SAMPLES) -> list[float]:
    """The samples of ``parts`` (each: a record's samples of a key and its call count) as
    one record's: each part's kept in proportion to its calls (a sample then stands for
    as many calls in every part: a part thinned more does not weigh less), at most
    ``limit``, each part's evenly thinned in call order."""
    calls = sum(c for _, c in parts)
    have = [(s, c) for s, c in parts if len(s)]
    if not have:
        return []
    # calls per kept sample: the most any part's samples stand for, and the limit's
    per = max(calls / limit, max(c / len(s) for s, c in have), 1.0)
    out: list[float] = []
    for s, c in have:
        out += thin(s, min(len(s), math.floor(c / per + 1e-9)))
    return out


def merge_records(records: Sequence[RunRecord], *, allow_mixed: bool = False,
                  allow_duplicates: bool = False,
                  command: Sequence[str] | None = None) -> RunRecord:
    """The job record of ``records`` (workers of one job).

    Per key: counts and totals add, the max is the largest, the buckets and the cost
    model's sums add. p50 / p90 / p99 follow :mod:`resettrace.distribution`'s rule: exact
    (numpy's linear definition over every call) when every record's ``samples`` of the key
    are complete (as many as its calls), else read from the summed buckets within
    ``extra["relative_error"]`` (0.54%; 1.09% where a record of scale 5 buckets is merged);
    ``extra["exact_percentiles"]`` names the exact ones. env/s and env steps add (the
    workers ran at once); the env count is the sum of the members' that step a batch
    (those that only reset envs, a Gymnasium or SB3 worker, do not: their main process
    steps the batch), else of the known ones (``config["env_counts"]``: the members' batch
    sizes). Samples are pooled, each record's in proportion to its calls (at most
    :data:`MAX_RECORD_SAMPLES`).

    Refused (:class:`RecordError`, one line): no records; runs of different configurations
    unless ``allow_mixed``; one process's record twice, or job records that share a
    process; two processes that claim one identity (:func:`duplicates`, two "rank 0")
    unless ``allow_duplicates`` (then listed in ``extra["duplicates"]``); a job record with
    part of its processes among ``records``. A job record with all of them there is left
    out (:func:`leave_out_jobs`), said in ``extra["left_out"]``; a process record with no
    statistics (a run's main process that recorded nothing) is no member."""
    from resettrace import catalog as C
    from resettrace.catalog import Catalog
    from resettrace.costmodel import FitSums, model_section
    from resettrace.distribution import Distribution, percentile, relative_error

    if not records:
        raise RecordError("no runs to merge")
    records, left_out = leave_out_jobs(records)
    # the record of a ``resettrace run``'s main process that recorded nothing (it lists
    # only the targets it never imported) is no member
    records = [r for r in records if r.stats or r.kind != "process"] or records
    differ = config_differences(records)
    if differ and not allow_mixed:
        raise RecordError("the runs have different configurations (" + "; ".join(differ)
                          + "): --allow-mixed merges them anyway")
    twice = duplicates(records)
    if twice and not allow_duplicates:
        raise RecordError("two processes claim one identity (" + "; ".join(twice)
                          + "): records of different jobs? --allow-duplicates merges them "
                          "anyway")
    stats: dict[str, dict[str, Any]] = {}
    dists: dict[str, Distribution] = {}
    sums: dict[str, FitSums] = {}
    phases: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.stats and not r.dist:
            raise RecordError(f"{r.source or 'a run'}: no buckets ('dist') to merge: a "
                              "timing.json written before resettrace kept them; run it again")
        for p in r.phases:
            known = phases.setdefault(p["span"], p)
            if (known.get("parent"), known.get("key")) != (p.get("parent"), p.get("key")):
                raise RecordError(f"{r.source or 'a run'}: phase {p['span']!r} has another "
                                  f"parent or key than in the other runs")
        for key, s in r.stats.items():
            m = stats.setdefault(key, {"count": 0, "total_ms": 0.0, "max_ms": -math.inf})
            m["count"] += int(s["count"])
            m["total_ms"] += float(s["total_ms"])
            m["max_ms"] = max(m["max_ms"], float(s.get("max_ms", -math.inf)))
        for key, raw in r.dist.items():
            d = Distribution.from_dict(raw)
            if key in dists:
                dists[key].merge(d)
            else:
                dists[key] = d
        for key, v in ((r.model or {}).get("keys") or {}).items():
            sums.setdefault(key, FitSums()).merge(FitSums.from_dict(v["sums"]))
    exact: list[str] = []
    samples: dict[str, list[float]] = {}
    for key, m in stats.items():
        dist = dists.get(key)
        if dist is not None and dist.count != m["count"]:
            raise RecordError(f"{key}: the distributions hold {dist.count} calls, the counts "
                              f"{m['count']}: a run is inconsistent")
        m["mean_ms"] = m["total_ms"] / m["count"] if m["count"] else float("nan")
        if m["max_ms"] == -math.inf:
            m["max_ms"] = float("nan")
        parts = [(r.samples.get(key) or [], int(r.stats[key]["count"])) for r in records
                 if key in r.stats]
        if m["count"] and all(len(s) == c for s, c in parts):  # every call's value: exact
            pooled = sorted(x for s, _ in parts for x in s)
            for q in (50, 90, 99):
                m[f"p{q}_ms"] = percentile(pooled, q)
            exact.append(key)
        else:
            if dist is not None and dist.max is None and math.isfinite(m["max_ms"]):
                dist.max = m["max_ms"]  # a record from before the buckets kept it: exact
            for q in (50, 90, 99):
                m[f"p{q}_ms"] = dist.quantile(q / 100) if dist is not None and dist.count \
                    else None
        if any(s for s, _ in parts):
            samples[key] = _pool(parts)
    cat = RunRecord(phases=list(phases.values())).catalog() if phases else Catalog()
    order = {k: i for i, k in enumerate(cat.all_keys())}
    ordered = sorted(stats, key=lambda k: (order.get(k, len(order)), k))
    set_shares(stats, cat)
    steps = sum(r.env_steps for r in records)
    first = records[0]
    configured = [r for r in records if r.config]
    config = {k: v for k, v in (configured[0].config if configured else {}).items()
              if all(r.config.get(k) in (v, None) for r in configured)}
    # the envs of the job: each batch once, as its stepping process knows it
    counted = [r for r in records if r.env_steps > 0] or list(records)
    batches = [r.num_envs for r in counted if r.num_envs]
    config.pop("num_envs", None)
    config.pop("env_counts", None)
    if batches:
        config["num_envs"] = sum(batches)
        config["env_counts"] = sorted({n for r in counted if r.num_envs
                                       for n in (r.config.get("env_counts") or [r.num_envs])})
    reset = [(r.reset_fraction, _env_steps_envs(r)) for r in records
             if r.reset_fraction is not None]
    weight = sum(w for _, w in reset)
    # resets of workers that never step the batch (Gymnasium's async workers reset their
    # sub-envs; the main process steps them) count against the job's env steps
    stepless = sum(float((r.stats.get(C.RESET_DONE_COUNT) or {}).get("total_ms", 0.0))
                   for r in records if not r.env_steps)
    scale = min((d.scale for d in dists.values()), default=None)
    extra: dict[str, Any] = {
        "mixed": differ,
        "relative_error": relative_error() if scale is None else relative_error(scale),
        "exact_percentiles": [k for k in ordered if k in exact]}
    if twice:
        extra["duplicates"] = twice
    if left_out:
        extra["left_out"] = left_out
    devices = sorted({str(d) for r in records for d in r.extra.get("devices") or ()})
    if devices:  # the accelerators any member's counts lived on
        extra["devices"] = devices
    on_device: list[dict[str, Any]] = [r.extra["device_counts"] for r in records
                                       if isinstance(r.extra.get("device_counts"), dict)]
    if on_device:  # masks counted on a device: how many of those counts arrived, job-wide
        extra["device_counts"] = {k: sum(v for dc in on_device if type(v := dc.get(k)) is int)
                                  for k in ("deferred", "arrived", "lost", "pending")}
    return RunRecord(
        kind="job", mode=first.mode,
        command=list(command) if command is not None else first.command,
        config=config, host=first.host, pid=None, rank=None,
        start=min((r.start for r in records if r.start is not None), default=None),
        wall_s=max((r.wall_s for r in records if r.wall_s is not None), default=None),
        version=first.version, run_id=first.run_id,
        phases=[phases[p.span] for p in cat if p.span in phases],
        stats={k: stats[k] for k in ordered},
        dist={k: dists[k].as_dict() for k in ordered if k in dists},
        samples=samples,
        model=model_section({k: sums[k] for k in ordered if k in sums}),
        env_steps=steps,
        traces_dropped=sum(r.traces_dropped for r in records),
        env_per_s=sum(float(r.env_per_s or 0.0) for r in records) or None,
        reset_fraction=(sum(f * w for f, w in reset) + stepless) / weight if weight
        else None,
        sim=first.sim, members=[member_summary(r) for r in records],
        extra=extra)


def _env_steps_envs(r: RunRecord) -> float:
    """Envs x env steps of ``r``: a job's from its reset fraction (envs reset over
    this), else its members' (each its own batch); not its env count times its steps
    (both sums)."""
    from resettrace import catalog as C

    if r.kind == "job" and r.members:
        resets = float((r.stats.get(C.RESET_DONE_COUNT) or {}).get("total_ms", 0.0))
        if r.reset_fraction and resets:
            return resets / r.reset_fraction
        return float(sum(int(m.get("env_steps") or 0) * int(m.get("num_envs") or 0)
                         for m in r.members))
    return float(r.env_steps * (r.num_envs or 0))


def same_process(a: RunRecord, b: RunRecord) -> bool:
    """Whether ``a`` and ``b`` are records of one process (its host, pid and start)."""
    return (a.pid is not None and a.pid == b.pid and a.host == b.host
            and a.start == b.start)


def load_runs(paths: Sequence[str | os.PathLike[str]]) -> list[RunRecord]:
    """The records named by ``paths`` (files, or folders of run records), job records
    included (:func:`merge_runs` leaves out those of the other runs, and says so)."""
    return read_records(paths, keep_jobs=True)


def merge_runs(runs: Sequence[RunRecord], *, allow_mixed: bool = False,
               allow_duplicates: bool = False) -> RunRecord:
    """``resettrace merge``'s job record of ``runs`` (the job records left out:
    ``extra["left_out"]``)."""
    return merge_records(runs, allow_mixed=allow_mixed, allow_duplicates=allow_duplicates,
                         command=["resettrace", "merge"])
