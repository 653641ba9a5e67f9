"""The MotrixSim backend against the contract: timing schema and closure, exact row writes,
input validation before any engine call, and no input that can crash the process."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resettrace
from helpers import reset_timings, stand_rows
from resettrace import catalog as C
from resettrace.sim.backends import BACKENDS
from resettrace.sim.backends import motrix as motrix_mod
from resettrace.sim.backends.motrix import MotrixBackend
from resettrace.sim.contract import SimBackend
from resettrace.sim.randomization import RandomizationRows
from resettrace.tracing.session import Tracing

N = 64
NTHREAD = 2
# the engine holds float32: values read back round to float32
F32_ATOL = 2e-6


def _make(session, num_envs=N, **options):
    return resettrace.make_backend("motrix", num_envs=num_envs, nthread=NTHREAD,
                                   tracing=session, **options)


@pytest.fixture(scope="module")
def off_backend():
    b = _make(Tracing(resettrace.Config()), num_envs=16)
    yield b
    b.close()


def test_registered_and_satisfies_contract(off_backend) -> None:
    assert BACKENDS["motrix"] == "resettrace.sim.backends.motrix:MotrixBackend"
    b = off_backend
    assert isinstance(b, MotrixBackend) and isinstance(b, SimBackend)
    assert b.name == b.info.name == "motrix"
    assert (b.nq, b.nv, b.nu) == (36, 35, 29)
    assert b.info.joint_names[0] == "left_hip_pitch_joint" and len(b.info.joint_names) == 29
    assert b.info.body_names[:2] == ("world", "pelvis")
    assert b.info.physics_dt == pytest.approx(0.02 / 3, rel=1e-6)
    assert b.keyframe_qpos.shape == (36,)
    np.testing.assert_array_equal(b.keyframe_qpos[3:7], [1.0, 0.0, 0.0, 0.0])  # wxyz
    assert b.get_qpos_rows(None).shape == (16, 36)
    poses = b.get_body_pose_rows([0, 3], ["pelvis", "torso_link", "world"])
    assert poses.shape == (2, 3, 7)
    np.testing.assert_allclose(np.linalg.norm(poses[..., 3:], axis=-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(poses[0, 0, :3], b.keyframe_qpos[:3], atol=1e-6)
    np.testing.assert_array_equal(poses[:, 2], [[0, 0, 0, 1, 0, 0, 0]] * 2)


def test_starts_at_the_keyframe_holding_it() -> None:
    b = _make(Tracing(resettrace.Config()), num_envs=4)
    np.testing.assert_allclose(b.get_qpos_rows(None), np.tile(b.keyframe_qpos, (4, 1)),
                               atol=F32_ATOL)
    np.testing.assert_array_equal(b.get_qvel_rows(None), 0.0)
    lo, hi = b.info.ctrl_range.T
    want = np.clip(b.keyframe_qpos[7:][b.info.actuator_joint], lo, hi)
    np.testing.assert_allclose(b.data.actuator_ctrls, np.tile(want, (4, 1)), atol=F32_ATOL)
    b.close()


def test_off_mode_returns_none(off_backend) -> None:
    q, v = stand_rows(off_backend, 2)
    assert off_backend.set_state([1, 5], q, v) is None


@pytest.mark.parametrize("bad,match", [
    ({"friction": 1.0}, "RandomizationRows"),
    (RandomizationRows(friction=np.ones(3)), "friction must have shape \\(2,\\)"),
    (RandomizationRows(kd_scale=np.array([1.0, -1.0])), "finite and > 0"),
])
def test_bad_randomization_is_refused_before_any_engine_call(off_backend, bad, match) -> None:
    b = off_backend
    q, v = stand_rows(b, 2)
    before = _snapshot(b)
    with pytest.raises(ValueError, match=match):
        b.set_state([1, 2], q, v, randomization=bad)
    _assert_same(before, _snapshot(b))


def test_timing_schema_every_key_every_call(timing_session) -> None:
    b = _make(timing_session)
    rng = np.random.default_rng(1)
    ks = list(range(1, N + 1, 7))
    for i, (_, timing) in enumerate(reset_timings(b, ks, rng)):
        for key in ("set_state_data_reset_ms", "set_state_actuator_ctrl_ms",
                    "set_state_qpos_convert_ms"):
            assert timing[key] > 0.0, key
        # all N rows were reset at the start (at the keyframe): their handle is kept
        assert (timing["set_state_data_slice_ms"] > 0.0) == (ks[i % len(ks)] < N)
        # lazy: the pass marks the kinematics stale; eager: FK inside the reset call
        assert timing["set_state_forward_kinematic_ms"] == 0.0
        for key in ("set_state_clear_forces_ms", "set_state_invalidate_velocity_ms",
                    "set_state_pool_reset_ms", "set_state_state_scatter_ms",
                    "set_state_refresh_pose_cache_ms"):
            assert timing[key] == 0.0, key  # in the pass, or do not apply on MotrixSim
    out = b.set_state(np.arange(N), *stand_rows(b, N, rng))
    assert out is not None and tuple(out["timing"]) == C.SET_STATE_KEYS
    b.close()


def _snapshot(b):
    return (np.array(b.get_qpos_rows(None)), np.array(b.get_qvel_rows(None)),
            np.array(b.data.actuator_ctrls),
            np.array(b.get_body_pose_rows(None, b.info.body_names)))


def _assert_same(before, after) -> None:
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x, y)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_set_state_changes_exactly_the_selected_rows(off_backend, data) -> None:
    b = off_backend
    n = b.num_envs
    ids = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # move every env first so that untouched rows differ from a fresh reset
    b.step(np.tile(b.keyframe_qpos[7:], (n, 1)) + rng.normal(0, 0.1, (n, 29)), 2)
    before_q, before_v, before_c, before_p = _snapshot(b)
    k = len(ids)
    q, v = stand_rows(b, k, rng)
    q[:, 3:7] = rng.normal(size=(k, 4)) * 3.0  # any non-zero quaternion is normalised
    b.set_state(np.array(ids), q, v)
    after_q, after_v, after_c, after_p = _snapshot(b)
    other = np.setdiff1d(np.arange(n), ids)
    np.testing.assert_array_equal(after_q[other], before_q[other])
    np.testing.assert_array_equal(after_v[other], before_v[other])
    np.testing.assert_array_equal(after_c[other], before_c[other])
    np.testing.assert_array_equal(after_p[other], before_p[other])
    unit = q[:, 3:7] / np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)
    # read back in contract layout: the base quaternion is wxyz again
    np.testing.assert_allclose(after_q[ids, 3:7], unit, atol=F32_ATOL)
    np.testing.assert_allclose(after_q[ids, :3], q[:, :3], atol=F32_ATOL)
    np.testing.assert_allclose(after_q[ids, 7:], q[:, 7:], atol=F32_ATOL)
    np.testing.assert_allclose(after_v[ids], v, atol=F32_ATOL)
    lo, hi = b.info.ctrl_range.T
    np.testing.assert_allclose(after_c[ids], np.clip(q[:, 7:][:, b.info.actuator_joint], lo, hi),
                               atol=F32_ATOL)
    # kinematics of the reset rows are fresh: the pelvis pose is the new base pose
    pose = b.get_body_pose_rows(np.array(ids), ["pelvis"])[:, 0]
    np.testing.assert_allclose(pose[:, :3], q[:, :3], atol=F32_ATOL)
    np.testing.assert_allclose(np.abs(np.sum(pose[:, 3:] * unit, axis=1)), 1.0, atol=F32_ATOL)


def test_unsorted_ids_keep_their_rows(off_backend) -> None:
    b = off_backend
    q, v = stand_rows(b, 3, np.random.default_rng(3))
    b.set_state(np.array([9, 2, 5]), q, v)
    np.testing.assert_allclose(b.get_qpos_rows(np.array([9, 2, 5]))[:, :3], q[:, :3],
                               atol=F32_ATOL)
    np.testing.assert_allclose(b.get_qvel_rows(np.array([9, 2, 5])), v, atol=F32_ATOL)


def test_row_reads_match_the_full_reads(off_backend) -> None:
    b = off_backend
    b.step(np.tile(b.keyframe_qpos[7:], (b.num_envs, 1)), 2)
    rows = np.array([3, 3, 0, 15, -1])  # duplicates and numpy's negative ids
    np.testing.assert_array_equal(b.get_qpos_rows(rows), b.get_qpos_rows(None)[rows])
    np.testing.assert_array_equal(b.get_qvel_rows(rows), b.get_qvel_rows(None)[rows])
    assert b.get_qpos_rows(np.zeros(0, np.int64)).shape == (0, 36)
    with pytest.raises(IndexError):
        b.get_qpos_rows([16])
    with pytest.raises(IndexError):
        b.get_body_pose_rows([0, -17], ["pelvis"])
    with pytest.raises(ValueError, match="unknown body name"):
        b.get_body_pose_rows([0], ["wing"])


def test_poses_after_a_step_are_the_engines(off_backend) -> None:
    """After a step the cache is stale: the rows asked for are re-read from the engine."""
    b = off_backend
    n = b.num_envs
    before = b.get_body_pose_rows(None, ["pelvis"]).copy()
    b.step(np.tile(b.keyframe_qpos[7:], (n, 1)) + 0.2, 3)
    engine = b.model.get_link_poses(b.data)  # (n, links, 7) xyz + xyzw
    got = b.get_body_pose_rows([4, 1], b.info.body_names)
    np.testing.assert_array_equal(got[:, 1:, :3], engine[[4, 1], :, :3])
    np.testing.assert_array_equal(got[:, 1:, 3], engine[[4, 1], :, 6])
    np.testing.assert_array_equal(got[:, 1:, 4:], engine[[4, 1], :, 3:6])
    assert not np.array_equal(got[:, 1], before[[4, 1], 0])  # the robot moved


BAD = [
    ("out of range", lambda q, v: ([0, 16], q[:2], v[:2]), "in \\[0, 16\\)"),
    ("far out of range", lambda q, v: ([0, 10**9], q[:2], v[:2]), "in \\[0, 16\\)"),
    ("negative", lambda q, v: ([-1, 3], q[:2], v[:2]), "in \\[0, 16\\)"),
    ("duplicated", lambda q, v: ([4, 4], q[:2], v[:2]), "unique"),
    ("float ids", lambda q, v: (np.array([1.0, 2.0]), q[:2], v[:2]), "integers"),
    ("2-D ids", lambda q, v: (np.array([[1, 2]]), q[:2], v[:2]), "one-dimensional"),
    ("bool mask", lambda q, v: (np.ones(16, bool), q, v), "boolean mask"),
    ("long bool mask", lambda q, v: (np.ones(19, bool), q, v), "boolean mask"),
    ("qpos shape", lambda q, v: ([1, 2], q[:3], v[:2]), "qpos must have shape \\(2, 36\\)"),
    ("qpos width", lambda q, v: ([1, 2], q[:2, :-1], v[:2]), "qpos must have shape"),
    ("qvel shape", lambda q, v: ([1, 2], q[:2], v[:2, :-1]), "qvel must have shape"),
    ("nan qpos", lambda q, v: ([1, 2], _with(q[:2], (1, 9), np.nan), v[:2]), "non-finite"),
    ("inf qvel", lambda q, v: ([1, 2], q[:2], _with(v[:2], (0, 0), np.inf)), "non-finite"),
    ("zero quat", lambda q, v: ([1, 2], _with(q[:2], (0, slice(3, 7)), 0.0), v[:2]),
     "zero base quaternion at row 0"),
    ("float32 overflow", lambda q, v: ([1, 2], _with(q[:2], (1, 0), 1e39), v[:2]),
     "too large for float32"),
    # a quaternion whose squared norm overflows float64 is out of float32's range first
    *[(f"huge quat {x:g}", lambda q, v, x=x: ([1, 2], _with(q[:2], (1, slice(3, 5)), x),
                                              v[:2]),
       "too large for float32 at row 1, column 3") for x in (1e200, 1.7e308, -1e308)],
    ("text qpos", lambda q, v: ([1, 2], np.full((2, 36), "a"), v[:2]), "numeric"),
]


def _with(a, index, value):
    a = np.array(a)
    a[index] = value
    return a


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("make_args,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_and_touches_nothing(off_backend, make_args, match) -> None:
    b = off_backend
    q, v = stand_rows(b, 16, np.random.default_rng(4))
    before = _snapshot(b)
    with pytest.raises(ValueError, match=match):
        b.set_state(*make_args(q, v))
    _assert_same(before, _snapshot(b))


@pytest.mark.parametrize("ctrl,nsteps,match", [
    (np.zeros((16, 28)), 1, "ctrl must have shape \\(16, 29\\)"),
    (np.zeros(29), 1, "ctrl must have shape"),
    (_with(np.zeros((16, 29)), (3, 4), np.nan), 1, "non-finite"),
    (np.full((16, 29), "x"), 1, "numeric"),
    (np.zeros((16, 29)), -1, "nsteps"),
    (np.zeros((16, 29)), 1.5, "nsteps"),
])
def test_bad_step_raises_and_touches_nothing(off_backend, ctrl, nsteps, match) -> None:
    b = off_backend
    before = _snapshot(b)
    with pytest.raises(ValueError, match=match):
        b.step(ctrl, nsteps)
    _assert_same(before, _snapshot(b))


def test_empty_ids_is_a_no_op(timing_session) -> None:
    b = _make(timing_session, num_envs=4)
    before = _snapshot(b)
    out = b.set_state(np.zeros(0, np.int64), np.zeros((0, 36)), np.zeros((0, 35)))
    assert out is not None and tuple(out["timing"]) == C.SET_STATE_KEYS
    _assert_same(before, _snapshot(b))
    b.close()


def test_user_model_path_and_errors(tmp_path) -> None:
    import mujoco

    off = Tracing(resettrace.Config())
    with pytest.raises(FileNotFoundError, match="model file not found"):
        _make(off, num_envs=1, model=tmp_path / "missing.xml")
    arm = tmp_path / "arm.xml"
    arm.write_text("<mujoco><worldbody><body><joint type='hinge'/><geom size='.1'/></body>"
                   "</worldbody></mujoco>")
    with pytest.raises(ValueError, match="floating base"):
        _make(off, num_envs=1, model=arm)
    with pytest.raises(TypeError, match="MJCF path"):
        _make(off, num_envs=1, model=mujoco.MjModel.from_xml_string("<mujoco/>"))
    with pytest.raises(ValueError, match="num_envs"):
        _make(off, num_envs=0)


def test_user_model_loads_from_a_path(tmp_path) -> None:
    """A user MJCF: one floating base and one position-actuated hinge, no keyframe."""
    xml = tmp_path / "pendulum.xml"
    xml.write_text("""
