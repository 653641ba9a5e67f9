"""The run record: what one run (or one job of many processes) measured, in one file.

Every tool that writes a run writes a :class:`RunRecord` (``bench collector``'s
``timing.json``, the pytest plugin's ``--resettrace-json``, ``resettrace run
--stats-json``, :func:`write_run`, and every process that has ``RESETTRACE_RUN_JSON`` set,
at exit), and every tool that reads runs reads it (``compare``, ``report``, ``merge``,
``fit``: :mod:`resettrace.analysis`). A record holds:

- what ran: ``kind`` (``collector``, ``process``, ``job``), the command line, the
  collector's ``config`` (task, backend, model, ...; a process's only holds ``num_envs``
  when its recorders said it), host, pid, parent pid, rank, start (Unix seconds), wall
  time and the resettrace version;
- ``mode`` and the ``phases`` its keys belong to (span, parent, key, gap key: built-in and
  registered ones), so a reader rebuilds the phase tree without importing the user's code;
- per key: ``stats`` (count, mean, p50/p90/p99, max, total, share of parent), ``dist``
  (mergeable exponential buckets: :mod:`resettrace.distribution`), ``samples`` (at most
  :data:`MAX_RECORD_SAMPLES` per key, evenly thinned in call order: complete when there
  are as many as the key's count) and the cost model's sums (``model``). Percentiles
  follow :mod:`resettrace.distribution`'s one rule (numpy's linear percentile): exact
  from every call's value when at hand, else from the buckets within their bound (0.54%);
- throughput where known: ``env_steps`` (calls of ``env_step``), ``env_per_s`` (envs x env
  steps per second of ``env_step`` time; the collector's is over its timed loop) and
  ``reset_fraction``;
- ``traces_dropped``: traces the statistics miss (the aggregation queue was full);
- the export report (``export``), and a job's ``members`` (one line per process: its
  host, pid and start identify it) and what its merge found (``relative_error``,
  ``exact_percentiles``, ``duplicates``, ``left_out``: :func:`~resettrace.merging.merge_records`).

A folder of runs is every ``timing.json`` under it and every other run record ``*.json``
there (:func:`record_files`); a job record read beside its own processes' records is left
out (:func:`leave_out_jobs`).

The JSON has a ``format`` version (:data:`FORMAT`). A collector ``timing.json`` written
before it existed (``format`` 1, implied) is still read. Anything else is refused with a
:class:`RecordError` (a ``ValueError``) naming the file and what it lacks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from resettrace.config import ENV_RUN_ID
from resettrace.outputs import expand_path
from resettrace.tracing import devicecounts
from resettrace.tracing.recorder import DEVICES
from resettrace.version import __version__

log = logging.getLogger("resettrace")

__all__ = ["RunRecord", "RecordError", "FORMAT", "MAX_RECORD_SAMPLES", "read_record", "load_json",
           "read_records", "record_files", "record_of_session", "write_run", "identity_of",
           "leave_out_jobs", "is_member", "name_of", "set_shares", "per_parent", "thin",
           "CONFIG_FIELDS",
           "NotARecord"]

#: the record's format version: 2 (1: a collector timing.json from before records)
FORMAT = 2
#: samples kept per key in a record (thinned evenly, in call order)
MAX_RECORD_SAMPLES = 20_000
#: record kinds
KINDS = ("collector", "process", "job")
#: the file a folder of runs holds: every one under it is read
RECORD_NAME = "timing.json"


#: the names JSON gives the values ``json.loads`` returns
_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


class RecordError(ValueError):
    """A file that is not a run record resettrace can read (the message names it)."""


class NotARecord(RecordError):
    """A file that is not a run record at all (not JSON, not an object, no statistics):
    a folder read passes over such files."""


def thin(values: Sequence[float], limit: int = MAX_RECORD_SAMPLES) -> list[float]:
    """At most ``limit`` of ``values``, evenly spread, in their order."""
    n = len(values)
    if n <= limit:
        return [float(v) for v in values]
    step = n / limit
    return [float(values[int(i * step)]) for i in range(limit)]


@dataclass(kw_only=True)
class RunRecord:
    """One run's record (see the module docstring); :meth:`to_json` / :meth:`from_json`."""

    kind: str = "process"
    mode: str = "timing"
    #: the command line (``sys.argv`` of a process; the job's command for a job)
    command: list[str] | None = None
    #: what ran: the collector's configuration, else ``num_envs`` when known
    config: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    pid: int | None = None
    parent_pid: int | None = None
    rank: int | None = None
    #: who this process is in its job, from what launched it (``rank 3``, ``ray actor
    #: 5f0c...``, ``rllib worker 2``, ``ray actor 5f0c..., rank 1``: :mod:`resettrace.
    #: launcher`): two members of one job never share it unawares
    #: (:func:`~resettrace.merging.duplicates`)
    identity: str | None = None
    #: what launched it (``resettrace``, ``torchrun``, ``slurm``, ``ray``, ``rllib``,
    #: ``multiprocessing``; None: a main process nothing named)
    launcher: str | None = None
    #: the job's process count, when the launcher said it (``WORLD_SIZE``, ``SLURM_NTASKS``)
    world_size: int | None = None
    #: False: a snapshot of a process that was still running when it was written (a process
    #: killed without warning leaves its last one); True: written at its exit
    complete: bool = True
    #: Unix time (s) this snapshot was taken; ``period_s``: how often they are (a killed
    #: process may miss up to one period)
    snapshot_at: float | None = None
    period_s: float | None = None
    #: Unix time (s) the session started
    start: float | None = None
    wall_s: float | None = None
    version: str = ""
    #: a ``resettrace run``'s id: the processes of one run share it
    run_id: str | None = None
    #: every phase a key belongs to: ``{"span", "parent", "key", "gap_key"}``
    phases: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    dist: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    env_steps: int = 0
    env_per_s: float | None = None
    reset_fraction: float | None = None
    #: traces never aggregated: the aggregation queue was full (``Tracing.dropped_traces``)
    traces_dropped: int = 0
    export: dict[str, Any] | None = None
    #: the collector's simulated time facts
    sim: dict[str, Any] | None = None
    interrupted: dict[str, Any] | None = None
    #: a job's processes: one summary each (source, pid, rank, throughput, stats)
    members: list[dict[str, Any]] = field(default_factory=list)
    #: other sections, kept as they are (``numba_ab``, ``mixed``, ...)
    extra: dict[str, Any] = field(default_factory=dict)
    #: where it was read from (not written)
    source: str = ""
    #: the format it was read in (written: always :data:`FORMAT`)
    format: int = FORMAT

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-able dict (its keys: those a collector ``timing.json``
        always had, and the record's own)."""
        out: dict[str, Any] = {"format": FORMAT}
        for f in fields(self):
            if f.name in ("source", "format", "extra"):
                continue
            out[f.name] = getattr(self, f.name)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Any, source: str = "") -> RunRecord:
        """A record from its JSON (or a collector ``timing.json`` of format 1); a
        :class:`RecordError` naming ``source`` and what is missing otherwise."""
        where = source or "run record"
        if not isinstance(data, dict):
            raise NotARecord(f"{where}: not a resettrace run record (a JSON "
                              f"{_JSON_TYPES.get(type(data), type(data).__name__)}, not an "
                              "object)")
        if "tests" in data and isinstance(data.get("merged"), dict):
            return cls.from_json(data["merged"], source)  # the pytest plugin's file
        version = data.get("format", 1)
        if not isinstance(version, int) or version < 1:
            raise NotARecord(f"{where}: not a resettrace run record (format {version!r})")
        if version > FORMAT:
            raise RecordError(f"{where}: a run record of format {version}, written by a newer "
                              f"resettrace (this one reads up to {FORMAT})")
        if "stats" not in data:
            raise NotARecord(f"{where}: not a resettrace run record (no 'stats' section)")
        if version == 1 and set(data) <= {"resettrace", "pid", "mode", "stats"}:
            raise RecordError(f"{where}: the stats file of an older resettrace run: it has no "
                              "distributions or samples to analyse; run it again")
        # a collector timing.json of format 1 may be older than its buckets and cost model
        needed = ("stats", "samples") if version == 1 else ("stats", "dist", "samples")
        missing = [k for k in needed if not isinstance(data.get(k), dict)]
        if missing:
            raise NotARecord(f"{where}: not a resettrace run record (no "
                              + ", ".join(repr(m) for m in missing) + " section)")
        problem = _shape_problem(data)
        if problem is not None:
            raise RecordError(f"{where}: a damaged run record ({problem})")
        known = {f.name for f in fields(cls)} - {"source", "format", "extra"}
        values = {k: data[k] for k in known if k in data and data[k] is not None}
        extra = {k: v for k, v in data.items()
                 if k not in known and k not in ("format", "resettrace")}
        rec = cls(**values, extra=extra, source=source, format=version)
        if version == 1:  # a collector timing.json from before records: what it implied
            rec.kind = "collector"
            rec.mode = str((rec.config or {}).get("mode", rec.mode))
            rec.env_steps = int((rec.stats.get("env_step_total_ms") or {}).get("count", 0))
        if not rec.phases:
            rec.phases = phases_of(rec.stats)
        return rec

    # -- what readers need --------------------------------------------------------------------
    def catalog(self) -> Any:
        """The phase catalog of this record: the built-in phases and the ones it names
        (registered in the run that wrote it), in a catalog of its own."""
        from resettrace.catalog import Catalog

        cat = Catalog()
        pending = [p for p in self.phases if cat.get(p["span"]) is None]
        while pending:  # parents first, whatever order the record lists them in
            left = []
            for p in pending:
                if p.get("parent") is None or cat.get(p["parent"]) is not None:
                    try:
                        cat.register(p["span"], parent=p.get("parent"), key=p.get("key"),
                                     gap_key=p.get("gap_key"))
                    except ValueError as e:
                        raise RecordError(f"{self.source or 'run record'}: phase "
                                          f"{p['span']!r}: {e}") from None
                else:
                    left.append(p)
            if len(left) == len(pending):
                names = ", ".join(repr(p["span"]) for p in left)
                raise RecordError(f"{self.source or 'run record'}: phases whose parents are "
                                  f"missing: {names}")
            pending = left
        return cat

    @property
    def num_envs(self) -> int | None:
        n = (self.config or {}).get("num_envs")
        return int(n) if isinstance(n, (int, float)) and n else None

    @property
    def title(self) -> str:
        """A short line naming what ran, from what the record knows (nothing it lacks is
        shown): the task and backend (else the command, its program without its folder),
        the envs, the env steps and a job's processes."""
        cfg = self.config or {}
        what = " on ".join(str(cfg[k]) for k in ("task", "backend") if cfg.get(k))
        if not what:
            command = [str(c) for c in self.command or []]
            if command:
                command[0] = os.path.basename(command[0]) or command[0]
            what = " ".join(command) or f"a {self.kind} run"
            if len(what) > 80:
                what = what[:77] + "..."
        parts = [what]
        if self.num_envs:
            parts.append(f"{self.num_envs} envs")
        if self.env_steps:
            parts.append(f"{self.env_steps} env steps")
        if self.members:
            n = len(self.members)
            parts.append(f"{n} process{'' if n == 1 else 'es'}")
        return ", ".join(parts)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


