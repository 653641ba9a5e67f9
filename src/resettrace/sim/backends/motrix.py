"""MotrixSim backend: ``num_envs`` worlds of one ``motrixsim.SceneData`` batch.

``set_state`` for k of N rows (every step timed under its catalog phase). No step does
O(N) work: ids become an index (never a bool mask), scratch rows are reused (grown when k
exceeds them), and the engine is called at most four times (slice, unless the ids
repeat; fused reset + DoF write; controls; eager kinematics of the k rows, fused into the
reset when no randomization comes between):

=================  ====================================================================
mask               0.0: the ids are checked in qpos_convert (no bool mask: slicing by one
                   is O(N))
qpos_convert       the ids a 1-D integer array; then one compiled pass: check the ids
                   (sorted, unique, in range) into an int32 index, validate qpos/qvel,
                   normalise the base quaternion, contract **wxyz** to engine **xyzw**,
                   compute the actuator targets, into reused float32 scratch rows, and
                   mark the rows' pose cache stale (and, lazy, their kinematics)
data_slice         ``data[DisjointIndices(ids)]``: a handle on the k rows, O(k); the
                   handles of the last 16 id sets of each reset size are kept (the
                   first kept goes first), and ids that repeat reuse theirs, found by the
                   qpos_convert pass (0.0 here then); handles are also kept by the ids'
                   bytes for 16 id sets of any size, which the lazy pose read of the same
                   rows reuses
data_reset         ``sub.reset(model, q, v)``: one fused engine call that resets the rows
                   (DoF state, controls and override buffers back to the model defaults)
                   **and** writes their DoF positions and velocities
reset_rand         per-env overrides of the k rows: contact-geom friction, link mass and
                   inertia, actuator kp and damping (``set_*_override(sub, values)``)
geom_overrides     per-env contact-geom sizes of the k rows (``set_size_override``)
set_dof_vel/pos    0.0: covered by the fused ``data_reset`` call
actuator_ctrl      ``sub.actuator_ctrls = ctrl`` (full ``(k, nu)``): position targets hold
                   the new joint pose, clipped to the control range
forward_kinematic  lazy (default): 0.0, nothing runs here (the qpos_convert pass marks
                   the rows stale); their kinematics are computed
                   (``model.forward_kinematic`` on the stale rows) when their poses
                   are read, timed in the reader's phase, or not at all when the next
                   physics step comes first (it recomputes them: eager and lazy runs are
                   bit-identical); eager (``lazy_kinematics = False``):
                   ``model.forward_kinematic(sub)`` here, or, with no randomization
                   payload, inside the ``data_reset`` call (0.0 here; see below)
refresh_pose_cache 0.0: the qpos_convert pass marks the rows' pose cache stale; poses
                   are read back lazily,
                   for the rows asked, by ``get_body_pose_rows`` (one
                   ``model.get_link_poses`` on those rows), so their cost is timed where
                   they are read (e.g. the reset observation)
=================  ====================================================================

Eager kinematics with no randomization payload is fused into the reset call
(``sub.reset(model, q, v, forward_kinematic=True)``): one engine call instead of two
(what it saves: "Lazy kinematics" in docs/reference.md). The forward_kinematic key then
reads 0.0 and
``data_reset`` carries the kinematics. With a payload FK stays a call of its own, after
the overrides, under its own key.

``reset_rand`` and ``geom_overrides`` run only with a randomization payload
(:class:`~resettrace.sim.randomization.RandomizationRows`). ``clear_forces`` (external forces
are consumed by the step that applies them: nothing is left to clear),
``invalidate_velocity`` (no velocity cache is exposed: the next step recomputes
everything), ``pool_reset`` and ``state_scatter`` do not apply and are reported as 0.0.

MotrixSim has no bounds checks: an out-of-range index or an over-long mask can crash the
process, and a bad quaternion or control shape panics. Every input is validated before
any engine call, and a panic that still escapes an engine call (``PanicException``, a
``BaseException``) is turned into a ``RuntimeError`` naming the call; rows written before
the panic keep their writes.

The engine computes in float32: states read back round to float32, poses agree with
MuJoCo's to about 1e-6.

MotrixSim's thread pool is process-wide and can be sized only before the first step of
the process: the first backend's ``nthread`` sizes it, later ones log a warning when they
ask for another size.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from resettrace import catalog as C
from resettrace.sim.backends._base import KeptHandles, RowBackend, Scratch, check_num_envs
from resettrace.sim.backends._pose import PoseCache
from resettrace.sim.backends._validate import OutRows
from resettrace.sim.contract import BackendInfo
from resettrace.sim.model_facts import (
    DEFAULT_MODEL,
    actuator_force_limits,
    actuator_gains,
    describe_model,
    load_model,
    model_label,
    motrix_option_differences,
    robot_contact_geoms,
    warn_once,
)
from resettrace.sim.randomization import RandomizationRows
from resettrace.tracing.recorder import NoopRecorder, NoopScope, Recorder, Scope

os.environ.setdefault("RUST_LOG", "error")  # before the import: silences loader warnings
import motrixsim as ms  # noqa: E402
from motrixsim import query as ms_query  # noqa: E402

log = logging.getLogger(__name__)

__all__ = ["MotrixBackend", "init_threads"]

_F32 = np.float32
#: quaternion slots of the floating base: contract wxyz <- engine xyzw
_CONTRACT_FROM_ENGINE = (6, 3, 4, 5)  # contract w, x, y, z <- engine columns
_POSE_FROM_ENGINE = np.array([0, 1, 2, 6, 3, 4, 5])  # xyz + xyzw -> xyz + wxyz

_pool_threads: int | None = None  # threads asked of the process-wide pool, once
_pool_started = False


def init_threads(nthread: int | None) -> None:
    """Size MotrixSim's process-wide thread pool once; later calls only log a mismatch.

    ``None`` or 0: the engine default (one worker per logical CPU).
    """
    global _pool_threads, _pool_started
    want = None if nthread is None or int(nthread) == 0 else int(nthread)
    if want is not None and want < 0:
        raise ValueError(f"nthread must be >= 0, got {nthread}")
    if _pool_started:
        if want is not None and want != _pool_threads:
            log.warning("motrixsim's thread pool is process-wide and already runs with %s "
                        "threads: nthread=%d is ignored",
                        _pool_threads or "the default number of", want)
        return
    try:
        ms.init_thread_pool(num_threads=want)
        _pool_threads = want
    except RuntimeError as e:  # something else in this process stepped motrixsim first
        log.warning("motrixsim's thread pool was started elsewhere in this process "
                    "(nthread=%s ignored): %s", want, e)
    _pool_started = True


class _Guard:
    """Turns an engine panic (``pyo3_runtime.PanicException``, a ``BaseException``) into a
    ``RuntimeError`` naming the call; ordinary exceptions, ``KeyboardInterrupt`` and
    ``SystemExit`` pass untouched. One shared instance per engine call: no allocation."""

    __slots__ = ("call",)

    def __init__(self, call: str) -> None:
        self.call = call

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None or issubclass(exc_type, (Exception, KeyboardInterrupt,
                                                     SystemExit, GeneratorExit)):
            return None
        raise RuntimeError(f"motrixsim {self.call} panicked: {exc}") from exc


_G_LOAD = _Guard("load_model")
_G_DATA = _Guard("SceneData")
_G_INDICES = _Guard("DisjointIndices")
#: row handles kept for id sets that repeat (a handle holds ~k ints)
_SLICES = 16
_G_SLICE = _Guard("SceneData[DisjointIndices]")
_G_RESET = _Guard("SceneData.reset")
_G_CTRL = _Guard("SceneData.actuator_ctrls")
_G_FK = _Guard("SceneModel.forward_kinematic")
_G_QUERY = _Guard("QueryProgram.execute")
_G_POSES = _Guard("SceneModel.get_link_poses")
_G_STEP = _Guard("SceneModel.step")
_G_READ = _Guard("SceneData.dof_pos/dof_vel")
_G_RAND = _Guard("per-env overrides")


def _model_path(model: Any) -> Path:
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise TypeError("the motrix backend loads a model from an MJCF path (or None for the "
                        f"bundled G1), got {type(model).__name__}")
    path = Path(DEFAULT_MODEL if model is None else model)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    return path


def _check_same_layout(engine: Any, mj: mujoco.MjModel, info: BackendInfo) -> None:
    """MotrixSim's joint, actuator and link order must be MuJoCo's for the same file."""
    pairs = (
        ("joint", list(engine.joint_names), list(info.joint_names)),
        ("actuator", list(engine.actuator_names), list(info.actuator_names)),
        ("link", list(engine.link_names), list(info.body_names[1:])),  # MuJoCo body 0: world
    )
    for what, got, want in pairs:  # an unnamed entity (None) matches MuJoCo's fallback name
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False))
                      if a is not None and a != b), min(len(got), len(want)))
        if first < max(len(got), len(want)):
            raise ValueError(
                f"motrixsim and MuJoCo order the model's {what}s differently: {len(got)} vs "
                f"{len(want)} {what}s, first difference at index {first} "
                f"({got[first] if first < len(got) else None!r} vs "
                f"{want[first] if first < len(want) else None!r})")
    if (int(engine.num_dof_pos), int(engine.num_dof_vel)) != (int(mj.nq), int(mj.nv)):
        raise ValueError(f"motrixsim has {engine.num_dof_pos} dof positions and "
                         f"{engine.num_dof_vel} velocities, MuJoCo nq={mj.nq}, nv={mj.nv}")
    qadr = [int(a) for a in engine.joint_dof_pos_indices]
    if qadr != [int(a) for a in mj.jnt_qposadr[1:]]:
        raise ValueError("motrixsim's joint dof positions are not laid out as MuJoCo's qpos")
    if len(engine.floating_bases) != 1:
        raise ValueError(f"the model must have exactly one floating base, motrixsim sees "
                         f"{len(engine.floating_bases)}")


class MotrixBackend(RowBackend):
    """``num_envs`` simulations of one MJCF model in a batched ``motrixsim.SceneData``."""

    name = "motrix"
    _dtype = _F32  # the engine computes in float32
    _xyzw = True  # engine base quaternion order
    _kept_handles = _SLICES  # set_state's handles on the id sets of each reset size

    def __init__(self, *, num_envs: int, model: Any = None, nthread: int | None = None,
                 recorder: Recorder | NoopRecorder | None = None) -> None:
        self.num_envs = check_num_envs(num_envs)
        path = _model_path(model)
        mj = load_model(path)
        info = describe_model(mj, self.name)
        init_threads(nthread)  # before the first load: the pool is sized once per process
        try:
            with _G_LOAD:
                self.model: Any = ms.load_model(str(path))
        except RuntimeError as e:  # a file MuJoCo takes and MotrixSim does not
            message = " ".join(str(e).split())
            raise ValueError(f"{path}: MotrixSim cannot load the model: {message}") from None
        _check_same_layout(self.model, mj, info)
        self.info = BackendInfo(
            name=info.name, joint_names=info.joint_names, body_names=info.body_names,
            actuator_names=info.actuator_names, joint_range=info.joint_range,
            ctrl_range=info.ctrl_range, actuator_joint=info.actuator_joint,
            physics_dt=float(self.model.options.timestep),  # the engine's float32 step
            model_path=None if model is None else str(path))
        self._init_rows(mj)
        self.nbody = int(mj.nbody)
        self._mj = mj
        self._override_base: dict[str, Any] | None = None
        self.recorder = recorder
        with _G_DATA:
            self.data: Any = ms.SceneData(self.model, batch=[self.num_envs])
        #: the actuator gains the engine is run with: MuJoCo's, for the same file
        self._kp, self._kd = self._match_mujoco(mj)
        # the engine column of each contract qpos column
        self._to_contract = np.arange(self.nq)
        self._to_contract[3:7] = _CONTRACT_FROM_ENGINE
        # reads qpos/qvel of chosen rows only (duplicates allowed)
        with _G_QUERY:
            self._state_query: Any = self.model.compile_query(
                {"qpos": ms_query.DofPosition(), "qvel": ms_query.DofVelocity()}
            ).allocate(self.data)
        self._row_qpos = self._state_query["qpos"]  # (N, nq) engine layout, zero-copy views
        self._row_qvel = self._state_query["qvel"]
        self.poses = PoseCache(self.num_envs, self.info.body_names, self._refresh_pose)
        # the world body (column 0) keeps the identity pose: it is never refreshed
        self._scratch_pose = Scratch((self.nbody - 1, 7), dtype=_F32)
        self._qpos_all = np.zeros((self.num_envs, self.nq))
        self._qvel_all = np.zeros((self.num_envs, self.nv))
        self._ctrl_all = np.zeros((self.num_envs, self.nu), _F32)
        #: row handles (``data[DisjointIndices(ids)]``) of recent id sets, by their bytes
        self._slices: dict[bytes, Any] = {}
        self._start_at_keyframe()

    def _match_mujoco(self, mj: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
        """Make this engine simulate the robot MuJoCo does, where MotrixSim allows it.

        Options: where MotrixSim's differ from the model's ``<option>`` or it has no
        setting for one that changes the physics, a warning lists them
        (:func:`~resettrace.sim.model_facts.motrix_option_differences`).

        Gains: MotrixSim derives kd from ``dampratio`` its own way; where its kp or kd
        differ from MuJoCo's compiled values, every env gets MuJoCo's through the engine's
        per-env overrides (said once). Force limits cannot be changed on a loaded
        MotrixSim model (joint-level ``actuatorfrcrange`` is ignored by its loader): where
        its limits differ from MuJoCo's, a warning names the actuators and both limits.
        """
        acts = list(self.model.actuators)
        kp_mj, kd_mj = actuator_gains(mj)
        kp = np.array([float(a.kp) for a in acts])
        kd = np.array([float(a.kd) for a in acts])
        label = model_label(mj)
        fixed = [i for i in range(len(acts))
                 if not (np.isclose(kp[i], kp_mj[i], rtol=1e-5)
                         and np.isclose(kd[i], kd_mj[i], rtol=1e-5))]
        if fixed:
            with _G_RAND:
                for i in fixed:
                    acts[i].set_kp_override(self.data, np.full(self.num_envs, kp_mj[i]))
                    acts[i].set_damping_override(self.data, np.full(self.num_envs, kd_mj[i]))
            warn_once(f"gains {label} {fixed}",
                      "resettrace: MotrixSim's kp/kd of %d actuator(s) of %s differ from "
                      "MuJoCo's (e.g. %s: kp %.4g, kd %.4g against %.4g, %.4g; kd from "
                      "dampratio is derived differently); MuJoCo's are applied",
                      len(fixed), label, acts[fixed[0]].name, kp[fixed[0]], kd[fixed[0]],
                      kp_mj[fixed[0]], kd_mj[fixed[0]])
        options = motrix_option_differences(mj, self.model.options)
        if options:
            warn_once(f"options {label} {options}",
                      "resettrace: MotrixSim does not simulate these <option> settings of %s "
                      "as MuJoCo does (MuJoCo vs MotrixSim): %s. The two backends simulate "
                      "different physics", label, "; ".join(options))
        limits = actuator_force_limits(mj)
        engine = np.array([list(a.force_range) if a.force_range is not None
                           else [-np.inf, np.inf] for a in acts], np.float64)
        differ = [i for i in range(len(acts))
                  if not np.allclose(engine[i], limits[i], rtol=1e-5, equal_nan=False)]
        if differ:
            i = differ[0]
            warn_once(f"force {label} {differ}",
                      "resettrace: %d actuator(s) of %s have other force limits on MotrixSim "
                      "than on MuJoCo, which cannot be changed after loading (MotrixSim "
                      "ignores joint-level actuatorfrcrange): e.g. %s: %s N·m on MotrixSim, "
                      "%s on MuJoCo. The two backends simulate different robots; put the "
                      "limits in each actuator's forcerange for parity", len(differ), label,
                      acts[i].name, engine[i].tolist(), limits[i].tolist())
        return kp_mj, kd_mj

    # -- contract (set_state: RowBackend's, with _index and _write_rows below) ---------------
    def step(self, ctrl: np.ndarray, nsteps: int = 1) -> None:
        if self.data is None:
            raise RuntimeError("the motrix backend is closed")
        ctrl = np.asarray(ctrl)
        if ctrl.shape != (self.num_envs, self.nu):
            raise ValueError(f"ctrl must have shape ({self.num_envs}, {self.nu}), "
                             f"got {ctrl.shape}")
        if not (np.issubdtype(ctrl.dtype, np.floating) or np.issubdtype(ctrl.dtype, np.integer)):
            raise ValueError(f"ctrl must be numeric, got dtype {ctrl.dtype}")
        n = int(nsteps)
        if n != nsteps or n < 0:
            raise ValueError(f"nsteps must be a non-negative integer, got {nsteps}")
        buf = self._ctrl_all
        buf[...] = ctrl  # float32, as the engine holds it
        if not np.isfinite(buf).all():  # a NaN target panics inside the step
            bad = np.argwhere(~np.isfinite(buf))[0]
            raise ValueError(f"ctrl has a non-finite (or float32-overflowing) value at row "
                             f"{bad[0]}, column {bad[1]}")
        with _G_CTRL:
            self.data.actuator_ctrls = buf
        if n:
            with _G_STEP:
                if n == 1:
                    self.model.step(self.data)
                else:
                    self.model.step_n(self.data, n)
            self._kin_stale[:] = False  # the step computed every row's kinematics
        self.poses.mark_stale()

    def _slice(self, ids: np.ndarray, key: bytes | None = None) -> Any:
        """The engine's handle on the sorted int32 rows ``ids``: ``data[DisjointIndices]``,
        built once for ids that repeat (:data:`_SLICES` id sets are kept, the oldest built
        goes first). ``key``: ``ids.tobytes()`` when the caller has it."""
        if key is None:
            key = ids.tobytes()
        sub = self._slices.get(key)
        if sub is None:
            if self.data is None:
                raise RuntimeError("the MotrixSim backend is closed")
            with _G_INDICES:  # a copy of the ids (they may be scratch); from a list: the
                # engine reads a list of ints about twice as fast as an int array (20 ids:
                # 3.6 against 7.7 us with the list made, 2048: 120 against 179 us)
                index = ms.DisjointIndices(ids.tolist())
            with _G_SLICE:
                sub = self.data[index]
            if len(self._slices) >= _SLICES:
                del self._slices[next(iter(self._slices))]  # the first kept
            self._slices[key] = sub
        return sub

    def _write_rows(self, rec: Recorder | NoopRecorder, outer: Scope | NoopScope,
                    ids: np.ndarray, rows: OutRows, rand: RandomizationRows | None,
                    held: KeptHandles, slot: int) -> None:
        q, _, v, _, ctrl = rows[:5]  # (indexing: a NamedTuple's fields are slower)
        if slot >= 0:  # ids written lately: their handle, found by the pass (no work here)
            sub = held.subs[slot]
        else:  # a handle another reader kept, or a new one
            outer.lap(C.SET_STATE_DATA_SLICE)
            sub = self._slice(ids)
            held.keep(ids, sub)
        # eager kinematics with no override to come between: in the reset call itself
        fused = not self.lazy_kinematics and rand is None
        call = _G_RESET  # one try for both calls (a with-guard each costs 2 Python calls)
        try:
            outer.lap(C.SET_STATE_DATA_RESET)
            # reset + DoF write (+ FK) in one call (see the module docstring)
            sub.reset(self.model, q, v, forward_kinematic=fused)
            if rand is not None:
                outer.lap(None)
                self._randomize(rec, sub, rand)  # overrides leave the DoF state alone
            call = _G_CTRL
            outer.lap(C.SET_STATE_ACTUATOR_CTRL)
            sub.actuator_ctrls = ctrl  # computed with the rows in qpos_convert
        except BaseException as e:
            call.__exit__(type(e), e, e.__traceback__)  # a panic: RuntimeError naming it
            raise
        if not fused:
            self._kinematics(outer, ids, sub)  # the pose cache: marked stale in qpos_convert

    def _overrides(self) -> dict[str, Any]:
        """The engine's per-env override handles and their model values (made on first use)."""
        if self._override_base is None:
            data, mj = self.data, self._mj
            contact, sized = robot_contact_geoms(mj)
            geoms = [self.model.get_geom(int(i)) for i in contact]
            links = list(self.model.links)
            acts = list(self.model.actuators)
            with _G_RAND:
                self._override_base = {
                    "geoms": [(g, np.array(g.get_friction_override(data)[0], np.float64))
                              for g in geoms if hasattr(g, "get_friction_override")],
                    # mesh geoms have no size override in MotrixSim (nor a scalable size)
                    "sized": [(g, np.array(g.get_size_override(data)[0], np.float64))
                              for g in (self.model.get_geom(int(i)) for i in sized)
                              if hasattr(g, "get_size_override")],
                    "links": [(lk, float(lk.get_mass_override(data)[0]),
                               np.array(lk.get_inertia_override(data)[0], np.float64))
                              for lk in links],
                    "actuators": [(a, float(self._kp[i]), float(self._kd[i]))
                                  for i, a in enumerate(acts)],
                }
        return self._override_base

    def _randomize(self, rec: Recorder | NoopRecorder, sub: Any, rand: RandomizationRows
                   ) -> None:
        """Per-env overrides of the reset rows; scales apply to the model's own values."""
        base = self._overrides()
        with rec.scope(C.SET_STATE_RESET_RAND), _G_RAND:
            friction = rand.get("friction")
            if friction is not None:
                for geom, f0 in base["geoms"]:
                    f = np.tile(f0, (len(friction), 1))
                    f[:, 0] = friction
                    geom.set_friction_override(sub, f)
            mass = rand.get("mass_scale")
            if mass is not None:
                for link, m0, inertia0 in base["links"]:
                    link.set_mass_override(sub, m0 * mass)
                    link.set_inertia_override(sub, inertia0[None, :] * mass[:, None])
            kp, kd = rand.get("kp_scale"), rand.get("kd_scale")
            for act, kp0, kd0 in base["actuators"]:
                if kp is not None:
                    act.set_kp_override(sub, kp0 * kp)
                if kd is not None:
                    act.set_damping_override(sub, kd0 * kd)
        size = rand.get("geom_size_scale")
        if size is not None:
            with rec.scope(C.SET_STATE_GEOM_OVERRIDES), _G_RAND:
                for geom, s0 in base["sized"]:
                    geom.set_size_override(sub, s0[None, :] * size[:, None])

    def _forward(self, ids: np.ndarray, index: Any) -> None:
        """``index``: the rows' slice handle (``data[DisjointIndices]``), or None."""
        if index is None:
            index = self._slice(ids)
        with _G_FK:
            self.model.forward_kinematic(index)

    def _refresh_pose(self, rows: np.ndarray) -> None:
        """Link poses of the sorted unique ``rows`` into the cache.

        ``get_link_poses`` on a handle of those rows reads them only; one gather turns
        its xyz + xyzw into the contract's xyz + wxyz."""
        (links,) = self._scratch_pose.rows(rows.size)
        sub = self._slice(rows)
        self._fresh_kinematics(rows, sub)  # one slice for the kinematics and the read
        with _G_POSES:
            self.model.get_link_poses(sub, out=links)
        self.poses.pose[rows, 1:] = links[..., _POSE_FROM_ENGINE]

    def _rows(self, env_ids: Any) -> np.ndarray:
        """Ids as in-range non-negative intp (numpy indexing rules; IndexError otherwise),
        so that nothing out of range reaches the engine."""
        rows = np.asarray(env_ids, np.intp)
        if rows.ndim != 1:
            raise ValueError(f"env_ids must be one-dimensional, got shape {rows.shape}")
        if rows.size and (rows.min() < -self.num_envs or rows.max() >= self.num_envs):
            raise IndexError(f"env_ids must be in [-{self.num_envs}, {self.num_envs}), got "
                             f"{rows.min() if rows.min() < 0 else rows.max()}")
        return np.where(rows < 0, rows + self.num_envs, rows)

    def get_qpos_rows(self, env_ids: Any = None) -> np.ndarray:
        """Contract layout (wxyz), float64. All rows: one reused buffer refreshed by every
        call (do not write it); else a new array of the rows."""
        if env_ids is None:
            with _G_READ:
                engine = self.data.dof_pos  # a fresh float32 copy of every row
            self._qpos_all[...] = engine[:, self._to_contract]
            return self._qpos_all
        rows = self._rows(env_ids)
        if not rows.size:
            return np.zeros((0, self.nq))
        with _G_QUERY:
            self._state_query.execute(self.data, env_ids=rows.astype(np.int64))
        return self._row_qpos[rows][:, self._to_contract].astype(np.float64)

    def get_qvel_rows(self, env_ids: Any = None) -> np.ndarray:
        if env_ids is None:
            with _G_READ:
                self._qvel_all[...] = self.data.dof_vel
            return self._qvel_all
        rows = self._rows(env_ids)
        if not rows.size:
            return np.zeros((0, self.nv))
        with _G_QUERY:
            self._state_query.execute(self.data, env_ids=rows.astype(np.int64))
        return self._row_qvel[rows].astype(np.float64)

    def get_body_pose_rows(self, env_ids: Any, body_names: tuple[str, ...] | list[str]
                           ) -> np.ndarray:
        rows = np.arange(self.num_envs) if env_ids is None else self._rows(env_ids)
        return self.poses.rows(rows, body_names)

    def close(self) -> None:
        self.data = None
        self._slices.clear()  # each handle holds the engine's data
        self._passes.clear()  # (their kept handles too); a reset after this refuses
        self._state_query = None

    def _is_closed(self) -> bool:
        return self.data is None


if TYPE_CHECKING:  # a type checker proves this backend satisfies the contract
    from resettrace.sim.contract import SimBackend

    _check: type[SimBackend] = MotrixBackend
