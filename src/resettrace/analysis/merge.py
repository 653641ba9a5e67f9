"""``resettrace merge RUN... -o merged.json``: the runs of many workers as one job.

Each run is a run record (a collector ``timing.json``, ``resettrace run``'s per-process
records, ...; a folder stands for every ``timing.json`` under it). Each keeps, per key, its
exact count, total and max and its calls in mergeable exponential buckets (``dist``,
:mod:`resettrace.distribution`). Merged per key (:func:`resettrace.record.merge_records`):
counts and totals add, the max is the largest, the buckets add, and p50 / p90 / p99 are
read from the merged buckets, within :data:`~resettrace.distribution.RELATIVE_ERROR`
(1.09%) of the percentile of all the calls together. The cost model's sums add too
(``model``). env/s adds: the workers ran at once. The result is itself a run record (kind
``job``, with a line per worker in ``members``), which every other command reads.

Runs of different configurations (task, backend, envs, model, randomization, control_dt,
mode) are refused unless ``allow_mixed``: a merged p99 of two different jobs means nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from resettrace.analysis.tables import render_job
from resettrace.record import RunRecord, merge_records, read_records

__all__ = ["merge_runs", "load_runs", "render_merge"]


def load_runs(paths: Sequence[str | Path]) -> list[RunRecord]:
    """The records named by ``paths`` (files, or folders of ``timing.json``)."""
    return read_records(paths)


def merge_runs(runs: Sequence[RunRecord], *, allow_mixed: bool = False) -> RunRecord:
    """The job record of ``runs``."""
    return merge_records(runs, allow_mixed=allow_mixed, command=["resettrace", "merge"])


def render_merge(job: RunRecord | dict[str, Any]) -> str:
    """The per-worker table with the merged row, then the merged per-key table."""
    rec = job if isinstance(job, RunRecord) else RunRecord.from_json(job)
    return render_job(rec)