<mujoco><worldbody>
  <body name="base" pos="0 0 1"><freejoint/><geom size=".1" mass="1"/>
    <body name="arm"><joint name="hinge" type="hinge" axis="0 1 0" range="-1 1"/>
      <geom type="capsule" fromto="0 0 0 0 0 -.5" size=".05" mass=".5"/></body></body>
</worldbody><actuator><position joint="hinge" kp="10" ctrlrange="-1 1"/></actuator>
</mujoco>""")
    b = _make(Tracing(resettrace.Config()), num_envs=3, model=xml)
    assert (b.nq, b.nv, b.nu) == (8, 7, 1)
    assert b.info.body_names == ("world", "base", "arm")
    q = np.tile(b.keyframe_qpos, (1, 1))
    q[0, :3] = (0.5, 0.0, 2.0)
    q[0, 7] = 0.3
    b.set_state([2], q, np.zeros((1, 7)))
    np.testing.assert_allclose(b.get_body_pose_rows([2], ["base"])[0, 0, :3], q[0, :3],
                               atol=F32_ATOL)
    b.step(np.zeros((3, 1)), 2)
    assert np.isfinite(b.get_qpos_rows(None)).all()
    b.close()


def test_layout_mismatch_is_a_clear_error() -> None:
    info = SimpleNamespace(joint_names=("a", "b"), actuator_names=("a",),
                           body_names=("world", "base", "l1"))
    engine = SimpleNamespace(joint_names=["b", "a"], actuator_names=["a"],
                             link_names=["base", "l1"])
    with pytest.raises(ValueError, match="order the model's joints differently.*index 0"):
        motrix_mod._check_same_layout(engine, None, info)  # type: ignore[arg-type]
    engine.joint_names = ["a", "b"]
    engine.link_names = ["base"]
    with pytest.raises(ValueError, match="links differently: 1 vs 2 links"):
        motrix_mod._check_same_layout(engine, None, info)  # type: ignore[arg-type]


class _FakePanic(BaseException):
    """Stands in for ``pyo3_runtime.PanicException`` (a BaseException)."""


@pytest.mark.parametrize("exc,expected", [
    (_FakePanic("boom"), RuntimeError),
    (ValueError("clean"), ValueError),
    (KeyboardInterrupt(), KeyboardInterrupt),
    (SystemExit(3), SystemExit),
])
def test_engine_panics_become_runtime_errors(exc, expected) -> None:
    guard = motrix_mod._Guard("SceneModel.step")
    with pytest.raises(expected) as info:
        with guard:
            raise exc
    if expected is RuntimeError:
        assert "motrixsim SceneModel.step panicked: boom" in str(info.value)
        assert info.value.__cause__ is exc


def _swap_handle(b, ids: np.ndarray, sub) -> None:
    """Put ``sub`` where set_state keeps its handle on ``ids`` (written before)."""
    held = b._passes[len(ids)].held
    (slot,) = np.flatnonzero((held.ids == ids).all(axis=1))
    held.subs[slot] = sub


@pytest.mark.parametrize("call", ["reset", "actuator_ctrls"])
def test_a_panic_inside_set_state_is_a_runtime_error_naming_the_call(call) -> None:
    """set_state's reset and control writes share one guard: a panic in either (here a
    stand-in on the kept row handle) is a RuntimeError naming that call, and the rows are
    left stale for the next pose read."""
    b = _make(Tracing(resettrace.Config()), num_envs=8)
    try:
        ids = np.array([1, 3])
        q = np.tile(b.keyframe_qpos, (2, 1))
        v = np.zeros((2, b.nv))
        b.lazy_kinematics = False
        b.set_state(ids, q, v)
        real = b._slices[ids.astype(np.int32).tobytes()]

        class Panicking:
            def reset(self, *a, **kw):
                if call == "reset":
                    raise _FakePanic("boom")
                real.reset(*a, **kw)

            def __setattr__(self, name, value):
                raise _FakePanic("boom")

        _swap_handle(b, ids, Panicking())
        name = "SceneData.reset" if call == "reset" else "SceneData.actuator_ctrls"
        with pytest.raises(RuntimeError, match=f"motrixsim {name} panicked: boom") as info:
            b.set_state(ids, q, v)
        assert isinstance(info.value.__cause__, _FakePanic)
        assert b._kin_stale[ids].all()
        _swap_handle(b, ids, real)
        with pytest.raises(KeyboardInterrupt):  # not a panic: passes untouched
            _swap_handle(b, ids, SimpleNamespace(reset=lambda *a, **kw: (_ for _ in ()).throw(
                KeyboardInterrupt())))
            b.set_state(ids, q, v)
    finally:
        b.close()


def test_thread_pool_is_sized_once(off_backend, caplog) -> None:
    assert motrix_mod._pool_started
    with caplog.at_level(logging.WARNING, logger="resettrace.sim.backends.motrix"):
        motrix_mod.init_threads(NTHREAD + 5)
    assert "process-wide" in caplog.text
    with pytest.raises(ValueError, match="nthread"):
        motrix_mod.init_threads(-1)


# Every input that crashes MotrixSim when passed straight to the engine (CONTEXT section 3),
# run through the backend in a child process: a segfault or an uncaught panic kills the child.
CRASH_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from resettrace.sim.backends import motrix
    from resettrace.sim.backends.motrix import MotrixBackend

    N = 8
    b = MotrixBackend(num_envs=N, nthread=1)
    key = b.keyframe_qpos
    q2, v2 = np.tile(key, (2, 1)), np.zeros((2, b.nv))

    def unnormalised():
        q = q2.copy()
        q[:, 3:7] = 2.0
        return q

    def zero_quat():
        q = q2.copy()
        q[:, 3:7] = 0.0
        return q

    def nan_ctrl():
        c = np.tile(key[7:], (N, 1))
        c[0, 0] = np.nan
        return c

    cases = {
        "index out of range": lambda: b.set_state([0, N], q2, v2),
        "index far out of range": lambda: b.set_state([0, 10**6], q2, v2),
        "negative index": lambda: b.set_state([-1, 0], q2, v2),
        "over-long bool mask": lambda: b.set_state(np.ones(N + 3, bool), q2, v2),
        "bool mask": lambda: b.set_state(np.ones(N, bool), np.tile(key, (N, 1)),
                                         np.zeros((N, b.nv))),
        "qpos shape": lambda: b.set_state([0, 1], q2[:, :-1], v2),
        "qvel shape": lambda: b.set_state([0, 1], q2, v2[:1]),
        "zero quaternion": lambda: b.set_state([0, 1], zero_quat(), v2),
        "nan qpos": lambda: b.set_state([0, 1], q2 * np.nan, v2),
        "ctrl shape": lambda: b.step(np.zeros((N, b.nu - 1))),
        "ctrl rows": lambda: b.step(np.zeros((1, b.nu))),
        "nan ctrl": lambda: b.step(nan_ctrl()),
    }
    for name, call in cases.items():
        try:
            call()
        except ValueError as e:
            print("clean ValueError:", name, "|", e, flush=True)
        else:
            sys.exit(f"no ValueError for {name}")

    # an unnormalised quaternion is normalised, not a panic
    b.set_state([0, 1], unnormalised(), v2)
    assert np.allclose(b.get_qpos_rows([0, 1])[:, 3:7], 0.5, atol=1e-6)
    print("unnormalised quaternion normalised", flush=True)

    # a panic that does reach the engine (validation bypassed) is a RuntimeError
    try:
        with motrix._G_CTRL:
            b.data.actuator_ctrls = np.zeros((N, b.nu - 1), np.float32)
    except RuntimeError as e:
        print("engine panic as RuntimeError:", e, flush=True)
    else:
        sys.exit("the engine accepted a bad ctrl shape")

    b.step(np.tile(key[7:], (N, 1)), 2)  # the backend still works
    assert np.isfinite(b.get_qpos_rows(None)).all()
    print("child done", flush=True)
""")


