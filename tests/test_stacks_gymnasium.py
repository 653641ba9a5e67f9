"""The shipped ``gymnasium`` instrumentation on a MuJoCo env of our own
(:mod:`resettrace.bench.stack_envs.gym_arm`), in vector envs as users run them: sync
in-process and under ``resettrace run``, async with fork and with spawn workers. Every
reset that happened is one ``reset_done`` (count 1) down to ``set_state`` with MuJoCo's
reset and forward calls inside it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resettrace
from helpers import assert_closed, clean_env
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.instrumentation import instrument
from resettrace.stacks import get, version_problem
from resettrace.tracing.session import Tracing

CHAIN = ["reset_done", "reset_done.reset_call", "dr_reset", "set_state"]






def test_the_shipped_mapping_matches_the_installed_gymnasium() -> None:
    inst = get("gymnasium")
    assert version_problem(inst) == (True, None)


def test_sync_vector_env_in_process_counts_every_reset() -> None:
    from resettrace.bench.stack_envs import gym_arm

    session = Tracing(Config(mode="timing"))
    undo = instrument("gymnasium")
    try:
        with resettrace.use_tracing(session):
            happened = gym_arm.run("sync", 80)
        stats = session.stats()
    finally:
        undo()
        session.shutdown()
    resets = happened["resets"]
    assert resets > happened["num_envs"]  # some autoresets, not only the first reset
    assert stats[C.RESET_DONE_COUNT].total_ms == resets
    for span in CHAIN:
        assert stats[C.CATALOG.resolve(span).key].count == resets, span
    assert stats["set_state_data_reset_ms"].count == resets
    assert stats["set_state_forward_kinematic_ms"].count == resets
    assert stats["env_step_total_ms"].count == 80
    # the contract's timing dict: every set_state key, closed by the gap
    for key in C.CATALOG.timing_keys(C.SET_STATE):
        assert key in stats, key
    for phase in (C.SET_STATE, C.DR_RESET, C.RESET_DONE):  # (the first resets: roots)
        assert_closed(stats, phase)
    # nothing recorded once undone
    assert not hasattr(__import__("mujoco").mj_forward, "__resettrace_phase__")


def _spans(folder: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(folder.glob("spans.*.jsonl")):
        for line in f.read_text().splitlines():
            out.append(json.loads(line))
    return out


@pytest.mark.parametrize("mode", ["sync", "fork", "spawn"])
def test_vector_env_under_resettrace_run(tmp_path: Path, mode: str) -> None:
    """Zero code: ``resettrace run --instrument gymnasium``; async workers (fork or spawn)
    record their sub-envs' resets, the job's record adds them up, the span files hold
    the tree."""
    code = ("import json; from resettrace.bench.stack_envs.gym_arm import run; "
            f"print('HAPPENED', json.dumps(run({mode!r}, 60)))")
    r = subprocess.run(
        [sys.executable, "-m", "resettrace.cli", "run", "--instrument", "gymnasium",
         "--stats-json", "job.json", "--", sys.executable, "-c", code],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=clean_env(RESETTRACE="trace",
                      RESETTRACE_EXPORTER=f"file:{tmp_path}/spans.{{pid}}.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("HAPPENED "))
    resets = json.loads(line.split(" ", 1)[1])["resets"]
    job = json.loads((tmp_path / "job.json").read_text())
    stats = job["stats"]
    assert stats[C.RESET_DONE_COUNT]["total_ms"] == resets
    assert stats["dr_reset_set_state_ms"]["count"] == resets
    assert stats["env_step_total_ms"]["count"] == 60
    # workers that reset but never step do not make the job "mixed", and their resets
    # count against the job's env steps
    assert "MIXED" not in r.stderr and job["config"]["num_envs"] == 4
    assert job["reset_fraction"] == pytest.approx(resets / (60 * 4))
    for phase in (C.SET_STATE, C.DR_RESET, C.RESET_DONE):
        assert_closed(stats, phase)

    spans = _spans(tmp_path)
    by_id = {s["span_id"]: s for s in spans}
    assert len(by_id) == len(spans)  # ids unique
    names = Counter(s["name"] for s in spans)
    for span in CHAIN + ["set_state.data_reset", "set_state.forward_kinematic"]:
        assert names[span] == resets, span
    main_pid = {s["resource"]["process.pid"] for s in spans if s["name"] == "env_step"}
    assert len(main_pid) == 1 and names["env_step"] == 60
    for s in spans:
        assert s["end_ns"] >= s["start_ns"]
        if s["name"] in CHAIN[1:] or s["name"].startswith("set_state."):
            parent = by_id[s["parent_id"]]
            want = C.CATALOG.resolve(s["name"]).parent
            assert parent["name"] == want and parent["trace_id"] == s["trace_id"]
            assert parent["start_ns"] <= s["start_ns"] and s["end_ns"] <= parent["end_ns"]
            assert s["attributes"]["resettrace.reset.count"] == 1
            assert s["attributes"]["resettrace.backend.name"] == "mujoco"
    roots = [s for s in spans if s["name"] == "reset_done"]
    workers = {s["resource"]["process.pid"] for s in roots}
    if mode == "sync":
        assert workers == main_pid
        under_step = [s for s in roots if s.get("parent_id")]
        assert all(by_id[s["parent_id"]]["name"] == "env_step" for s in under_step)
        assert len(under_step) == resets - 4  # the first reset of each sub-env is a root
    else:
        assert len(workers) == 4 and not workers & main_pid  # in each worker
        assert not any(s.get("parent_id") for s in roots)
        per_worker = Counter(s["resource"]["process.pid"] for s in roots)
        assert all(n >= 1 for n in per_worker.values())
    assert np.isfinite([s["start_ns"] for s in spans]).all()


def test_bench_stacks_reports_median_and_total_ratios_of_both_stacks(tmp_path: Path) -> None:
    """``resettrace bench stacks``, small: every mode timed each round after its settling
    steps, the steps and resets it recorded counted, each ratio as medians and as totals
    with their intervals."""
    out = tmp_path / "stacks.json"
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "stacks",
                        "--rounds", "3", "--block", "2", "--warmup", "1", "--settle", "2",
                        "--motrixlab-envs", "16", "--gymnasium-envs", "4", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=clean_env())
    assert r.returncode == 0, r.stderr
    assert "timing/off" in r.stdout and "Traceback" not in r.stderr
    assert "the recorder's hot path: compiled" in r.stdout
    result = json.loads(out.read_text())
    assert result["compiled"] is True
    assert [s["stack"] for s in result["stacks"]] == ["motrixlab", "gymnasium"]
    for s in result["stacks"]:
        times = s["samples_us"]
        assert {len(v) for v in times.values()} == {3}
        assert s["timing_steps"] == 3 * 2 + 1 + (3 + 1) * 2  # blocks, warm-up, settling
        for key, ratio in s["ratios"].items():
            a, b = key.split("/")
            assert ratio["total_ratio"] == pytest.approx(sum(times[a]) / sum(times[b]))
            assert ratio["ratio"] == pytest.approx(np.median(times[a]) / np.median(times[b]))
            lo, hi = ratio["total_ci95"]
            assert lo <= hi


def test_bench_stacks_sizes_blocks_by_time_from_the_off_warmup(tmp_path: Path) -> None:
    """Without ``--block``, a block takes about ``--block-ms``: its steps come from the
    off mode's warm-up steps (a Gymnasium step is ~10x shorter than a MotrixLab one, so
    its blocks have more steps); bad sizes are one line and exit 2."""
    out = tmp_path / "stacks.json"
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "stacks",
                        "--rounds", "3", "--block-ms", "20", "--warmup", "3", "--settle", "1",
                        "--motrixlab-envs", "256", "--gymnasium-envs", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=clean_env())
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    blocks = {s["stack"]: s["block"] for s in result["stacks"]}
    assert all(b >= 1 for b in blocks.values())
    assert blocks["gymnasium"] > blocks["motrixlab"]  # shorter steps, more of them
    for s in result["stacks"]:
        assert s["timing_steps"] == 3 * s["block"] + 3 + (3 + 1) * 1
        assert f"blocks of {s['block']} steps" in r.stdout
    for bad, says in ((["--block-ms", "0"], "--block-ms must be > 0"),
                      (["--warmup", "0"], "--warmup must be >= 1 when --block-ms"),
                      (["--block", "0"], "--block must be >= 1")):
        r = subprocess.run([sys.executable, "-m", "resettrace.cli", "bench", "stacks",
                            "--rounds", "3", *bad], capture_output=True, text=True,
                           timeout=60, env=clean_env())
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
