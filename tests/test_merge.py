"""Mergeable distributions and ``resettrace merge`` / ``bench collector --workers``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from resettrace import catalog as C
from resettrace.config import Config
from resettrace.distribution import RELATIVE_ERROR, Distribution
from resettrace.tracing.session import Tracing


def test_merged_workers_give_the_percentiles_of_all_calls_within_the_stated_error() -> None:
    rng = np.random.default_rng(7)
    # four workers, each its own distribution (one much slower): a merge of percentiles
    # would be wrong, a merge of buckets is not
    workers = [rng.lognormal(mu, 0.6, n) for mu, n in ((-1.5, 40_000), (-1.2, 10_000),
                                                       (0.5, 5_000), (-1.6, 60_000))]
    parts = []
    for w in workers:
        d = Distribution()
        d.add(w[:100])
        d.add(w[100:])
        parts.append(Distribution.from_dict(json.loads(json.dumps(d.as_dict()))))
    merged = Distribution.merged(parts)
    every = np.concatenate(workers)
    whole = Distribution()
    whole.add(every)
    assert merged.counts == whole.counts and merged.count == every.size  # exact merge
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = float(np.percentile(every, 100 * q))  # numpy's default: the one rule
        assert abs(merged.quantile(q) / exact - 1) <= RELATIVE_ERROR + 1e-12, q
    zeros = Distribution()
    zeros.add(np.zeros(10))
    zeros.add_one(0.5)
    assert zeros.quantile(0.5) == 0.0 and zeros.count == 11
    assert abs(zeros.quantile(1.0) / 0.5 - 1) <= RELATIVE_ERROR
    assert math.isnan(Distribution().quantile(0.5))


def test_a_block_of_values_fills_the_buckets_that_one_value_at_a_time_fills() -> None:
    """``add`` counts a block per bucket (a narrow span of buckets, the usual one) or by
    sorting (a span too wide to count): either way the buckets ``add_one`` fills."""
    rng = np.random.default_rng(3)
    narrow = np.concatenate([rng.lognormal(-2, 1.5, 5000), [0.0, 3.0, 3.0, -1.0]])
    wide = np.concatenate([narrow, [5e-324, 1.7e308]])  # ~67,000 buckets apart
    for values in (narrow, wide):
        block, single = Distribution(), Distribution()
        block.add(values)
        for v in values:
            single.add_one(float(v))
        assert block.counts == single.counts and block.zero == single.zero == 2
        assert block.min == single.min and block.max == single.max
        assert block.count == values.size


def test_the_rows_of_a_block_fill_the_buckets_that_each_row_alone_fills() -> None:
    """``add_rows`` counts every row of a plan's values at once (one bucket count, each
    row's range found from its min and max); a row with a zero or a negative value, a
    row of zeros only, rows far apart, a distribution of another scale: the buckets,
    zeros, min and max that ``add`` of each row alone gives."""
    rng = np.random.default_rng(9)
    m = 3000
    cols = [rng.lognormal(-2, 1.5, m), rng.lognormal(3, 0.2, m), np.zeros(m),
            np.where(rng.random(m) < 0.1, 0.0, rng.lognormal(0, 1, m)),
            np.concatenate([[-1.0], rng.lognormal(-1, 1, m - 1)]),
            np.full(m, 2.0 ** 0.5), np.full(m, 1.0)]
    # exact bucket bounds (2 ** (k / 64)) and their neighbours in the last bit
    edges = 2.0 ** (rng.integers(-600, 600, m) / 64)
    cols.append(edges * np.where(rng.random(m) < 0.5, 1 - 2 ** -52, 1 + 2 ** -52))
    cols.append(edges)
    values = np.stack(cols, axis=1)
    far = np.stack([np.concatenate([[5e-324], rng.lognormal(0, 1, m - 1)]),
                    np.concatenate([[1.7e308], rng.lognormal(0, 1, m - 1)])], axis=1)
    for block in (values, far, values[:1], values[:, 5:6]):
        for scales in ([6] * block.shape[1], [6] + [5] * (block.shape[1] - 1)):
            together = [Distribution(s) for s in scales]
            alone = [Distribution(s) for s in scales]
            for _ in range(2):  # and added to what a distribution holds already
                Distribution.add_rows(together, np.ascontiguousarray(block.T))
                for j, d in enumerate(alone):
                    d.add(block[:, j])
            for a, b in zip(together, alone, strict=True):
                assert (a.counts, a.zero, a.min, a.max) == (b.counts, b.zero, b.min, b.max)
                assert a.count == 2 * len(block)


def test_blocks_waiting_in_the_dense_span_count_as_values_added_one_by_one() -> None:
    """``add_rows`` keeps a block's bucket counts in a span of buckets until they are read:
    blocks below, inside and above the span so far (it grows), a block too far away for
    it (into the dict), single values and a merge in between: the counts, count and
    percentiles of ``add_one`` of every value."""
    rng = np.random.default_rng(4)
    blocks = [rng.lognormal(0, 0.3, 500), rng.lognormal(-3, 0.3, 500),
              rng.lognormal(0, 0.1, 500), rng.lognormal(4, 0.5, 500),
              np.full(50, 1e300), np.full(50, 1e-300), rng.lognormal(1, 1, 500)]
    d, one = Distribution(), Distribution()
    for i, block in enumerate(blocks):
        Distribution.add_rows([d], block[None, :].copy())
        for v in block.tolist():
            one.add_one(v)
        if i == 2:  # a read and a single value between blocks
            assert d.count == one.count
            d.add_one(0.5)
            one.add_one(0.5)
    assert d.counts == one.counts and d.count == one.count == 2601
    assert [d.quantile(q) for q in (0.1, 0.5, 0.99)] == [one.quantile(q)
                                                           for q in (0.1, 0.5, 0.99)]
    merged = Distribution.merged([d, one])
    Distribution.add_rows([d], blocks[0][None, :].copy())
    assert merged.count == 2 * 2601 and d.count == 2601 + 500
    assert Distribution.from_dict(d.as_dict()).counts == d.counts
    # merged with a coarser distribution while a block waits: the coarser buckets of all
    coarse, mine = Distribution(5), Distribution()
    for v in blocks[2].tolist():
        coarse.add_one(v)
    Distribution.add_rows([mine], blocks[0][None, :].copy())
    mine.merge(coarse)
    alone = Distribution()
    for v in blocks[0].tolist():
        alone.add_one(v)
    alone.merge(coarse)
    assert mine.scale == alone.scale == 5 and mine.counts == alone.counts
    assert mine.count == alone.count == 1000


def test_the_processor_keeps_every_call_in_its_distribution(clock) -> None:  # type: ignore[no-untyped-def]
    session = Tracing(Config(mode="timing", max_samples=50))  # samples capped, buckets not
    rec = session.recorder(backend="test")
    for i in range(300):
        with rec.scope(C.ENV_STEP):
            clock.now += 1_000_000 + 1000 * i
    dist = session.distributions()[C.ENV_STEP.key]
    stats = session.stats()[C.ENV_STEP.key]
    assert dist.count == stats.count == 300
    exact = 1.0 + 0.001 * 0.9 * 299  # rank 269.1 (0-based) of 1.000 ... 1.299 ms
    assert abs(dist.quantile(0.9) / exact - 1) <= RELATIVE_ERROR
    session.shutdown()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_workers_run_and_merge_and_mixed_runs_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "job"
    r = _cli("bench", "collector", "--workers", "2", "--num-envs", "16", "--steps", "60",
             "--warmup", "3", "--action-noise", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "2 processes" in r.stdout and "the job, per key" in r.stdout
    ranks = [json.loads((out / f"rank{i}" / "timing.json").read_text()) for i in range(2)]
    assert [d["rank"] for d in ranks] == [0, 1]
    assert ranks[0]["config"]["seed"] != ranks[1]["config"]["seed"]  # each its own env
    merged = json.loads((out / "merged.json").read_text())  # the job's run record
    assert merged["kind"] == "job" and [m["rank"] for m in merged["members"]] == [0, 1]
    for key, s in merged["stats"].items():
        assert s["count"] == sum(d["stats"][key]["count"] for d in ranks), key
        assert s["total_ms"] == pytest.approx(sum(d["stats"][key]["total_ms"] for d in ranks))
        assert s["max_ms"] == max(d["stats"][key]["max_ms"] for d in ranks)
    assert merged["env_per_s"] == pytest.approx(sum(d["env_per_s"] for d in ranks))
    assert merged["config"]["num_envs"] == 32  # two batches of 16
    again = _cli("merge", str(out), "-o", str(tmp_path / "again.json"))  # merged.json there
    assert again.returncode == 0 and "merged.json: left out" in again.stderr, again.stderr
    assert json.loads((tmp_path / "again.json").read_text())["stats"] == merged["stats"]
    other = tmp_path / "other"
    r = _cli("bench", "collector", "--num-envs", "8", "--steps", "20", "--warmup", "2",
             "--nthread", "1", "--out", str(other))
    assert r.returncode == 0, r.stderr
    mixed = _cli("merge", str(out / "rank0"), str(other))
    assert mixed.returncode == 2 and "num_envs: 16, 8" in mixed.stderr
    assert "Traceback" not in mixed.stderr
    twice = _cli("merge", str(out / "rank0"), str(other), "--allow-mixed")
    assert twice.returncode == 2 and "rank 0: pid" in twice.stderr  # two jobs' rank 0s
    allowed = _cli("merge", str(out / "rank0"), str(other), "--allow-mixed",
                   "--allow-duplicates", "-o", str(tmp_path / "m.json"))
    assert allowed.returncode == 0 and "MIXED" in allowed.stdout, allowed.stderr
    assert _cli("merge", str(tmp_path / "none")).returncode == 2


def test_sigterm_to_a_workers_job_stops_every_worker_and_merges_what_they_did(
        tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "job"
    p = subprocess.Popen([sys.executable, "-m", "resettrace.cli", "bench", "collector",
                          "--workers", "2", "--num-envs", "8", "--warmup", "1",
                          "--steps", "1000000", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        logs = [out / f"rank{r}" / "log.txt" for r in range(2)]
        deadline = time.monotonic() + 120
        while not all(f.is_file() and "step " in f.read_text() for f in logs):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.2)  # until both workers are in their timed steps
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, stderr
    assert "Traceback" not in stderr and "merged the 2 of 2" in stderr
    merged = json.loads((out / "merged.json").read_text())
    assert [r["interrupted"]["signal"] for r in merged["members"]] == ["SIGTERM", "SIGTERM"]
    steps = sum(r["interrupted"]["steps_done"] for r in merged["members"])
    assert merged["stats"][C.ENV_STEP.key]["count"] == steps > 0


def test_every_collector_setting_reaches_each_worker(tmp_path: Path) -> None:
    """Workers got their settings rebuilt flag by flag: a setting with no flag in that list
    (``--numba-ab`` aside, refused with --workers) silently ran with its default. Each
    worker now runs its job's config itself, with its own seed, engine threads and
    folder."""
    out = tmp_path / "job"
    r = _cli("bench", "collector", "--workers", "2", "--num-envs", "6", "--steps", "4",
             "--warmup", "1", "--action-noise", "0.25", "--seed", "7", "--randomize",
             "--control-dt", "0.04", "--nthread", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    configs = [json.loads((out / f"rank{i}" / "timing.json").read_text())["config"]
               for i in range(2)]
    for rank, cfg in enumerate(configs):
        assert cfg["seed"] == 7 + rank and cfg["out"] == str(out / f"rank{rank}")
        assert (cfg["num_envs"], cfg["steps"], cfg["warmup"], cfg["action_noise"],
                cfg["randomize"], cfg["control_dt"], cfg["nthread"]) == (
            6, 4, 1, 0.25, True, 0.04, 1)