def test_crash_cases_raise_cleanly_in_a_child_process() -> None:
    proc = subprocess.run([sys.executable, "-c", CRASH_CHILD], capture_output=True, text=True,
                          timeout=120)
    detail = f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail  # -11: segfault; 1 + PanicException: uncaught panic
    assert proc.stdout.count("clean ValueError:") == 12, detail
    assert "unnormalised quaternion normalised" in proc.stdout, detail
    assert "engine panic as RuntimeError: motrixsim SceneData.actuator_ctrls panicked" \
        in proc.stdout, detail
    assert proc.stdout.rstrip().endswith("child done"), detail


def test_a_closed_backend_refuses_a_reset_of_rows_it_reset_before() -> None:
    """The handles kept for repeating ids hold the engine's data: closing lets them go, and a
    reset after close fails clearly instead of writing through a kept handle."""
    b = _make(Tracing(resettrace.Config()), num_envs=8)
    ids = np.array([1, 4])
    b.set_state(ids, *stand_rows(b, 2))
    assert b._slices  # the handle of ids [1, 4] is kept
    b.close()
    assert b._slices == {}
    with pytest.raises(RuntimeError, match="closed"):
        b.set_state(ids, *stand_rows(b, 2))


def test_kept_handles_write_the_rows_of_their_own_ids(timing_session) -> None:
    """set_state keeps its handles on the last 16 id sets of each reset size, found by the
    compiled pass: over 24 id sets of one size (more than are kept), in a random order
    with physics steps between, every reset writes exactly what a backend that keeps no
    handles writes; a repeated id set reuses its handle (data_slice reads 0.0), a new or
    dropped one builds a handle there."""
    b = _make(timing_session)
    ref = _make(Tracing(resettrace.Config()))
    ref._kept_handles = 0  # every reset through the keyed handles (or new ones)
    try:
        rng = np.random.default_rng(24)
        sets = [np.sort(rng.choice(N, 5, replace=False)) for _ in range(24)]
        recent: list[int] = []  # the last 16 distinct sets, oldest first
        hits = misses = 0
        ctrl = np.tile(b.keyframe_qpos[7:], (N, 1))
        for _ in range(120):
            j = int(rng.integers(len(sets))) if rng.random() < 0.5 or not recent \
                else recent[int(rng.integers(len(recent)))]
            q, v = stand_rows(b, 5, rng)
            out = b.set_state(sets[j], q, v)
            ref.set_state(sets[j], q, v)
            kept = j in recent
            if not kept:
                recent = (recent + [j])[-16:]
            assert (out["timing"]["set_state_data_slice_ms"] == 0.0) == kept
            hits, misses = hits + kept, misses + (not kept)
            np.testing.assert_array_equal(b.get_qpos_rows(None), ref.get_qpos_rows(None))
            np.testing.assert_array_equal(b.get_qvel_rows(None), ref.get_qvel_rows(None))
            np.testing.assert_array_equal(b.get_body_pose_rows(None, ["pelvis"]),
                                          ref.get_body_pose_rows(None, ["pelvis"]))
            if rng.random() < 0.3:
                b.step(ctrl)
                ref.step(ctrl)
        assert hits > 20 and misses > 20
        assert ref._passes[5].held.subs == []
    finally:
        b.close()
        ref.close()


