"""A user's own robot model: control timing from its timestep, actuators checked at load,
a missing floor said, and every bad input one line from the CLI."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

import resettrace
from resettrace.model_facts import DEFAULT_MODEL, control_substeps

G1 = DEFAULT_MODEL.read_text()


def _variant(tmp_path: Path, name: str, xml: str) -> Path:
    path = tmp_path / f"{name}.xml"
    path.write_text(xml)
    return path


def _with_timestep(tmp_path: Path, dt: str) -> Path:
    xml, n = re.subn(r'timestep="[^"]*"', f'timestep="{dt}"', G1, count=1)
    assert n == 1
    return _variant(tmp_path, f"g1_dt{dt}", xml)


def _with_motors(tmp_path: Path, first_only: bool = False) -> Path:
    if first_only:  # one actuator of the actuator list becomes a motor
        head, sep, tail = G1.partition("<actuator>")
        tail = re.sub(r'<position (name="[^"]+" joint="[^"]+")[^/]*/>', r'<motor \1/>', tail,
                      count=1)
        xml = head + sep + tail
    else:
        xml = re.sub(r'\s(kp|kv)="[^"]*"', "", G1.replace("<position", "<motor"))
    return _variant(tmp_path, "g1_motors" + ("_one" if first_only else ""), xml)


def test_substeps_are_the_control_period_over_the_model_timestep() -> None:
    assert control_substeps(0.02, 0.02 / 3) == 3
    assert control_substeps(0.02, 0.002) == 10
    assert control_substeps(0.02, float.fromhex("0x1.b4e81cp-8")) == 3  # float32 0.02/3
    with pytest.raises(ValueError, match=r"0\.02 s is not a whole number of the model's "
                                         r"0\.0015 s timesteps \(13\.33\)"):
        control_substeps(0.02, 0.0015)


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
def test_a_2ms_model_steps_10_substeps_per_20ms_env_step(tmp_path: Path, backend: str) -> None:
    model = _with_timestep(tmp_path, "0.002")
    env = resettrace.make_env("g1_walk_flat", backend=backend, num_envs=2, model=str(model),
                              nthread=1)
    try:
        assert env.task.substeps == 10
        assert env.task.sim_s_per_step == pytest.approx(0.02, rel=1e-6)
        assert env.task.describe()["sim_s_per_step"] == pytest.approx(0.02, rel=1e-6)
    finally:
        env.close()
    bundled = resettrace.make_env("g1_walk_flat", backend=backend, num_envs=2, nthread=1)
    try:
        assert bundled.task.substeps == 3
    finally:
        bundled.close()
    fast = resettrace.make_env("g1_walk_flat", backend=backend, num_envs=2, model=str(model),
                               nthread=1, task_options={"control_dt": 0.03})
    try:
        assert fast.task.substeps == 15
    finally:
        fast.close()


def test_a_timestep_that_does_not_divide_the_control_period_is_refused(tmp_path: Path) -> None:
    model = _with_timestep(tmp_path, "0.0015")
    with pytest.raises(ValueError, match=r"control_dt 0\.02 s .* 0\.0015 s timesteps"):
        resettrace.make_env("g1_walk_flat", num_envs=2, model=str(model), nthread=1)
    with pytest.raises(ValueError, match="substeps=3 .* not control_dt"):
        resettrace.make_env("g1_walk_flat", num_envs=2, model=str(_with_timestep(
            tmp_path, "0.002")), nthread=1, task_options={"substeps": 3})


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
@pytest.mark.parametrize("first_only", [False, True])
def test_torque_motors_are_refused_by_name(tmp_path: Path, backend: str,
                                           first_only: bool) -> None:
    model = _with_motors(tmp_path, first_only)
    with pytest.raises(ValueError, match="must be a position servo") as e:
        resettrace.make_env("g1_walk_flat", backend=backend, num_envs=2, model=str(model),
                            nthread=1)
    message = str(e.value)
    if first_only:
        assert "1 torque motor(s) without position feedback (left_hip_pitch_joint)" in message
    else:
        assert "29 torque motor(s)" in message and "... 23 more" in message


def test_a_model_without_a_floor_is_said_once(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    xml, n = re.subn(r'\s*<geom name="floor"[^>]*/>', "", G1, count=1)
    assert n == 1
    model = _variant(tmp_path, "g1_nofloor", xml.replace('model="g1_29dof_resettrace"',
                                                         'model="g1_nofloor"'))
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        for _ in range(2):
            resettrace.make_env("g1_walk_flat", num_envs=2, model=str(model), nthread=1).close()
    said = [r.getMessage() for r in caplog.records if "no floor" in r.getMessage()]
    assert said == ["resettrace: model 'g1_nofloor' has no collision geometry fixed to the "
                    "world (no floor): the robots fall without end"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_collector_cli_states_simulated_time_and_takes_control_dt(tmp_path: Path) -> None:
    model = _with_timestep(tmp_path, "0.002")
    out = tmp_path / "run"
    r = _cli("bench", "collector", "--num-envs", "2", "--steps", "3", "--warmup", "0",
             "--nthread", "1", "--model", str(model), "--control-dt", "0.01", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "simulated time: 0.01 s per env step (5 substeps of the model's 0.002 s" in r.stdout
    sim = json.loads((out / "timing.json").read_text())["sim"]
    assert sim["substeps"] == 5 and sim["sim_s_per_step"] == pytest.approx(0.01)


@pytest.mark.parametrize(("args", "expected"), [
    (["--num-envs", "3000000000"], "--num-envs must be between 1 and 2147483647"),
    (["--action-noise", "nan"], "--action-noise must be a finite number"),
    (["--control-dt", "0.0213"], "control_dt 0.0213 s is not a whole number"),
    (["--control-dt", "-1"], "--control-dt must be a finite number"),
])
def test_collector_cli_bad_input_is_one_line(args: list[str], expected: str) -> None:
    r = _cli("bench", "collector", "--num-envs", "2", "--steps", "1", "--nthread", "1", *args)
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_collector_cli_out_at_a_file_fails_before_the_run(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("x")
    r = _cli("bench", "collector", "--num-envs", "2", "--steps", "1", "--out", str(target))
    assert r.returncode == 2 and f"--out {target} is a file, not a folder" in r.stderr
    assert "step 1/1" not in r.stderr  # refused before any step
    bad_model = _cli("bench", "collector", "--num-envs", "2", "--steps", "1", "--model",
                     str(_with_motors(tmp_path)))
    assert bad_model.returncode == 2 and "must be a position servo" in bad_model.stderr
    assert "Traceback" not in bad_model.stderr
