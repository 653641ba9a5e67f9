"""mylab's own tests: resettrace statistics asserted with the ``resettrace`` fixture.

The fixture makes a fresh timing session the default for each test, so envs built
inside the test record into it (level 1 and 2 code is always instrumented; level 3,
the env itself, through the spec).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import resettrace
from mylab.env import CartPoleEnv

HERE = Path(__file__).resolve().parent
SPEC = HERE / "spec.toml"


@pytest.fixture
def traced_env(request: pytest.FixtureRequest):
    """A 32-env CartPoleEnv traced through the spec, recording into the test's session."""
    capture = request.getfixturevalue("resettrace")  # resettrace's pytest fixture
    undo = resettrace.instrument(SPEC)
    try:
        env = CartPoleEnv(num_envs=32, seed=3)
        capture.clear()  # forget the initial reset of every env
        yield env, capture
    finally:
        undo()


def _steps(env: CartPoleEnv, n: int) -> int:
    rng = np.random.default_rng(0)
    resets = 0
    for _ in range(n):
        _, done = env.step(rng.uniform(-1, 1, env.num_envs))
        resets += int(done.sum())
    return resets


def test_every_level_lands_in_one_breakdown(traced_env) -> None:
    env, capture = traced_env
    resets = _steps(env, 60)
    st = capture.stats()
    assert st["env_step_total_ms"]["count"] == 60
    assert st["physics_ms"]["count"] == 60 and st["update_state_ms"]["count"] == 60
    assert resets > 0 and st["reset_done_count"]["total_ms"] == resets
    calls = st["reset_done_ms"]["count"]
    # the decorated manager and the backend's scopes nest under the spec's reset_done
    for key in ("reset_done_reset_call_ms", "dr_reset_total_ms", "dr_reset_plan_ms",
                "dr_reset_plan_pole_noise_ms", "dr_reset_build_observation_ms",
                "dr_reset_set_state_ms", "set_state_warm_start_clear_ms"):
        assert st[key]["count"] == calls, key
    # closed accounts: children + gap = parent
    kids = ("dr_reset_plan_ms", "dr_reset_set_state_ms", "dr_reset_build_observation_ms",
            "dr_reset_internal_gap_ms")
    assert sum(st[k]["total_ms"] for k in kids) == pytest.approx(
        st["dr_reset_total_ms"]["total_ms"], rel=1e-9)
    assert st["dr_reset_internal_gap_ms"]["p50_ms"] < st["dr_reset_set_state_ms"]["p50_ms"]


def test_set_state_returns_the_closed_timing_dict(traced_env) -> None:
    env, _ = traced_env
    env.reset_done(np.arange(32) % 4 == 0)
    timing = env.dr.last_timing
    assert timing is not None
    assert list(timing)[-2:] == ["set_state_warm_start_clear_ms", "set_state_internal_gap_ms"]
    assert len(timing) == 17 and all(v >= 0.0 for v in timing.values())


def test_bad_ids_are_refused_before_any_row_changes(traced_env) -> None:
    env, _ = traced_env
    before = env.backend.qpos()
    with pytest.raises(ValueError, match="env_ids"):
        env.backend.set_state(np.array([0, 99]), np.zeros((2, 2)), np.zeros((2, 2)))
    assert np.array_equal(env.backend.qpos(), before)


def test_zero_code_run_of_the_unmodified_training_script(tmp_path: Path) -> None:
    out = tmp_path / "stats.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETTRACE", "OTEL_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "run", "--instrument",
                        str(SPEC), "--stats-json", str(out), "--", sys.executable,
                        str(HERE / "train.py")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "resets" in r.stdout and "the job, per key" in r.stderr
    stats = json.loads(out.read_text())["stats"]
    assert stats["env_step_total_ms"]["count"] == 200
    assert stats["set_state_warm_start_clear_ms"]["count"] == stats["reset_done_ms"]["count"]