def test_a_handle_that_failed_to_build_is_built_at_the_next_reset(monkeypatch) -> None:
    """New ids are kept only with their handle: when building it fails, nothing is kept,
    and the next reset of those ids builds it, keeps it and writes their rows (not a
    neighbour's handle)."""
    b = _make(Tracing(resettrace.Config()), num_envs=8)
    try:
        rng = np.random.default_rng(3)
        b.set_state(np.array([0, 2]), *stand_rows(b, 2, rng))
        real = b._slice

        def failing(ids, key=None):
            raise RuntimeError("motrixsim DisjointIndices panicked: boom")

        monkeypatch.setattr(b, "_slice", failing)
        with pytest.raises(RuntimeError, match="boom"):
            b.set_state(np.array([1, 5]), *stand_rows(b, 2, rng))
        held = b._passes[2].held
        np.testing.assert_array_equal(held.ids[:2], [[0, 2], [-1, -1]])
        assert held.subs[0] is not None and held.subs[1] is None
        monkeypatch.setattr(b, "_slice", real)
        q, v = stand_rows(b, 2, rng)
        b.set_state(np.array([1, 5]), q, v)
        np.testing.assert_array_equal(held.ids[:2], [[0, 2], [1, 5]])
        assert held.subs[1] is not None
        np.testing.assert_allclose(b.get_qpos_rows([1, 5]), q, atol=F32_ATOL)
        np.testing.assert_allclose(b.get_qvel_rows([1, 5]), v, atol=F32_ATOL)
    finally:
        b.close()
