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
from resettrace.sim.model_facts import DEFAULT_MODEL, control_substeps

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


def _cube_stl(path: Path, half: float = 0.05) -> None:
    """A binary STL of a cube (12 triangles)."""
    import struct

    import numpy as np

    v = np.array([[x, y, z] for x in (-half, half) for y in (-half, half)
                  for z in (-half, half)])
    faces = [(0, 1, 3), (0, 3, 2), (4, 6, 7), (4, 7, 5), (0, 4, 5), (0, 5, 1),
             (2, 3, 7), (2, 7, 6), (0, 2, 6), (0, 6, 4), (1, 5, 7), (1, 7, 3)]
    data = bytearray(80) + struct.pack("<I", len(faces))
    for f in faces:
        data += struct.pack("<3f", 0, 0, 0)
        for i in f:
            data += struct.pack("<3f", *v[i])
        data += b"\x00\x00"
    path.write_bytes(bytes(data))


def _with_mesh_geom(tmp_path: Path, name: str = "g1_mesh") -> Path:
    _cube_stl(tmp_path / "pelvis.stl")
    xml, n = re.subn(r'<geom name="pelvis_geom" class="floor_contact" type="sphere" '
                     r'size="0.07"', '<geom name="pelvis_geom" class="floor_contact" '
                     'type="mesh" mesh="pelvis_mesh"', G1, count=1)
    assert n == 1
    xml = xml.replace("<worldbody>", '<asset><mesh name="pelvis_mesh" file="pelvis.stl"/>'
                      "</asset>\n  <worldbody>", 1)
    xml = xml.replace('model="g1_29dof_resettrace"', f'model="{name}"')  # warned once a model
    return _variant(tmp_path, name, xml)


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
def test_randomization_on_a_model_with_mesh_geoms(tmp_path: Path, backend: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    import numpy as np

    model = _with_mesh_geom(tmp_path, f"g1_mesh_{backend}")
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        env = resettrace.make_env("g1_walk_flat", backend=backend, num_envs=4,
                                  model=str(model), nthread=1, randomization=True)
        try:
            env.reset_done(np.array([True, False, True, False]))  # mesh geoms: no crash
            env.step(np.zeros((4, env.action_dim)))
            if backend == "mujoco":
                import mujoco

                m = env.backend.model
                mesh = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "pelvis_geom")
                foot = int(env.backend._sized_geoms[0])
                size = env.backend.batch.expand("geom_size")
                assert (size[:, mesh] == m.geom_size[mesh]).all()  # left as it is
                assert not np.allclose(size[0, foot], size[1, foot])  # primitives scaled
        finally:
            env.close()
    assert any("pelvis_geom" in r.getMessage() and "cannot scale" in r.getMessage()
               for r in caplog.records)


def test_the_default_clip_comes_from_the_users_model_and_keyframe(tmp_path: Path) -> None:
    xml = G1.replace("        0 0 0.073\n        0.2 0.2", "        0.15 0 0.073\n        0.2 0.2",
                     1)
    assert xml != G1
    model = _variant(tmp_path, "g1_waist", xml)
    env = resettrace.make_env("g1_motion_tracking", num_envs=2, model=str(model), nthread=1)
    try:
        clip = env.task.clip
        waist = env.backend.info.joint_names.index("waist_yaw_joint")
        assert clip.joint_names == env.backend.info.joint_names
        assert (clip.joint_pos[:, waist] == 0.15).all()  # the user's keyframe, not ours
    finally:
        env.close()


def test_clip_joints_are_mapped_by_name(tmp_path: Path) -> None:
    import dataclasses

    import numpy as np

    from resettrace.sim.tasks.motion import generate_clip, load_clip, save_clip

    clip = generate_clip(fps=50)
    order = list(range(clip.num_joints))[::-1]
    shuffled = dataclasses.replace(clip, joint_pos=clip.joint_pos[:, order],
                                   joint_vel=clip.joint_vel[:, order],
                                   joint_names=tuple(clip.joint_names[i] for i in order))
    path = save_clip(shuffled, tmp_path / "shuffled.npz")
    assert load_clip(path).joint_names == shuffled.joint_names
    env = resettrace.make_env("g1_motion_tracking", num_envs=2, nthread=1,
                              task_options={"clip_path": str(path)})
    try:
        np.testing.assert_array_equal(env.task.clip.joint_pos, clip.joint_pos)
        np.testing.assert_array_equal(env.task.clip.joint_vel, clip.joint_vel)
    finally:
        env.close()
    short = dataclasses.replace(clip, joint_pos=clip.joint_pos[:, 1:],
                                joint_vel=clip.joint_vel[:, 1:],
                                joint_names=clip.joint_names[1:])
    with pytest.raises(ValueError, match="no column for 1 of the model's joints: "
                                         "left_hip_pitch_joint"):
        resettrace.make_env("g1_motion_tracking", num_envs=2, nthread=1,
                            task_options={"clip": short})


