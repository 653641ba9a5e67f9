"""The published pre-optimisation ``set_state`` path and the engine floor of each engine,
next to the backends they mirror: what ``resettrace bench set-state-ab`` times the shipped
``set_state`` against (its module docstring says what each one does and why).

Both work on a MuJoCo or MotrixSim backend of this package and reach into it as the
backend's own code would (its state arrays, its randomization writer): they live here so
that a change of a backend's internals is made, and checked by the tests, beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.sim.backends._validate import check_ids, check_rows, normalise_quat_into

__all__ = ["baseline_set_state", "make_floor", "final_state"]

_XYZW_FROM_WXYZ = [4, 5, 6, 3]  # qpos columns of the engine's base quaternion


# -- baseline: the published pre-optimisation path -------------------------------------------
def _as_ids(env_ids: Any) -> np.ndarray:
    return np.asarray(env_ids, dtype=np.intp)  # repeated by each helper, as published


def _build_mask(env_ids: Any, num_envs: int) -> np.ndarray:
    mask = np.zeros(num_envs, dtype=bool)  # a fresh mask per call
    mask[_as_ids(env_ids)] = True
    return mask


def _convert_qpos(qpos: np.ndarray) -> np.ndarray:
    """Contract qpos (wxyz) to a unit quaternion, as published: a full copy first."""
    q = np.array(qpos, dtype=np.float64, copy=True)
    normalise_quat_into(q[:, 3:7], q[:, 3:7], "qpos")
    return q


def _motrix_baseline(be: Any, env_ids: Any, qpos: Any, qvel: Any, rand: Any) -> None:
    rec, model = be.recorder, be.model
    with rec.scope(C.SET_STATE_MASK):
        ids, order = check_ids(env_ids, be.num_envs)
        mask = _build_mask(ids, be.num_envs)
    with rec.scope(C.SET_STATE_QPOS_CONVERT):
        q_in = check_rows("qpos", qpos, ids.size, be.nq)
        v_in = check_rows("qvel", qvel, ids.size, be.nv)
        if order is not None:
            q_in, v_in = q_in[order], v_in[order]
        q = _convert_qpos(q_in)
        q[:, 3:7] = q[:, _XYZW_FROM_WXYZ]  # contract wxyz -> engine xyzw
        q = np.ascontiguousarray(q, dtype=np.float32)
        v = np.ascontiguousarray(v_in, dtype=np.float32)
        for name, a in (("qpos", q), ("qvel", v)):
            if not np.isfinite(a).all():
                raise ValueError(f"{name} has a value too large for float32")
    if not ids.size:
        return
    with rec.scope(C.SET_STATE_DATA_SLICE):
        sub = be.data[mask]  # O(N) whatever k is
    with rec.scope(C.SET_STATE_DATA_RESET):
        sub.reset(model)
    if rand is not None and not rand.empty:
        be._randomize(rec, sub, rand)
    with rec.scope(C.SET_STATE_SET_DOF_VEL):
        sub.set_dof_vel(v)
    with rec.scope(C.SET_STATE_SET_DOF_POS):
        sub.set_dof_pos(q, model)
    with rec.scope(C.SET_STATE_ACTUATOR_CTRL):
        ctrl = np.clip(q[:, 7 + be.info.actuator_joint], be.info.ctrl_range[:, 0],
                       be.info.ctrl_range[:, 1])
        sub.actuator_ctrls = np.ascontiguousarray(ctrl, dtype=np.float32)
    with rec.scope(C.SET_STATE_FORWARD_KINEMATIC):
        model.forward_kinematic(sub)
    with rec.scope(C.SET_STATE_REFRESH_POSE_CACHE):
        rows = _as_ids(ids)
        links = model.get_link_poses(sub)  # a fresh (k, links, 7) array, xyz + xyzw
        pose = be.poses.pose
        pose[rows, 1:, :3] = links[..., :3]
        pose[rows, 1:, 3] = links[..., 6]
        pose[rows, 1:, 4:] = links[..., 3:6]
        be.poses.fresh[rows] = True


def _mujoco_baseline(be: Any, env_ids: Any, qpos: Any, qvel: Any, rand: Any) -> None:
    from resettrace.sim.backends.mujoco import STAGE_NONE

    rec, b = be.recorder, be.batch
    with rec.scope(C.SET_STATE_MASK):
        ids, order = check_ids(env_ids, be.num_envs)
        mask = _build_mask(ids, be.num_envs)
        rows = np.flatnonzero(mask)
    with rec.scope(C.SET_STATE_QPOS_CONVERT):
        q_in = check_rows("qpos", qpos, ids.size, be.nq)
        v_in = check_rows("qvel", qvel, ids.size, be.nv)
        if order is not None:
            q_in, v_in = q_in[order], v_in[order]
        q = np.ascontiguousarray(_convert_qpos(q_in))
        v = np.ascontiguousarray(v_in, dtype=np.float64)
    if not ids.size:
        return
    with rec.scope(C.SET_STATE_DATA_RESET):
        b.reset(_as_ids(rows), stage=STAGE_NONE)
    if rand is not None and not rand.empty:
        be._randomize(rec, ids, rand)
    with rec.scope(C.SET_STATE_SET_DOF_POS):
        be._qpos[_as_ids(rows)] = q
    with rec.scope(C.SET_STATE_SET_DOF_VEL):
        be._qvel[_as_ids(rows)] = v
    with rec.scope(C.SET_STATE_ACTUATOR_CTRL):
        ctrl = np.clip(q[:, 7 + be.info.actuator_joint], be.info.ctrl_range[:, 0],
                       be.info.ctrl_range[:, 1])
        be._ctrl[_as_ids(rows)] = np.ascontiguousarray(ctrl)
    with rec.scope(C.SET_STATE_FORWARD_KINEMATIC):
        b.forward(_as_ids(rows))  # the full forward pass
    with rec.scope(C.SET_STATE_REFRESH_POSE_CACHE):
        r = _as_ids(rows)
        be.poses.pose[r, :, :3] = be._xpos[r]
        be.poses.pose[r, :, 3:] = be._xquat[r]
        be.poses.fresh[r] = True


def baseline_set_state(backend: Any, env_ids: Any, qpos: Any, qvel: Any,
                       randomization: Any = None) -> dict[str, Any] | None:
    """The published path on ``backend`` (a MuJoCo or MotrixSim backend of this package):
    same contract and timing dict as ``backend.set_state``."""
    impl = {"mujoco": _mujoco_baseline, "motrix": _motrix_baseline}[backend.name]
    rec = backend.recorder
    with rec.scope(C.SET_STATE, int(np.size(env_ids))) as outer:
        impl(backend, env_ids, qpos, qvel, randomization)
    return {"timing": t} if (t := outer.timing()) is not None else None


# -- floor: the fewest engine calls, nothing else ---------------------------------------------
def make_floor(backend: Any, env_ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray
               ) -> Callable[[], None]:
    """The bare engine floor for sorted unique ``env_ids``: inputs converted and the index
    built here, so the returned call does engine work only."""
    ids = np.ascontiguousarray(env_ids, dtype=np.int32)
    q = np.array(qpos, dtype=np.float64)
    normalise_quat_into(q[:, 3:7], q[:, 3:7], "qpos")
    info = backend.info
    lo, hi = info.ctrl_range[:, 0], info.ctrl_range[:, 1]
    if backend.name == "motrix":
        import motrixsim as ms

        model = backend.model
        q[:, 3:7] = q[:, _XYZW_FROM_WXYZ]
        qe = np.ascontiguousarray(q, dtype=np.float32)
        ve = np.ascontiguousarray(qvel, dtype=np.float32)
        ce = np.ascontiguousarray(np.clip(qe[:, 7 + info.actuator_joint], lo, hi),
                                  dtype=np.float32)
        sub = backend.data[ms.DisjointIndices(ids)]

        def motrix_floor() -> None:
            sub.reset(model, qe, ve, forward_kinematic=True)
            sub.actuator_ctrls = ce

        return motrix_floor
    from resettrace.sim.backends.mujoco import forward_rows, state_columns

    b, m = backend.batch, backend.model
    cq, cv, cc = state_columns(m)
    rows = np.tile(backend._template, (ids.size, 1))
    rows[:, cq] = q
    rows[:, cv] = qvel
    rows[:, cc] = np.clip(q[:, 7 + info.actuator_joint], lo, hi)
    state, warning, fk = backend._state, backend._warning, forward_rows(b)

    def mujoco_floor() -> None:
        state[ids] = rows
        warning[ids] = 0
        fk(ids)  # the engine's call on ids checked here, as set_state's

    return mujoco_floor


def final_state(backend: Any, env_ids: Any) -> dict[str, np.ndarray]:
    """qpos, qvel, ctrl and every body pose of ``env_ids`` as the contract reads them (the
    floor leaves the pose cache alone: poses are read back from the engine)."""
    ids = np.asarray(env_ids, np.intp)
    backend.poses.mark_stale(ids)  # poses from the engine's current kinematics
    if backend.name == "motrix":
        ctrl = np.asarray(backend.data.actuator_ctrls, np.float64)[ids]
    else:
        ctrl = np.array(backend._ctrl[ids])
    return {"qpos": np.array(backend.get_qpos_rows(ids)),
            "qvel": np.array(backend.get_qvel_rows(ids)),
            "ctrl": ctrl,
            "pose": np.array(backend.get_body_pose_rows(ids, backend.info.body_names))}
