"""``resettrace merge RUN... -o merged.json``: the runs of many workers as one job.

Each run is a run record (a collector ``timing.json``, ``resettrace run``'s per-process
records, ...); a folder stands for every run record under it (each ``timing.json``, and
each other ``*.json`` that is a record: ``resettrace run --stats-json out/job.json`` leaves
``job.json`` and a ``job.PID.json`` per process there). A job record whose processes'
records are among the runs is left out, said in one line (merged with them it would count
every call twice); one with only some of them there is refused. One process's record
given twice is refused; two processes that claim one identity (two "rank 0": the records
of two jobs?) are refused unless ``allow_duplicates``, which merges them and lists them in
the job (``extra["duplicates"]``).

Merged per key (:func:`resettrace.merging.merge_records`): counts and totals add, the max
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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from resettrace.analysis.job_lines import render_job
from resettrace.merging import merge_records
from resettrace.record import RunRecord, read_records

__all__ = ["merge_runs", "load_runs", "render_merge"]


def load_runs(paths: Sequence[str | Path]) -> list[RunRecord]:
    """The records named by ``paths`` (files, or folders of run records), job records
    included (:func:`merge_runs` leaves out those of the other runs, and says so)."""
    return read_records(paths, keep_jobs=True)


def merge_runs(runs: Sequence[RunRecord], *, allow_mixed: bool = False,
               allow_duplicates: bool = False) -> RunRecord:
    """The job record of ``runs`` (the job records left out: ``extra["left_out"]``)."""
    return merge_records(runs, allow_mixed=allow_mixed, allow_duplicates=allow_duplicates,
                         command=["resettrace", "merge"])


def render_merge(job: RunRecord | dict[str, Any]) -> str:
    """The per-worker table with the merged row, then the merged per-key table."""
    rec = job if isinstance(job, RunRecord) else RunRecord.from_json(job)
    return render_job(rec)