def test_motrix_runs_mujocos_gains_and_says_which_limits_it_cannot(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Knees with kv from dampratio, hip pitch limited at the joint (actuatorfrcrange):
    MotrixSim gets MuJoCo's kd through its overrides, and a warning names the hip pitch
    actuators whose force limit it ignores."""
    import numpy as np

    from resettrace.sim.model_facts import actuator_force_limits, actuator_gains, load_model

    # kv and dampratio exclude each other on MotrixSim: no kv in the top default
    xml = G1.replace('forcelimited="true" kp="40" kv="2"/>', 'forcelimited="true" kp="40"/>', 1)
    xml = xml.replace('<position kp="150" kv="4" forcerange="-139 139"/>',
                     '<position kp="150" dampratio="1" forcerange="-139 139"/>', 1)
    hip_pitch = ('<joint axis="0 1 0" armature="0.01017752004"/>\n'
                 '        <position kp="100" kv="2" forcerange="-88 88"/>')
    assert hip_pitch in xml
    xml = xml.replace(hip_pitch, '<joint axis="0 1 0" armature="0.01017752004" '
                      'actuatorfrcrange="-88 88"/>\n'
                      '        <position kp="100" kv="2" forcelimited="false"/>', 1)
    xml = xml.replace('model="g1_29dof_resettrace"', 'model="g1_parity"')
    model = _variant(tmp_path, "g1_parity", xml)
    mj = load_model(model)
    kp_mj, kd_mj = actuator_gains(mj)
    knee = mj.actuator("left_knee_joint").id
    hip = mj.actuator("left_hip_pitch_joint").id
    assert actuator_force_limits(mj)[hip].tolist() == [-88.0, 88.0]  # from the joint
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        b = resettrace.make_backend("motrix", num_envs=3, model=str(model), nthread=1)
    both = _variant(tmp_path, "g1_kv_and_dampratio", G1.replace(
        '<position kp="150" kv="4" forcerange', '<position kp="150" dampratio="1" forcerange', 1))
    with pytest.raises(ValueError, match="MotrixSim cannot load the model: .*mutually"):
        resettrace.make_backend("motrix", num_envs=1, model=str(both), nthread=1)
    act = list(b.model.actuators)
    assert not np.isclose(float(act[knee].kd), kd_mj[knee], rtol=1e-3)  # its own derivation
    q = np.broadcast_to(b.keyframe_qpos, (3, b.nq))
    b.set_state(np.array([0, 2]), q[:2], np.zeros((2, b.nv)))  # a reset keeps the gains
    np.testing.assert_allclose(act[knee].get_kd_override(b.data), kd_mj[knee], rtol=1e-5)
    np.testing.assert_allclose(act[knee].get_kp_override(b.data), kp_mj[knee], rtol=1e-5)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "kp/kd of 2 actuator(s) of model 'g1_parity' differ from MuJoCo's" in said
    assert "2 actuator(s) of model 'g1_parity' have other force limits on MotrixSim" in said
    assert "left_hip_pitch_joint" in said and "[-88.0, 88.0] on MuJoCo" in said
    b.close()


def test_a_mesh_that_does_not_load_names_where_it_was_looked_for(tmp_path: Path) -> None:
    model = _variant(tmp_path, "broken", """<mujoco model="broken">
  <compiler meshdir="assets"/>
  <asset><mesh name="a" file="missing.stl"/></asset>
  <worldbody><body><freejoint/><geom type="mesh" mesh="a"/></body></worldbody>
</mujoco>""")
    r = _cli("bench", "collector", "--num-envs", "2", "--steps", "1", "--model", str(model))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{model}: MuJoCo cannot load the model" in r.stderr
    assert f"looked for {tmp_path.resolve() / 'assets' / 'missing.stl'}" in r.stderr


@pytest.mark.parametrize("backend", ["mujoco", "motrix"])
def test_a_num_envs_beyond_int32_is_refused_before_the_engine(backend: str) -> None:
    with pytest.raises(ValueError, match="num_envs must be between 1 and 2147483647"):
        resettrace.make_backend(backend, num_envs=2**31, nthread=1)
    r = _cli("bench", "export", "--num-envs", str(2**31), "--rounds", "1")
    assert r.returncode == 2 and "--num-envs must be at most 2147483647" in r.stderr


def test_motrix_names_the_options_it_does_not_simulate_as_mujoco(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Fluid forces, an elliptic cone, impratio and a disabled frictionloss have no
    MotrixSim setting; the timestep, iterations and tolerance it takes (the tolerance as
    its square root) are not reported. The bundled G1 is not reported either."""
    option = '<option timestep="0.0066666666666667" integrator="implicitfast" iterations="5"/>'
    assert option in G1
    xml = G1.replace(option, '<option timestep="0.004" iterations="7" tolerance="1e-6" '
                     'cone="elliptic" impratio="3" density="1.2" wind="1 0 0">'
                     '<flag frictionloss="disable"/></option>', 1)
    model = _variant(tmp_path, "g1_options", xml.replace('model="g1_29dof_resettrace"',
                                                         'model="g1_options"'))
    with caplog.at_level(logging.WARNING, logger="resettrace"):
        resettrace.make_backend("motrix", num_envs=1, model=str(model), nthread=1).close()
        resettrace.make_backend("motrix", num_envs=1, model=str(model), nthread=1).close()
        resettrace.make_backend("motrix", num_envs=1, nthread=1).close()
    said = [r.getMessage() for r in caplog.records if "<option>" in r.getMessage()]
    assert len(said) == 1, said  # once, and the bundled model not at all
    assert "of model 'g1_options'" in said[0]
    for item in ("density: 1.2", "impratio: 3", "wind: [1.0, 0.0, 0.0]", "cone: elliptic",
                 "disabled frictionloss"):
        assert item in said[0]
    for taken in ("timestep", "iterations", "tolerance", "viscosity"):
        assert taken not in said[0]
