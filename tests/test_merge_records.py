"""Merging run records as users hold them: folders of ``resettrace run`` files (the job's
record beside each process's), ``bench collector --workers`` folders, duplicates, the
job's env count, and percentiles by the one rule (exact from complete samples, else from
the buckets within their stated bound), on records of real sessions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import FakeClock
from resettrace import catalog as C
from resettrace.cli import main
from resettrace.config import Config
from resettrace.distribution import RELATIVE_ERROR, Distribution, relative_error
from resettrace.merging import merge_records
from resettrace.record import (
    MAX_RECORD_SAMPLES,
    RecordError,
    RunRecord,
    read_record,
    read_records,
    record_files,
    record_of_session,
)
from resettrace.tables import write_json
from resettrace.tracing.session import Tracing

KEY = C.ENV_STEP.key


def _process(clock: FakeClock, ns: Sequence[int], *, pid: int, rank: int = 0,
             envs: int | None = 8, steps: bool = True, max_samples: int = 100_000,
             count: int | None = None) -> tuple[RunRecord, Any]:
    """The record of a real session whose calls took ``ns`` (ns each): env steps, or
    resets only (a worker that never steps the batch); and its own statistics of them.
    ``pid`` and ``rank`` stand for the process that would have written it."""
    session = Tracing(Config(mode="timing", max_samples=max_samples))
    rec = session.recorder(backend="test", env_count=envs)
    phase = C.ENV_STEP if steps else C.RESET_DONE
    try:
        for v in ns:
            with rec.scope(phase) if count is None else rec.scope(phase, count=count):
                clock.now += int(v)
        record = record_of_session(session, command=["train.py"])
        own = session.stats()[phase.key]
    finally:
        session.shutdown()
    record.pid, record.rank, record.identity = pid, rank, f"rank {rank}"
    return record, own


def _write(rec: RunRecord, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rec.source = str(path)
    return write_json(path, rec.to_json())


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _exact(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q))


# -- folders ------------------------------------------------------------------------------------
def test_a_run_folder_merges_its_processes_and_leaves_the_job_out(
        tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    """``resettrace run --stats-json out/job.json`` leaves ``job.json`` (the job) and
    ``job.PID.json`` (each process): a folder read found no ``timing.json``, and ``job*.json``
    counted every call twice."""
    out = tmp_path / "out"
    a, _ = _process(clock, [1_000_000 + i for i in range(50)], pid=11, rank=0)
    b, _ = _process(clock, [2_000_000 + i for i in range(30)], pid=12, rank=1)
    _write(a, out / "job.11.json")
    _write(b, out / "job.12.json")
    _write(merge_records([a, b], command=["resettrace", "run"]), out / "job.json")
    (out / "notes.json").write_text('{"lr": 0.001}')  # a JSON that is no record: passed over
    (out / "trace.json").write_text('[1, 2]')
    assert sorted(p.name for p in record_files([out])) == ["job.11.json", "job.12.json",
                                                           "job.json"]
    code, stdout, stderr = _cli(capsys, "merge", str(out), "-o", str(tmp_path / "m.json"))
    assert code == 0, stderr
    merged = json.loads((tmp_path / "m.json").read_text())
    assert sorted(m["pid"] for m in merged["members"]) == [11, 12]
    assert merged["stats"][KEY]["count"] == 80 and merged["env_steps"] == 80
    said = [line for line in stderr.splitlines() if "job.json" in line]
    assert len(said) == 1 and "left out" in said[0], stderr
    assert merged["left_out"] == [said[0].removeprefix("resettrace: ")]
    assert "2 processes (" in stdout
    # compare and fit read the folder the same way: once each call
    assert [Path(r.source).name for r in read_records([out])] == ["job.11.json",
                                                                  "job.12.json"]
    # a folder with no record at all: one line
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.json").write_text("{}")
    code, _, stderr = _cli(capsys, "merge", str(tmp_path / "empty"))
    assert code == 2 and stderr.count("\n") == 1 and "no run record in this folder" in stderr


def test_a_job_with_part_of_its_processes_among_the_runs_is_refused(
        tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = _process(clock, [1_000_000] * 10, pid=11, rank=0)
    b, _ = _process(clock, [1_000_000] * 10, pid=12, rank=1)
    _write(a, tmp_path / "job.11.json")
    _write(merge_records([a, b]), tmp_path / "job.json")
    code, _, stderr = _cli(capsys, "merge", str(tmp_path / "job.json"),
                           str(tmp_path / "job.11.json"))
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "job.json" in stderr and "1 of which are among the other runs" in stderr


def test_a_workers_folder_gives_its_ranks_with_a_new_or_an_old_merged_json(
        tmp_path: Path, clock: FakeClock) -> None:
    """``bench collector --workers`` writes ``OUT/rank<r>/timing.json`` and
    ``OUT/merged.json``: read as a folder, the ranks, once each, whichever resettrace wrote
    ``merged.json`` (one from before kept no host or start in its member lines)."""
    out = tmp_path / "OUT"
    ranks = []
    for r in range(2):
        rec, _ = _process(clock, [1_000_000 * (r + 1)] * 20, pid=100 + r, rank=r)
        rec.kind = "collector"
        _write(rec, out / f"rank{r}" / "timing.json")
        ranks.append(rec)
    job = merge_records(ranks).to_json()
    write_json(out / "merged.json", job)
    for old in (False, True):
        if old:
            for m in job["members"]:
                del m["host"], m["start"], m["identity"]
            write_json(out / "merged.json", job)
        merged = merge_records(read_records([out], keep_jobs=True))
        assert [m["pid"] for m in merged.members] == [100, 101]
        assert merged.stats[KEY]["count"] == 40
        assert len(merged.extra["left_out"]) == 1 and "merged.json" in \
            merged.extra["left_out"][0]


def test_fit_reads_a_run_folder_once_and_a_job_at_its_batch_size(tmp_path: Path,
                                                                  clock: FakeClock) -> None:
    from resettrace.analysis.fit import load_fit_inputs

    out = tmp_path / "out"
    a, _ = _process(clock, [300_000] * 30, pid=11, rank=0, steps=False, count=2)
    b, _ = _process(clock, [400_000] * 20, pid=12, rank=1, steps=False, count=3)
    _write(a, out / "job.11.json")
    _write(b, out / "job.12.json")
    _write(merge_records([a, b]), out / "job.json")
    for paths in ([out], [out / "job.json"]):
        fit = load_fit_inputs([str(p) for p in paths])
        assert fit["env_counts"] == [8], paths  # each batch's 8 envs, not the job's 16
        assert fit["keys"][C.RESET_DONE.key]["per_env_count"]["8"]["n"] == 50, paths


# -- duplicates ---------------------------------------------------------------------------------
def test_the_same_record_twice_is_refused(tmp_path: Path, clock: FakeClock,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = _process(clock, [1_000_000] * 10, pid=11)
    path = _write(a, tmp_path / "a.json")
    code, _, stderr = _cli(capsys, "merge", str(path), str(path))
    assert code == 2 and stderr.count("\n") == 1 and "given twice" in stderr
    # one process's record twice under two names (a copy, a snapshot and its final record)
    copy = tmp_path / "copy.json"
    copy.write_bytes(path.read_bytes())
    code, _, stderr = _cli(capsys, "merge", str(path), str(copy))
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "the same process's record twice" in stderr
    assert "a.json" in stderr and "copy.json" in stderr


def test_two_processes_of_one_identity_need_allow_duplicates(
        tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = _process(clock, [1_000_000] * 10, pid=11, rank=0)
    b, _ = _process(clock, [1_000_000] * 12, pid=12, rank=0)
    pa, pb = _write(a, tmp_path / "a.json"), _write(b, tmp_path / "b.json")
    code, _, stderr = _cli(capsys, "merge", str(pa), str(pb))
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "rank 0: pid 11 (a.json), pid 12 (b.json)" in stderr
    assert "--allow-duplicates" in stderr
    out = tmp_path / "m.json"
    code, stdout, stderr = _cli(capsys, "merge", str(pa), str(pb), "--allow-duplicates",
                                "-o", str(out))
    assert code == 0, stderr
    merged = json.loads(out.read_text())
    assert merged["duplicates"] == ["rank 0: pid 11 (a.json), pid 12 (b.json)"]
    assert merged["stats"][KEY]["count"] == 22
    shown = [line for line in stdout.splitlines() if "DUPLICATE" in line]
    assert shown == ["DUPLICATE identities, merged anyway: rank 0: pid 11 (a.json), "
                     "pid 12 (b.json)"]
    # the library's caller (resettrace run) asks for the list back
    job = merge_records([a, b], allow_duplicates=True)
    assert job.extra["duplicates"] == ["rank 0: pid 11 (a.json), pid 12 (b.json)"]
    with pytest.raises(RecordError, match="rank 0"):
        merge_records([a, b])


# -- env counts ---------------------------------------------------------------------------------
def test_the_jobs_env_count_is_the_sum_of_the_batches_stepped(clock: FakeClock) -> None:
    a, _ = _process(clock, [1_000_000] * 10, pid=11, rank=0, envs=8)
    b, _ = _process(clock, [1_000_000] * 10, pid=12, rank=1, envs=8)
    job = merge_records([a, b])
    assert job.num_envs == 16 and job.config["env_counts"] == [8]
    assert "16 envs" in job.title
    # reset-only workers (Gymnasium's async workers, SB3's subprocesses) of the main
    # process's batch add nothing: their envs are in its batch
    worker, _ = _process(clock, [500_000] * 5, pid=13, rank=2, envs=1, steps=False)
    assert merge_records([a, worker]).num_envs == 8
    # no member steps: the known ones
    other, _ = _process(clock, [500_000] * 5, pid=14, rank=3, envs=1, steps=False)
    assert merge_records([worker, other]).num_envs == 2
    # a job merged with another job: their batches, not their sums twice
    c, _ = _process(clock, [1_000_000] * 10, pid=21, rank=0, envs=8)
    d, _ = _process(clock, [1_000_000] * 10, pid=22, rank=1, envs=8)
    jobs = merge_records([job, merge_records([c, d])])
    assert jobs.num_envs == 32 and jobs.config["env_counts"] == [8]


# -- percentiles --------------------------------------------------------------------------------
def test_complete_samples_give_the_exact_pooled_percentiles(clock: FakeClock) -> None:
    rng = np.random.default_rng(3)
    ns = [np.round(rng.lognormal(14.0, 1.0, 4000)), np.round(rng.pareto(1.3, 6000) * 1e6 + 1)]
    recs = [_process(clock, v, pid=11 + i, rank=i)[0] for i, v in enumerate(ns)]
    job = merge_records(recs)
    pooled = np.concatenate([r.samples[KEY] for r in recs])
    assert len(pooled) == 10_000 and np.allclose(np.sort(pooled), np.sort(
        np.concatenate(ns)) / 1e6)
    for q in (50, 90, 99):
        assert job.stats[KEY][f"p{q}_ms"] == pytest.approx(_exact(pooled, q), rel=1e-12)
    assert KEY in job.extra["exact_percentiles"]
    assert len(job.samples[KEY]) == 10_000  # the job's samples are complete too


@pytest.mark.parametrize("shape", ["lognormal", "pareto"])
def test_thinned_samples_give_percentiles_within_the_bound(clock: FakeClock,
                                                           shape: str) -> None:
    """Two processes of 30,000 and 24,000 calls: each record keeps 20,000 samples, so the
    job reads its percentiles from the buckets: within 0.54% of numpy's exact percentile of
    all 54,000 calls, heavy tail included."""
    rng = np.random.default_rng(5)

    def draw(n: int, scale: float) -> np.ndarray:
        v = rng.lognormal(0.0, 1.5, n) if shape == "lognormal" else rng.pareto(1.2, n) + 1
        return np.round(v * scale * 1e6)

    ns = [draw(30_000, 0.3), draw(24_000, 1.1)]
    recs = [_process(clock, v, pid=11 + i, rank=i)[0] for i, v in enumerate(ns)]
    assert all(len(r.samples[KEY]) == MAX_RECORD_SAMPLES for r in recs)
    job = merge_records(recs)
    every = np.concatenate(ns) / 1e6
    assert RELATIVE_ERROR < 0.01 and job.extra["relative_error"] == RELATIVE_ERROR
    assert KEY not in job.extra["exact_percentiles"]
    for q in (50, 90, 99):
        exact = _exact(every, q)
        assert abs(job.stats[KEY][f"p{q}_ms"] / exact - 1) <= RELATIVE_ERROR + 1e-12, q
    # the job's pooled samples weigh each process by its calls
    pooled = job.samples[KEY]
    assert len(pooled) <= MAX_RECORD_SAMPLES
    first = set(recs[0].samples[KEY])
    share = sum(1 for x in pooled if x in first) / len(pooled)
    assert share == pytest.approx(30 / 54, abs=0.01)


def test_a_process_agrees_with_its_one_process_job(clock: FakeClock) -> None:
    rng = np.random.default_rng(9)
    small = np.round(rng.lognormal(14.0, 0.8, 5000))
    rec, own = _process(clock, small, pid=11)  # every call in the record: equal
    job = merge_records([rec]).stats[KEY]
    assert (job["p50_ms"], job["p90_ms"], job["p99_ms"]) == (own.p50_ms, own.p90_ms,
                                                             own.p99_ms)
    big = np.round(rng.pareto(1.5, 30_000) * 1e6 + 1e5)
    rec, own = _process(clock, big, pid=12)  # the record thinned: within the bound
    job = merge_records([rec]).stats[KEY]
    for q in (50, 90, 99):
        assert getattr(own, f"p{q}_ms") == pytest.approx(_exact(big / 1e6, q),
                                                                 rel=1e-12)
        assert abs(job[f"p{q}_ms"] / getattr(own, f"p{q}_ms") - 1) <= RELATIVE_ERROR + 1e-12
    # a process whose reservoir misses calls reads them from its buckets, as its job does
    rec, own = _process(clock, big[:5000], pid=13, max_samples=1000)
    job = merge_records([rec]).stats[KEY]
    assert (job["p50_ms"], job["p90_ms"], job["p99_ms"]) == (own.p50_ms, own.p90_ms,
                                                             own.p99_ms)
    for q in (50, 90, 99):
        assert abs(job[f"p{q}_ms"] / _exact(big[:5000] / 1e6, q) - 1) <= RELATIVE_ERROR + 1e-12


def test_a_scale_5_record_is_read_and_merged_with_a_scale_6_one(tmp_path: Path,
                                                                 clock: FakeClock) -> None:
    rng = np.random.default_rng(11)
    ns = [np.round(rng.lognormal(14.0, 1.0, 25_000)), np.round(rng.lognormal(14.5, 0.7,
                                                                             21_000))]
    new, _ = _process(clock, ns[0], pid=11, rank=0)
    old, _ = _process(clock, ns[1], pid=12, rank=1)
    data = old.to_json()  # as a resettrace from before wrote it: scale 5, no max
    for key, d in data["dist"].items():
        legacy = Distribution.from_dict(d).downscaled(5).as_dict()
        del legacy["max"]
        data["dist"][key] = legacy
    write_json(tmp_path / "old.json", data)
    _write(new, tmp_path / "new.json")
    read = read_record(tmp_path / "old.json")
    assert read.dist[KEY]["scale"] == 5
    job = merge_records([read_record(tmp_path / "new.json"), read])
    assert job.dist[KEY]["scale"] == 5 and job.extra["relative_error"] == relative_error(5)
    every = np.concatenate(ns) / 1e6
    for q in (50, 90, 99):
        assert abs(job.stats[KEY][f"p{q}_ms"] / _exact(every, q) - 1) <= relative_error(5)
    whole = Distribution(5)
    whole.add(every)
    assert job.dist[KEY]["buckets"] == whole.as_dict()["buckets"]  # exact, at scale 5