#: the record's single values and what each must be (when present and not null)
_SCALARS: dict[str, tuple[str, Any]] = {
    "kind": ("one of " + ", ".join(KINDS), lambda v: v in KINDS),
    "mode": ("a string", lambda v: isinstance(v, str)),
    "host": ("a string", lambda v: isinstance(v, str)),
    "version": ("a string", lambda v: isinstance(v, str)),
    "run_id": ("a string", lambda v: isinstance(v, str)),
    "pid": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "parent_pid": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "rank": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "identity": ("a string", lambda v: isinstance(v, str)),
    "launcher": ("a string", lambda v: isinstance(v, str)),
    "world_size": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "complete": ("true or false", lambda v: isinstance(v, bool)),
    "snapshot_at": ("a number", _number), "period_s": ("a number", _number),
    "env_steps": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "traces_dropped": ("an integer",
                       lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "start": ("a number", _number), "wall_s": ("a number", _number),
    "env_per_s": ("a number", _number), "reset_fraction": ("a number", _number),
    "command": ("a list of strings",
                lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "config": ("an object", lambda v: isinstance(v, dict)),
    "export": ("an object", lambda v: isinstance(v, dict)),
    "sim": ("an object", lambda v: isinstance(v, dict)),
    "interrupted": ("an object", lambda v: isinstance(v, dict)),
    "model": ("an object", lambda v: isinstance(v, dict)),
    "dist": ("an object", lambda v: isinstance(v, dict)),
    "phases": ("a list of objects with a 'span'",
               lambda v: isinstance(v, list) and all(
                   isinstance(p, dict) and isinstance(p.get("span"), str) for p in v)),
    "members": ("a list of objects",
                lambda v: isinstance(v, list) and all(isinstance(m, dict) for m in v)),
}


def _shape_problem(data: Mapping[str, Any]) -> str | None:
    """What makes ``data`` (a record's JSON, its sections there) unreadable, or None: every
    value its readers use has the type they use it as (a file damaged or edited by hand is
    one line naming what is wrong, not a traceback in whichever tool reads it first)."""
    from resettrace.costmodel import FitSums
    from resettrace.distribution import Distribution

    for name, (what, ok) in _SCALARS.items():
        v = data.get(name)
        if v is not None and not ok(v):
            return f"{name!r} is not {what}"
    for key, st in data["stats"].items():
        if not isinstance(st, dict) or "count" not in st or "total_ms" not in st:
            return f"the stats of {key!r} lack count or total_ms"
        if not (isinstance(st["count"], int) and not isinstance(st["count"], bool)
                and st["count"] >= 0) or not _number(st["total_ms"]):
            return f"the stats of {key!r}: count or total_ms is not a number"
    for key, v in data["samples"].items():
        if not isinstance(v, list) or not all(map(_number, v)):
            return f"the samples of {key!r} are not a list of numbers"
    for key, v in (data.get("dist") or {}).items():
        try:
            Distribution.from_dict(v)
        except (TypeError, ValueError, AttributeError) as e:
            return f"the buckets ('dist') of {key!r}: {e}"
    keys = (data.get("model") or {}).get("keys") or {}
    if not isinstance(keys, dict):
        return "the cost model's 'keys' is not an object"
    for key, v in keys.items():
        try:
            FitSums.from_dict(v["sums"])
        except (KeyError, TypeError, ValueError) as e:
            return f"the cost model of {key!r}: {type(e).__name__} {e}"
    return None


def phases_of(stats: Mapping[str, Any], catalog: Any = None) -> list[dict[str, Any]]:
    """The phases (and their ancestors) that the keys of ``stats`` belong to, from
    ``catalog`` (default: this process's), parents first."""
    from resettrace.catalog import CATALOG

    cat = CATALOG if catalog is None else catalog
    wanted: set[str] = set()
    for p in cat:
        if p.key in stats or (p.gap_key is not None and p.gap_key in stats):
            span: str | None = p.span
            while span is not None and span not in wanted:
                wanted.add(span)
                parent = cat.get(span)
                span = None if parent is None else parent.parent
    return [{"span": p.span, "parent": p.parent, "key": p.key, "gap_key": p.gap_key}
            for p in cat if p.span in wanted]


# -- from a session -----------------------------------------------------------------------------
#: what tells a record the instrument targets of this process never imported (None: no
#: instrumentation was installed); set by :mod:`resettrace.instrumentation` when it is
_UNTRACED: list[Callable[[], list[str]]] = []


def set_untraced_source(source: Callable[[], list[str]]) -> None:
    """Give the records of this process the instrument targets it never imported, read
    when a record is made (records never import the instrumentation for this)."""
    _UNTRACED[:] = [source]


def untraced_targets() -> list[str] | None:
    """The instrument targets this process never imported, or None when it installed none
    (:func:`set_untraced_source`)."""
    return _UNTRACED[0]() if _UNTRACED else None


def record_of_session(session: Any, *, kind: str = "process",
                      command: Sequence[str] | None = None,
                      config: Mapping[str, Any] | None = None, wall_s: float | None = None,
                      env_per_s: float | None = None, reset_fraction: float | None = None,
                      export: Mapping[str, Any] | None = None, snapshot: bool = False,
                      **extra: Any) -> RunRecord:
    """The record of ``session``'s statistics now (its queued spans aggregated first).
    ``snapshot``: a record of a process still running (``complete`` false), made cheaply
    for :func:`keep_record_current`: percentiles from the buckets, no samples."""
    from resettrace import catalog as C
    from resettrace.launcher import identity

    proc = session.aggregator
    if proc is not None:
        proc.force_flush()
    dists = session.distributions()
    if snapshot:
        stats = _snapshot_stats(proc, dists, session.catalog)
        samples: dict[str, list[float]] = {}
    else:
        stats = {k: s.as_dict() for k, s in session.stats().items()}
        samples = {k: thin(v) for k, v in session.samples().items()}
    who = identity(session.worker_rank)
    cfg = dict(config or {})
    counts = sorted(getattr(session, "env_counts", None) or ())
    if "num_envs" not in cfg and counts:
        cfg["num_envs"] = counts[-1]  # recorders of several batch sizes: the largest
        if len(counts) > 1:
            cfg["env_counts"] = counts
    steps = int((stats.get(C.ENV_STEP.key) or {}).get("count", 0))
    envs = cfg.get("num_envs")
    step_ms = float((stats.get(C.ENV_STEP.key) or {}).get("total_ms", 0.0))
    if env_per_s is None and steps and envs and step_ms > 0:
        env_per_s = int(envs) * steps / (step_ms / 1e3)
    if reset_fraction is None and steps and envs:
        resets = float((stats.get(C.RESET_DONE_COUNT) or {}).get("total_ms", 0.0))
        reset_fraction = resets / (steps * int(envs))
    started = getattr(session, "started_at", None)
    if wall_s is None and getattr(session, "started_monotonic", None) is not None:
        wall_s = time.monotonic() - session.started_monotonic
    attrs = session.resource_attributes() if hasattr(session, "resource_attributes") else {}
    extra = dict(extra)
    untraced = untraced_targets()
    if untraced is not None:
        extra.setdefault("untraced", untraced)
    if DEVICES:  # its spans time the host's launches there (docs/instrument.md)
        extra.setdefault("devices", sorted(DEVICES))
    counted = devicecounts.report()
    if counted is not None:  # masks counted on a device: how many counts arrived
        extra.setdefault("device_counts", counted)
    return RunRecord(
        kind=kind, mode=session.mode,
        command=list(sys.argv if command is None else command),
        config=cfg, host=socket.gethostname(), pid=os.getpid(),
        parent_pid=attrs.get("resettrace.parent.pid"),
        rank=who.rank, identity=who.identity, launcher=who.launcher,
        world_size=who.world_size, complete=not snapshot,
        snapshot_at=time.time() if snapshot else None,
        period_s=_snapshot_period(),
        start=started, wall_s=wall_s, version=__version__,
        run_id=os.environ.get(ENV_RUN_ID) or None,
        phases=phases_of(stats, session.catalog), stats=stats,
        dist={k: d.as_dict() for k, d in dists.items()},
        samples=samples,
        # a snapshot never loads SciPy (seconds of CPU beside the training) for the fit
        model=session.cost_model(fit=not snapshot or "scipy.stats" in sys.modules),
        env_steps=steps, env_per_s=env_per_s,
        reset_fraction=reset_fraction,
        traces_dropped=int(getattr(session, "dropped_traces", 0)),
        export=dict(export) if export is not None else (
            session.export_report() if session.config.exports_spans else None),
        extra=extra)


def _snapshot_stats(proc: Any, dists: Mapping[str, Any], catalog: Any
                    ) -> dict[str, dict[str, Any]]:
    """Per key, the exact count, total and max and the percentiles the buckets give (no
    sorting of samples: cheap enough for a snapshot every few seconds)."""
    totals = {} if proc is None else proc.totals()
    out: dict[str, dict[str, Any]] = {}
    for key, (count, total, mx) in totals.items():
        if not count:
            continue
        d = dists.get(key)
        out[key] = {"count": count, "mean_ms": total / count,
                    **{f"p{q}_ms": (d.quantile(q / 100) if d is not None and d.count
                                    else None) for q in (50, 90, 99)},
                    "max_ms": mx, "total_ms": total}
    set_shares(out, catalog)
    return out


def write_run(path: str | os.PathLike[str], session: Any = None, **what: Any) -> Path:
    """Write the record of ``session`` (default: the default session) to ``path``
    (``{pid}`` and ``{rank}`` expand); the path written (:mod:`resettrace.outputs`: a
    name beside ``path`` when a file there is not resettrace's)."""
    from resettrace.tables import write_json
    from resettrace.tracing.api import get_tracing

    session = get_tracing() if session is None else session
    target = expand_path(str(path), pid=os.getpid(), rank=session.worker_rank)
    return write_json(Path(target), record_of_session(session, **what).to_json(),
                      compact=bool(what.get("snapshot")))


def _snapshot_period() -> float | None:
    """The period of this process's snapshots (:mod:`resettrace.exit_record`), if it
    keeps its record current."""
    kept = sys.modules.get("resettrace.exit_record")
    return None if kept is None else kept.snapshot_period()


# -- reading ------------------------------------------------------------------------------------
#: how a JSON file resettrace may have written as a run record begins: its first key is
#: the marker ``write_json`` puts first, a record's own first key (``to_json``), or that of
#: a file from before the marker (a collector timing.json, the pytest plugin's file)
_RECORD_HEAD = re.compile(rb'\A\s*\{\s*"(?:resettrace|format|kind|config|pid|tests)"\s*:')


def record_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The record files named by ``paths``: each file as given; each folder as every
    ``timing.json`` under it and every other ``*.json`` under it that is a run record
    (``resettrace run --stats-json out/job.json``'s ``job.json`` and ``job.PID.json``,
    ``bench collector --workers``' ``merged.json``, ...; JSON that is no run record is
    passed over). A folder with none, or a path that does not exist, is a one-line error.
    A job record among its own processes' records is not left out here:
    :func:`read_records` and :func:`~resettrace.merging.merge_records` do that."""
    return [f for f, _ in _gather(paths)]


def _gather(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[Path, RunRecord | None]]:
    """Each record file named by ``paths``, with its record where a folder read parsed it
    already (to know it is one)."""
    out: list[tuple[Path, RunRecord | None]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found: list[tuple[Path, RunRecord | None]] = []
            for f in sorted(p.rglob("*.json")):
                if f.name == RECORD_NAME:
                    found.append((f, None))
                elif f.is_file():
                    rec = _record_or_none(f)
                    if rec is not None:
                        found.append((f, rec))
            if not found:
                raise RecordError(f"{p}: no run record in this folder (no {RECORD_NAME}, and "
                                  "no other .json file under it is a resettrace run record)")
            out += found
        elif p.is_file():
            out.append((p, None))
        else:
            raise FileNotFoundError(f"no such run: {p}")
    return out


def _record_or_none(path: Path) -> RunRecord | None:
    """The record in ``path``, or None when it is no run record (a damaged record, or one
    of a newer format, is still an error: it is one, and cannot be read)."""
    try:
        with path.open("rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not _RECORD_HEAD.match(head):
        return None  # not resettrace's JSON (a trace, a config, ...): not read at all
    try:
        return read_record(path)
    except NotARecord:
        return None


def load_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in ``path``; a :class:`RecordError` naming it when it cannot be read, is
    not UTF-8 or is not JSON (what every reader of runs says)."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
        return json.loads(text)
    except OSError as e:
        raise RecordError(f"{p}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise NotARecord(f"{p}: not a resettrace run record (not UTF-8 text)") from None
    except ValueError as e:
        raise NotARecord(f"{p}: not a resettrace run record (not JSON: {e})") from None


def read_record(path: str | os.PathLike[str]) -> RunRecord:
    """The record in ``path`` (a :class:`RecordError` naming it when it is not one)."""
    return RunRecord.from_json(load_json(path), str(Path(path)))


def read_records(paths: Iterable[str | os.PathLike[str]], *, keep_jobs: bool = False,
                 notes: list[str] | None = None) -> list[RunRecord]:
    """Every record named by ``paths`` (files, or folders: :func:`record_files`), less
    the job records whose processes' records are among them (:func:`leave_out_jobs`: each
    said in one line, appended to ``notes``, else logged as a warning), unless
    ``keep_jobs`` (:func:`~resettrace.merging.merge_records` leaves them out itself)."""
    records = [rec if rec is not None else read_record(f) for f, rec in _gather(paths)]
    if keep_jobs:
        return records
    kept, said = leave_out_jobs(records)
    if notes is not None:
        notes += said
    else:
        for line in said:
            log.warning("%s", line)
    return kept


def per_parent(stats: Mapping[str, Mapping[str, Any]], cat: Any, key: str) -> float | None:
    """A key's calls per call of its parent phase (None: a key with no parent, or one that
    never ran): a phase called several times under one parent has one sample per call."""
    parent = stats.get(cat.parent_key(key)) if key.endswith("_ms") else None
    return float(stats[key]["count"]) / parent["count"] if parent and parent.get("count") \
        else None


def set_shares(stats: dict[str, dict[str, Any]], cat: Any) -> None:
    for key, s in stats.items():
        parent = cat.parent_key(key) if key.endswith("_ms") else None
        ps = stats.get(parent) if parent else None
        s["share_of_parent"] = (s["total_ms"] / ps["total_ms"]
                                if ps and ps.get("total_ms") else None)


# -- merging ------------------------------------------------------------------------------------
#: configuration that must agree for runs to be one job (or comparable)
CONFIG_FIELDS = ("task", "backend", "num_envs", "model", "randomize", "control_dt", "mode")


def _same_file(a: str, b: str) -> bool:
    """Whether two sources name one file: the shorter path is the end of the longer (one
    was given relative, the other absolute or from another folder)."""
    pa, pb = Path(a).parts, Path(b).parts
    n = min(len(pa), len(pb))
    return n > 0 and pa[-n:] == pb[-n:]


def is_member(m: Mapping[str, Any], r: RunRecord) -> bool:
    """Whether a job's member line ``m`` is the record ``r``: a process by its host, pid
    and start; in a job written before those were kept, by its pid and file; a job (a
    merge of jobs) by its file and env steps."""
    if m.get("kind") == "job" or r.kind == "job":
        return (m.get("kind") == r.kind == "job" and _same_file(str(m.get("source") or ""),
                                                                 r.source)
                and m.get("env_steps") == r.env_steps
                and ("start" not in m or m["start"] == r.start))
    if r.pid is None or m.get("pid") != r.pid:
        return False
    if "start" in m:
        return bool(m.get("host") == r.host and m["start"] == r.start)
    return _same_file(str(m.get("source") or ""), r.source)


def name_of(r: RunRecord) -> str:
    return r.source or f"the record of pid {r.pid}"


def leave_out_jobs(records: Sequence[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """``records`` less each job record whose processes all have their own record among
    them (``resettrace run --stats-json out/job.json`` leaves ``job.json`` beside each
    ``job.PID.json``; ``bench collector --workers`` its ``merged.json`` beside each
    ``rank<r>/timing.json``): merged with them it would count every call twice. Returned
    with a line per record left out. A job record with only some of its processes among
    them is a :class:`RecordError` (nothing merged from both would be right)."""
    kept: list[RunRecord] = []
    notes: list[str] = []
    for r in records:
        if r.kind != "job" or not r.members:
            kept.append(r)
            continue
        others = [o for o in records if o is not r]
        found = [m for m in r.members if any(is_member(m, o) for o in others)]
        if not found:
            kept.append(r)
        elif len(found) == len(r.members):
            n = len(found)
            notes.append(f"{name_of(r)}: left out: the job record of {n} of the other "
                         f"run{'' if n == 1 else 's'} (merged with them it would count "
                         "their calls twice)")
        else:
            raise RecordError(
                f"{name_of(r)}: a job record of {len(r.members)} processes, {len(found)} of "
                "which are among the other runs: merged with them it would count those "
                "twice, and without it the others are missing; give the job record alone, "
                "or every process's record")
    return kept, notes


def identity_of(r: RunRecord) -> str:
    """Who ``r``'s process is in its job: the identity it recorded, else its rank (a record
    written before identities), else its pid and host."""
    if r.identity:
        return r.identity
    if r.rank is not None:
        return f"rank {r.rank}"
    return f"pid {r.pid} on {r.host or 'an unknown host'}"

