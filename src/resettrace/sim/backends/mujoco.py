"""MuJoCo backend: ``num_envs`` rows of one ``mujoco.batch.Batch``, stepped on a thread pool.

``set_state`` for k of N rows (every step timed under its catalog phase). No step does
O(N) work: ids become an int32 index (never a bool mask), scratch rows are reused (grown
when k exceeds them), and the engine is called once (``forward`` of the k rows, eager
only):

=================  ====================================================================
mask               0.0: the ids are checked in qpos_convert (no bool mask)
qpos_convert       the ids a 1-D integer array; then one compiled pass: check the ids
                   (sorted, unique, in range) into an int32 index, validate qpos/qvel,
                   normalise the base quaternion, compute the actuator targets, into
                   reused **whole state rows** (the state row of a freshly reset env, with
                   qpos, qvel and ctrl in their columns); once all is good, the same pass
                   writes them into the engine's state rows of the k envs (a fresh reset,
                   the new qpos, qvel and controls: ``Batch.reset(ids, stage=NONE)`` and
                   three row writes in one), clears their warning counters and marks their
                   pose cache stale (and, lazy, their kinematics)
reset_rand         per-env friction, mass (then ``set_const``), kp/kd of the k rows
geom_overrides     per-env contact geom sizes (and bounding radii) of the k rows
data_reset         0.0: the state rows are written by the qpos_convert pass
set_dof_pos/vel    0.0: written with the state rows
actuator_ctrl      0.0: written with the state rows (the targets hold the new joint pose)
forward_kinematic  lazy (default): 0.0, nothing runs here; the k rows' kinematics are
                   computed (``forward(ids, stage=POS)`` of the stale rows) when their poses
                   are read, timed in the reader's phase, or not at all when the next
                   physics step, which recomputes them, comes first; eager
                   (``lazy_kinematics = False``): ``forward(ids, stage=POS)`` here
refresh_pose_cache 0.0: the pass marks the rows stale; ``get_body_pose_rows`` copies
                   ``xpos``/``xquat`` of the rows asked when they are read, so that cost is
                   timed where the poses are read (e.g. the reset observation)
=================  ====================================================================

``reset_rand`` and ``geom_overrides`` run only with a randomization payload
(:class:`~resettrace.sim.randomization.RandomizationRows`); the batch then keeps
per-env copies of those model fields. They run after the state rows are written (they
change model fields only: ``set_const`` leaves the state rows as they were); the payload is
validated before the pass, so a bad one leaves every row untouched.
``data_slice`` (no slice handle: rows are indexed directly), ``clear_forces`` (applied
forces are state rows, zeroed by the data reset), ``invalidate_velocity``, ``pool_reset``
and ``state_scatter`` (the rows are written in place) do not apply and are reported as
0.0.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np
from mujoco import batch as mj_batch

from resettrace import catalog as C
from resettrace.sim.backends._base import (
    KeptHandles,
    PassTarget,
    RowBackend,
    Scratch,
    check_num_envs,
)
from resettrace.sim.backends._pose import PoseCache
from resettrace.sim.backends._validate import OutRows
from resettrace.sim.model_facts import (
    DEFAULT_MODEL,
    KEYFRAME,
    describe_model,
    load_model,
    robot_contact_geoms,
)
from resettrace.sim.randomization import RandomizationRows
from resettrace.tracing.recorder import NoopRecorder, NoopScope, Recorder, Scope

log = logging.getLogger(__name__)

__all__ = ["MujocoBackend", "load_model", "DEFAULT_MODEL", "KEYFRAME"]

STAGE_NONE = int(mujoco.mjtStage.mjSTAGE_NONE)
_STAGE_POS = int(mujoco.mjtStage.mjSTAGE_POS)


def forward_rows(batch: Any) -> Callable[[np.ndarray], None]:
    """``fk(ids)``: forward kinematics (``stage=POS``) of the sorted unique int32 rows
    ``ids``, already validated: the engine's own call, without ``Batch.forward``'s second
    check of the ids (several numpy calls); failures raise as ``Batch.forward`` raises
    them. ``Batch.forward`` itself where ``mujoco.batch`` lacks those internals."""
    raw, check = getattr(batch, "_b", None), getattr(batch, "_check", None)
    if raw is None or check is None or not hasattr(raw, "forward"):
        return lambda ids: batch.forward(ids, stage=_STAGE_POS)
    engine_forward = raw.forward

    def fk(ids: np.ndarray) -> None:
        nfail = engine_forward(ids, _STAGE_POS)
        if nfail:
            check(ids, nfail)

    return fk


def state_columns(m: mujoco.MjModel) -> tuple[slice, slice, slice]:
    """The qpos, qvel and ctrl columns of a ``Batch.state`` row (mjSTATE_INTEGRATION):
    each component follows every component of a lower bit."""
    sig = mujoco.mjtState
    return tuple(slice(at, at + n) for at, n in  # type: ignore[return-value]
                 ((int(mujoco.mj_stateSize(m, int(s) - 1)), n)
                  for s, n in ((sig.mjSTATE_QPOS, m.nq), (sig.mjSTATE_QVEL, m.nv),
                               (sig.mjSTATE_CTRL, m.nu))))


class MujocoBackend(RowBackend):
    """``num_envs`` simulations of one MuJoCo model in a ``mujoco.batch.Batch``."""

    name = "mujoco"

    def __init__(self, *, num_envs: int, model: Any = None, nthread: int | None = None,
                 recorder: Recorder | NoopRecorder | None = None) -> None:
        self.num_envs = check_num_envs(num_envs)
        self.model = load_model(model)
        self.info = describe_model(self.model, self.name,
                                   model if isinstance(model, (str, os.PathLike)) else None)
        m = self.model
        self._init_rows(m)
        self.recorder = recorder
        nthread = (os.cpu_count() or 1) if nthread is None else int(nthread)
        self.batch: Any = mj_batch.Batch(m, self.num_envs, nthread=nthread)
        b = self.batch
        # bind every view before the first call: derived fields are copied out per call
        self._qpos, self._qvel, self._ctrl = b.bind("qpos"), b.bind("qvel"), b.bind("ctrl")
        self._xpos, self._xquat = b.bind("xpos"), b.bind("xquat")
        self._state = b.state
        self._warning = b.warning
        # the state row of a freshly reset env: writing it equals Batch.reset(stage=NONE)
        probe = mj_batch.Batch(m, 1, nthread=1)
        probe.reset(stage=STAGE_NONE)
        self._template = np.array(probe.state[0])
        del probe
        # reset rows are built whole (the template, qpos, qvel and ctrl in their columns)
        # and written into the engine's state rows by the compiled pass
        cols = state_columns(m)
        if cols[-1].stop > self._template.size:
            raise RuntimeError(f"mujoco.batch state rows of width {self._template.size} "
                               f"do not hold qpos/qvel/ctrl where mjSTATE_INTEGRATION does")
        self._state_cols = tuple(c.start for c in cols)
        self._state_rows = Scratch(self._template.shape, fill=self._template)
        self._fk = forward_rows(b)
        self.poses = PoseCache(self.num_envs, self.info.body_names, self._refresh_pose)
        # the robot's colliding geoms (not the world's), and those whose size can scale
        self._contact_geoms, self._sized_geoms = robot_contact_geoms(m)
        self._start_at_keyframe()

    # -- contract (set_state: RowBackend's, with _write_rows below) --------------------------
    def step(self, ctrl: np.ndarray, nsteps: int = 1) -> None:
        if self.batch is None:
            raise RuntimeError("the mujoco backend is closed")
        if ctrl.shape != (self.num_envs, self.nu):
            raise ValueError(f"ctrl must have shape ({self.num_envs}, {self.nu}), "
                             f"got {ctrl.shape}")
        self._ctrl[...] = ctrl
        self.batch.step(nstep=int(nsteps))
        if nsteps:
            self._kin_stale[:] = False  # the step computed every row's kinematics
        self.poses.mark_stale()

    def _reset_rows(self, k: int) -> PassTarget:
        (rows,) = self._state_rows.rows(k)  # qpos, qvel and ctrl are columns of these rows
        oq, ov, oc = self._state_cols
        # the pass writes them into the engine's state rows and clears the warnings
        return (OutRows(rows, oq, rows, ov, rows, oc, self.nq, self.nv), self._state,
                self._warning)

    def _write_rows(self, rec: Recorder | NoopRecorder, outer: Scope | NoopScope,
                    ids: np.ndarray, rows: OutRows, rand: RandomizationRows | None,
                    held: KeptHandles, slot: int) -> None:
        # qpos_convert's pass has written the state rows and cleared the warning counters
        outer.lap(None)
        if rand is not None:
            self._randomize(rec, ids, rand)
        self._kinematics(outer, ids, None)  # the pose cache: marked stale in qpos_convert

    def _expanded(self, name: str) -> np.ndarray:
        """The per-env copy of a model field (made on first use: it costs memory)."""
        return self.batch.expand(name)

    def _randomize(self, rec: Recorder | NoopRecorder, ids: np.ndarray,
                   rand: RandomizationRows) -> None:
        """Per-env model fields of the reset rows; scales apply to the model's own values."""
        m, contact = self.model, self._contact_geoms
        with rec.scope(C.SET_STATE_RESET_RAND):
            friction = rand.get("friction")
            if friction is not None:
                gf = self._expanded("geom_friction")
                gf[ids[:, None], contact, 0] = friction[:, None]
            mass = rand.get("mass_scale")
            if mass is not None:
                self._expanded("body_mass")[ids] = m.body_mass * mass[:, None]
                self._expanded("body_inertia")[ids] = m.body_inertia * mass[:, None, None]
                self.batch.set_const(ids)  # derived masses follow
            kp, kd = rand.get("kp_scale"), rand.get("kd_scale")
            if kp is not None or kd is not None:
                gain = self._expanded("actuator_gainprm")
                bias = self._expanded("actuator_biasprm")
                if kp is not None:
                    gain[ids, :, 0] = m.actuator_gainprm[:, 0] * kp[:, None]
                    bias[ids, :, 1] = m.actuator_biasprm[:, 1] * kp[:, None]
                if kd is not None:
                    bias[ids, :, 2] = m.actuator_biasprm[:, 2] * kd[:, None]
        size = rand.get("geom_size_scale")
        if size is not None:
            with rec.scope(C.SET_STATE_GEOM_OVERRIDES):
                scale, sized = size[:, None], self._sized_geoms
                self._expanded("geom_size")[ids[:, None], sized] = \
                    m.geom_size[sized] * scale[:, :, None]
                # the broad phase reads the bounding radius: keep it in step with the size
                self._expanded("geom_rbound")[ids[:, None], sized] = \
                    m.geom_rbound[sized] * scale

    def _forward(self, ids: np.ndarray, index: Any) -> None:
        self._fk(ids)

    def _refresh_pose(self, ids: np.ndarray) -> None:
        """Poses of the rows from the engine's last call on them."""
        self._fresh_kinematics(ids)
        pose = self.poses.pose
        pose[ids, :, :3] = self._xpos[ids]
        pose[ids, :, 3:] = self._xquat[ids]

    def get_qpos_rows(self, env_ids: Any = None) -> np.ndarray:
        """All rows: the live engine view (do not write it); else a copy of the rows."""
        return self._qpos if env_ids is None else self._qpos[np.asarray(env_ids, np.intp)]

    def get_qvel_rows(self, env_ids: Any = None) -> np.ndarray:
        return self._qvel if env_ids is None else self._qvel[np.asarray(env_ids, np.intp)]

    def get_body_pose_rows(self, env_ids: Any, body_names: tuple[str, ...] | list[str]
                           ) -> np.ndarray:
        rows = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, np.intp)
        return self.poses.rows(rows, body_names)

    def close(self) -> None:
        self.batch = None
        self._passes.clear()  # a reset after this refuses (_is_closed)

    def _is_closed(self) -> bool:
        return self.batch is None


if TYPE_CHECKING:  # a type checker proves this backend satisfies the contract
    from resettrace.sim.contract import SimBackend

    _check: type[SimBackend] = MujocoBackend
