"""The shipped ``mjlab`` instrumentation on real mjlab (MuJoCo Warp on Warp's CPU device),
as a user runs it: ``resettrace run --instrument mjlab -- python train.py`` around a small
training loop (:mod:`mjlab_job`, cartpole with short episodes). Every reset that happened is
counted, every phase is where the docs put it, and the timing dicts close.

mjlab pins ``mujoco~=3.11`` and the reference path's ``sim`` extra needs MuJoCo 4: these tests
run in a venv of their own with the tracer core and the ``mjlab`` extra (``make test`` makes
``.venv-mjlab``). Warp compiles its kernels on the first run (about 30 s for this task,
cached in ``~/.cache/warp`` after)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from resettrace import catalog as C
from resettrace.record import RunRecord
from resettrace.stacks import get, version_problem

JOB = Path(__file__).with_name("mjlab_job.py")
RESETTRACE = Path(sys.executable).with_name("resettrace")


def _env() -> dict[str, str]:
    """The environment without resettrace's settings, but the recorder it runs (``make
    test`` runs these tests with each: ``RESETTRACE_PURE_PYTHON``)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("RESETTRACE", "OTEL_")) or k == "RESETTRACE_PURE_PYTHON"}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the job under ``resettrace run --instrument mjlab``: its record, what the
    job counted itself, and what the run printed."""
    d = tmp_path_factory.mktemp("mjlab")
    facts, record = d / "facts.json", d / "timing.json"
    r = subprocess.run([str(RESETTRACE), "run", "--instrument", "mjlab", "--stats-json",
                        str(record), "--", sys.executable, str(JOB), str(facts), "4", "40"],
                       capture_output=True, text=True, env=_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"facts": json.loads(facts.read_text()), "record": json.loads(record.read_text()),
            "out": r.stdout + r.stderr}


def test_the_shipped_mapping_matches_the_installed_mjlab() -> None:
    inst = get("mjlab")
    assert version_problem(inst) == (True, None)
    assert inst.supported == ">=1.6,<1.7"


def test_every_reset_is_counted(job: dict[str, Any]) -> None:
    facts, stats = job["facts"], job["record"]["stats"]
    assert facts["resets"] > facts["num_envs"] + 2  # time-outs reset envs inside steps
    assert stats[C.RESET_DONE_COUNT]["total_ms"] == facts["resets"]
    for key in ("reset_done_ms", "reset_done_reset_call_ms", "dr_reset_total_ms",
                "dr_reset_set_state_ms", "set_state_data_reset_ms", "dr_reset_events_ms",
                "dr_reset_scene_reset_ms", "dr_reset_curriculum_ms"):
        if key == "dr_reset_curriculum_ms" and key not in stats:
            continue  # (a task without a curriculum: its manager's compute is not called)
        assert stats[key]["count"] == facts["reset_calls"], key
    # each reset resets every manager: 8 of them, one sample per call
    assert stats["dr_reset_managers_reset_ms"]["count"] == 8 * facts["reset_calls"]


def test_the_step_s_phases_per_call(job: dict[str, Any]) -> None:
    facts, stats = job["facts"], job["record"]["stats"]
    steps = facts["steps"]
    assert stats["env_step_total_ms"]["count"] == steps
    assert stats["physics_ms"]["count"] == steps * facts["decimation"]  # each substep
    assert stats["apply_action_ms"]["count"] == steps * (facts["decimation"] + 1)
    for key in ("env_step_termination_ms", "env_step_reward_ms", "env_step_forward_ms",
                "env_step_observation_ms"):
        assert stats[key]["count"] == steps, key  # reset()'s forward is not a step's
    # the table says how many calls a parent holds
    assert "per parent" in job["out"]
    row = next(line for line in job["out"].splitlines() if line.startswith("physics_ms "))
    assert row.split()[2] == f"{facts['decimation']:.3f}"


def test_the_timing_dicts_close(job: dict[str, Any]) -> None:
    """A parent's keys sum to it, its gap included (ms, summed over the run): set_state's
    (the sim's reset and the gap) and dr_reset's (curriculum, set_state, the scene's and
    the managers' resets, the events, and the gap)."""
    stats = job["record"]["stats"]
    cat = RunRecord.from_json(job["record"]).catalog()
    for parent, expected in (
            ("dr_reset_set_state_ms", {"set_state_data_reset_ms", "set_state_internal_gap_ms"}),
            ("dr_reset_total_ms", {"dr_reset_set_state_ms", "dr_reset_events_ms",
                                   "dr_reset_managers_reset_ms", "dr_reset_internal_gap_ms"}),
            ("dr_reset_events_ms", {"dr_reset_events_state_write_ms",
                                    "dr_reset_events_other_ms"})):
        children = [k for k in stats if k.endswith("_ms") and cat.parent_key(k) == parent]
        assert expected <= set(children), children
        assert sum(stats[k]["total_ms"] for k in children) == pytest.approx(
            stats[parent]["total_ms"], rel=1e-6), parent


def test_on_the_cpu_no_device_note(job: dict[str, Any]) -> None:
    """Counts on host tensors: no line about device time (that line is for CUDA tensors)."""
    assert "spans time the host" not in job["out"]
    assert "was written for mjlab" not in job["out"]


def test_bench_stacks_measures_mjlab(tmp_path: Path) -> None:
    """``resettrace bench stacks --stack mjlab``, small: the modes alternated, the ratios
    with their A/A, and the timing mode's resets counted (episodes of 0.1 s: a reset every
    2 steps of 0.05 s)."""
    out = tmp_path / "stacks.json"
    r = subprocess.run([str(RESETTRACE), "bench", "stacks", "--stack", "mjlab",
                        "--mjlab-envs", "8", "--mjlab-episode-s", "0.1", "--rounds", "3",
                        "--block", "5", "--warmup", "1", "--json", str(out)],
                       capture_output=True, text=True, env=_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    (stack,) = json.loads(out.read_text())["stacks"]
    assert stack["stack"] == "mjlab" and set(stack["ratios"]) == {
        "timing/off", "off/bare", "off_aa/off"}
    assert stack["timing_steps"] >= 3 * 5 and stack["timing_resets"] >= 8
    assert "mjlab Mjlab-Cartpole-Balance, 8 envs" in r.stdout


def test_bench_stacks_refuses_an_unknown_task_in_one_line() -> None:
    r = subprocess.run([str(RESETTRACE), "bench", "stacks", "--stack", "mjlab",
                        "--mjlab-task", "No-Such-Task", "--rounds", "3"],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith(
        "resettrace: --mjlab-task 'No-Such-Task' is not one of mjlab's tasks (")
    assert "Traceback" not in r.stderr
