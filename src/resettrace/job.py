"""The members of a ``resettrace run``'s job, once its command has ended.

Every process of the run keeps its record current on disk (:func:`resettrace.record.
keep_record_current`): a snapshot (``complete`` false) every few seconds, the complete
record at its exit. :func:`gather_members` reads them, and waits (``RESETTRACE_JOB_WAIT``
seconds, default 10) for the members still running: on this host, a process whose pid
still runs; on another, one whose snapshots keep coming; and for the ranks a launcher's
world size names that wrote nothing yet. :func:`members_line` says in one line what the job
misses; :func:`untraced_in_job`, the instrument targets no process imported.
"""

from __future__ import annotations

import glob
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from resettrace.record import RecordError, RunRecord, identity_of, read_record

__all__ = ["gather_members", "members_line", "untraced_in_job"]

#: seconds between two reads of the members' records while waiting
_POLL_S = 0.2


def _process_state(pid: int | None) -> bool | None:
    """Whether process ``pid`` of this host still runs (a zombie does not); None: unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _read_members(template: Path, job_path: Path | None, run_id: str) -> list[RunRecord]:
    """The records of run ``run_id`` at the paths ``template`` names (``{pid}``,
    ``{rank}``), less the job's own."""
    pattern = glob.escape(str(template)).replace(glob.escape("{pid}"), "*").replace(
        glob.escape("{rank}"), "*")
    records = []
    for f in sorted(glob.glob(pattern)):
        if job_path is not None and Path(f) == job_path:
            continue
        try:
            rec = read_record(f)
        except RecordError:
            continue  # not a record of this run
        if rec.run_id == run_id:
            records.append(rec)
    return records


def _running(r: RunRecord, host: str, now: float) -> bool:
    """Whether the process of ``r`` (a snapshot) still runs: on this host, by its pid; on
    another, while its snapshots keep coming."""
    alive = _process_state(r.pid) if r.host == host else None
    if alive is None:
        fresh = 2 * (r.period_s or 0) + 1.0
        alive = r.snapshot_at is not None and now - r.snapshot_at < fresh
    return alive


def _missing_ranks(records: list[RunRecord]) -> list[int]:
    """Ranks below a launcher's world size (torchrun, SLURM, ...) that no record has."""
    worlds = {r.world_size for r in records if r.world_size}
    if len(worlds) != 1:
        return []
    have = {r.rank for r in records if r.world_size and r.rank is not None}
    return [k for k in range(worlds.pop()) if k not in have]


def gather_members(template: Path, job_path: Path | None, run_id: str
                   ) -> tuple[list[RunRecord], dict[str, Any]]:
    """The records of this run's processes, once every member is complete, or ended, or
    ``RESETTRACE_JOB_WAIT`` seconds passed (the wait said in one line); and what the job
    misses: ``incomplete`` (members merged as of their last snapshot: killed, or still
    running), ``missing`` (ranks below a launcher's world size with no record) and
    ``waited_s``."""
    from resettrace.config import run_number

    host = socket.gethostname()
    wait = run_number("job_wait_s")
    deadline = time.monotonic() + wait
    said = False
    while True:
        records = _read_members(template, job_path, run_id)
        now = time.time()
        running = [r for r in records if not r.complete and _running(r, host, now)]
        missing = _missing_ranks(records)
        if not (running or missing) or time.monotonic() >= deadline:
            break
        if not said:
            who = [identity_of(r) for r in running] + [f"rank {m}" for m in missing]
            print(f"resettrace run: waiting up to {wait:g} s for {len(who)} member"
                  f"{'' if len(who) == 1 else 's'} still running or not yet written: "
                  + ", ".join(who[:8]) + (", ..." if len(who) > 8 else ""), file=sys.stderr)
            said = True
        time.sleep(_POLL_S)
    ended = time.time()
    records.sort(key=lambda r: (r.rank if r.rank is not None else -1, r.pid or 0))
    incomplete = [{
        "identity": identity_of(r), "pid": r.pid, "host": r.host, "source": r.source,
        "state": "running" if r in running else "ended without its exit record",
        "snapshot_age_s": None if r.snapshot_at is None else max(0.0, ended - r.snapshot_at),
        "period_s": r.period_s} for r in records if not r.complete]
    return records, {"incomplete": incomplete, "missing": missing, "waited_s": wait}


def members_line(notes: dict[str, Any]) -> str:
    """One line on what the job misses (:func:`gather_members`'s notes; nothing when every
    member is complete)."""
    parts = []
    for m in notes["incomplete"]:
        age = m["snapshot_age_s"]
        period = m["period_s"]
        if m["state"] == "running":
            what = (f"still running after {notes['waited_s']:g} s: merged as of its last "
                    f"snapshot ({age:.1f} s old)")
        else:
            what = ("ended without writing its record (killed?): merged as of its last "
                    f"snapshot, taken at most {age:.1f} s before the job ended; it may miss "
                    f"up to {period:g} s of work" if age is not None and period else
                    "ended without writing its record: merged as of its last snapshot")
        parts.append(f"{m['identity']} (pid {m['pid']}) {what}")
    parts += [f"rank {k}: no record" for k in notes["missing"]]
    if not parts:
        return ""
    return f"{len(parts)} member{'' if len(parts) == 1 else 's'} incomplete: " + "; ".join(parts)


def untraced_in_job(records: list[RunRecord]) -> list[str]:
    """The instrument targets no process of the job imported (each process lists the ones
    it never imported in its record)."""
    lists = [set(r.extra["untraced"]) for r in records
             if isinstance(r.extra.get("untraced"), list)]
    return sorted(str(x) for x in set.intersection(*lists)) if lists else []
