"""What every bundled backend's reset path shares: one ``set_state`` skeleton.

:class:`RowBackend` holds the parts both engines repeat: the env-count check, the
keyframe pose, the actuator columns and control limits, the scratch rows (grown, never
shrunk), the start of every env at the keyframe, and ``set_state`` itself up to the
engine writes:

=============  ========================================================================
mask           0.0: no bool mask is built; the ids are checked in qpos_convert
qpos_convert   ``id_array`` (the ids are a 1-D integer array), the randomization rows
               checked, then one compiled pass (its k-row scratch views made and checked
               once per k, :meth:`RowBackend._pass_rows`; int64 ids with float64 rows,
               in any layout, go to the pass bound to that scratch,
               :func:`~resettrace.sim.backends._kernels.bind_pass`, other ndarrays of the
               right shapes through numba's dispatcher, anything else through
               ``convert_rows``): the ids checked
               sorted, unique and in range into the int32 index (unsorted ids: sorted
               first, then a second pass), the rows into the scratch rows
               (:meth:`RowBackend._reset_rows`; on MuJoCo written into the engine's
               state rows by the same pass), the rows marked: pose cache stale, and
               kinematics stale when lazy, and the ids found among the id sets of k
               rows whose engine handles are kept (:class:`KeptHandles`; MotrixSim);
               then the randomization rows put in id order
(engine)       :meth:`RowBackend._write_rows`, each engine's own phases
=============  ========================================================================

Every check above runs in as few Python calls as it can: right after a physics step or
forward kinematics has evicted the caches, each numpy call on a handful of rows costs
several microseconds, and a 20-row reset makes a dozen of them.

A backend subclasses it, sets ``name``, ``_dtype`` (the engine's float type) and
``_xyzw`` (the engine's base quaternion order), and calls :meth:`RowBackend._init_rows`
once its model facts (``self.info``) are known and :meth:`RowBackend._start_at_keyframe`
once the engine is ready.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import mujoco
import numpy as np

from resettrace import catalog as C
from resettrace.sim.backends._kernels import NO_ORDER, OK, bind_pass, prepare_rows
from resettrace.sim.backends._pose import PoseCache
from resettrace.sim.backends._validate import (
    PASS_DTYPES,
    OutRows,
    check_pass_target,
    convert_rows,
    finish_pass,
    id_array,
)
from resettrace.sim.contract import MAX_ENVS, BackendInfo, SetStateResult
from resettrace.sim.model_facts import keyframe_qpos
from resettrace.sim.randomization import RandomizationRows, as_rows, reorder_rows
from resettrace.tracing.api import bind, current_recorder
from resettrace.tracing.recorder import NOOP_RECORDER, NoopRecorder, NoopScope, Recorder, Scope

__all__ = ["RowBackend", "Scratch", "check_num_envs"]


def check_num_envs(num_envs: Any) -> int:
    """``num_envs`` as an int in ``[1, MAX_ENVS]`` (engines index rows with int32)."""
    if not 1 <= int(num_envs) <= MAX_ENVS:
        raise ValueError(f"num_envs must be between 1 and {MAX_ENVS}, got {num_envs}")
    return int(num_envs)


class Scratch:
    """Reused rows of several widths: ``rows(k)`` gives k rows of each, grown (doubling)
    when k exceeds them, never shrunk, so that a reset allocates nothing. ``fill``: the
    value every new row starts with (a row of the first width; else uninitialised)."""

    __slots__ = ("_shapes", "_dtype", "_size", "_bufs", "_fill")

    def __init__(self, *shapes: tuple[int, ...], dtype: Any = np.float64,
                 fill: np.ndarray | None = None) -> None:
        self._shapes = shapes
        self._dtype = dtype
        self._fill = fill
        self._size = -1
        self._bufs: tuple[np.ndarray, ...] = ()
        self._grow(0)

    def _grow(self, k: int) -> None:
        self._size = size = max(k, 2 * self._size, 1)
        self._bufs = tuple(np.empty((size, *s), self._dtype) for s in self._shapes)
        if self._fill is not None:
            self._bufs[0][:] = self._fill

    def rows(self, k: int) -> tuple[np.ndarray, ...]:
        if k > self._size:
            self._grow(k)
        return tuple([b[:k] for b in self._bufs])


#: what :meth:`RowBackend._reset_rows` gives the compiled pass: output rows, the engine
#: state rows it scatters them to (or None), their warning counters (or None)
PassTarget = tuple[OutRows, np.ndarray | None, np.ndarray | None]
class KeptHandles:
    """An engine's handles on the last ``size`` id sets of k rows that ``set_state`` wrote
    (the first kept goes first when one more comes): ``ids`` holds each set as sorted
    int32 (-1 where none), for the compiled pass to find the ids among them; ``subs[i]``
    is the handle on ``ids[i]``."""

    __slots__ = ("ids", "subs", "_next")

    def __init__(self, k: int, size: int) -> None:
        self.ids = np.full((size, k), -1, np.int32)
        self.subs: list[Any] = [None] * size
        self._next = 0

    def keep(self, ids: np.ndarray, sub: Any) -> None:
        """Keep ``sub``, the handle on the sorted ``ids`` (k of them); nothing when size 0."""
        if self.subs:
            i = self._next
            self.ids[i] = ids
            self.subs[i] = sub
            self._next = (i + 1) % len(self.subs)


class PassRows(NamedTuple):
    """What :meth:`RowBackend._pass_rows` keeps for k rows (a tuple: the hot path unpacks
    it by position, at a tuple's cost)."""

    #: the int32 ids, as the engine indexes rows
    ids_out: np.ndarray
    #: the output rows (:data:`OutRows`)
    out: OutRows
    #: the state rows and warning counters as the pass takes them (empty: none)
    state: np.ndarray
    warning: np.ndarray
    #: the pass bound to them for int64 ids and float64 rows of any layout, its context
    #: and the arrays bound to it (:func:`bind_pass`; None, None, () when not bound)
    bound: Any
    ctx: Any
    #: the shapes qpos and qvel must have
    q_shape: tuple[int, int]
    v_shape: tuple[int, int]
    pinned: tuple[np.ndarray, ...]
    #: the engine's handles on the id sets of k rows written last
    held: KeptHandles


class PassConstants(NamedTuple):
    """The arrays every pass of a backend reads besides its k-row scratch, in the order
    :func:`prepare_rows`, :func:`finish_pass` and :func:`bind_pass` take them (pass them
    with ``*``). Bound passes hold their addresses: none of them is ever rebound while
    the backend lives, only written in place."""

    act_qadr: np.ndarray
    ctrl_lo: np.ndarray
    ctrl_hi: np.ndarray
    xyzw: bool
    fresh: np.ndarray
    stale: np.ndarray


_NDARRAY = np.ndarray
#: the caller types the bound pass takes (np.flatnonzero's ids, float64
#: rows); others go through the dispatcher
_I64, _F64 = np.dtype(np.int64), np.dtype(np.float64)
#: reset sizes whose pass scratch is kept (all dropped when one more comes)
_PASSES = 64


class RowBackend:
    """The shared reset path of the bundled backends (see the module docstring)."""

    name: str
    num_envs: int
    nq: int
    nv: int
    nu: int
    info: BackendInfo
    #: the rows' body poses, read back lazily (set by the subclass once, before its first
    #: reset: the compiled pass is bound to its freshness marks)
    poses: PoseCache
    #: where set_state is recorded when no recorder is bound (``None``: the default
    #: session's); a bound recorder (``resettrace.bind``) wins, so that set_state nests
    #: in the caller's trace
    recorder: Recorder | NoopRecorder | None
    #: the engine's float type, and whether its base quaternion is xyzw (contract: wxyz)
    _dtype: Any = np.float64
    _xyzw = False
    #: ``set_state`` leaves the reset rows' kinematics stale instead of running forward
    #: kinematics: they are computed when poses are read (``get_body_pose_rows``, timed
    #: where it is called), and not at all when the next physics step, which recomputes
    #: them from qpos, comes first. ``False``: forward kinematics inside ``set_state``.
    lazy_kinematics = True
    #: handles on id sets of each reset size the engine keeps (:class:`KeptHandles`; 0: the
    #: engine indexes rows with no handle)
    _kept_handles = 0

    def _init_rows(self, m: mujoco.MjModel) -> None:
        """Keyframe, actuator columns, control limits and scratch rows of model ``m``."""
        self.nq, self.nv, self.nu = int(m.nq), int(m.nv), int(m.nu)
        self._keyframe = keyframe_qpos(m)
        self._act_qadr = 7 + self.info.actuator_joint
        self._ctrl_lo = self.info.ctrl_range[:, 0].copy()
        self._ctrl_hi = self.info.ctrl_range[:, 1].copy()
        self._scratch = Scratch((self.nq,), (self.nv,), (self.nu,), dtype=self._dtype)
        self._ids = Scratch((), dtype=np.int32)  # the sorted ids, as engines index rows
        #: the pass's k-row scratch and bound pass, by k (:meth:`_pass_rows`)
        self._passes: dict[int, PassRows] = {}
        #: rows whose kinematics have not been computed since their set_state
        self._kin_stale = np.zeros(self.num_envs, dtype=bool)
        #: what every pass reads besides its scratch (made with the first pass)
        self._consts: PassConstants | None = None

    def _start_at_keyframe(self) -> None:
        """Every env at the keyframe, its actuators holding it (untraced)."""
        q = np.broadcast_to(self._keyframe, (self.num_envs, self.nq))
        with bind(NOOP_RECORDER):
            self.set_state(np.arange(self.num_envs), q, np.zeros((self.num_envs, self.nv)))

    def _kinematics(self, outer: Scope | NoopScope, ids: np.ndarray, index: Any) -> None:
        """Forward kinematics of the reset rows when eager, as the next lap of set_state's
        scope ``outer``; lazy, the compiled pass has marked them stale and nothing runs
        here (the key reads 0.0)."""
        if not self.lazy_kinematics:
            outer.lap(C.SET_STATE_FORWARD_KINEMATIC)
            self._forward(ids, index)

    def _fresh_kinematics(self, rows: np.ndarray, index: Any = None) -> None:
        """Before poses of the sorted unique ``rows`` are read: compute the kinematics of
        those still stale since their set_state (the cost lands in the reader's phase).
        ``index``: the reader's handle on ``rows``, used when they are all stale."""
        stale = rows[self._kin_stale[rows]]
        if stale.size:
            self._forward(stale, index if stale.size == rows.size else None)
            self._kin_stale[stale] = False

    def _forward(self, ids: np.ndarray, index: Any) -> None:
        """The engine's forward kinematics of the sorted unique rows ``ids``; ``index``:
        the engine's handle on exactly those rows as :meth:`_forward` takes it (MotrixSim:
        their data slice), or None to build one."""
        raise NotImplementedError

    @property
    def keyframe_qpos(self) -> np.ndarray:
        return self._keyframe.copy()

    def set_state(self, env_ids: Any, qpos: np.ndarray, qvel: np.ndarray,
                  randomization: Any = None) -> SetStateResult | None:
        if randomization is not None:
            randomization = as_rows(randomization)
        rec = current_recorder(self.recorder)
        # a 1-D integer id array (the usual np.flatnonzero(done)) takes no Python call here
        plain = (env_ids.__class__ is _NDARRAY and env_ids.ndim == 1
                 and (env_ids.dtype is _I64 or (env_ids.dtype.kind in "iu"
                                                and env_ids.dtype in PASS_DTYPES)))
        # no mask phase: the ids are checked and indexed in the compiled pass; the phases
        # are laps of the outer scope (one call each, see Scope.lap), qpos_convert its first
        with rec.scope(C.SET_STATE, env_ids.shape[0] if plain else int(np.size(env_ids)),
                       C.SET_STATE_QPOS_CONVERT) as outer:
            ids_in = env_ids if plain else id_array(env_ids)
            k = ids_in.shape[0]
            if randomization is not None:
                randomization.validate(k)  # before the pass: it may write the engine
                if randomization.empty:
                    randomization = None
            rows = self._passes.get(k)
            if rows is None:
                rows = self._pass_rows(k)
            ids_out, out, state, warning, bound, ctx, qshape, vshape, _, held = rows
            code = None  # float or integer ndarrays of the right shapes go straight to
            # the pass (inline: on the small-k path each Python call costs microseconds)
            if (k and qpos.__class__ is _NDARRAY and qvel.__class__ is _NDARRAY
                    and qpos.shape == qshape and qvel.shape == vshape):
                if (ids_in.dtype is _I64 and qpos.dtype is _F64 and qvel.dtype is _F64
                        and bound is not None):
                    # the usual dtypes, in any layout: the pass with the rest bound (no
                    # type dispatch, 3 arrays unboxed)
                    code, slot, col = bound(ids_in, qpos, qvel, self.lazy_kinematics, ctx)
                elif qpos.dtype in PASS_DTYPES and qvel.dtype in PASS_DTYPES:
                    # another numba type: the dispatcher
                    q, oq, v, ov, c, oc = out[:6]
                    code, slot, col = prepare_rows(
                        ids_in, self.num_envs, ids_out, qpos, qvel, NO_ORDER, q, oq, v, ov,
                        c, oc, *cast(PassConstants, self._consts),
                        bool(self.lazy_kinematics), state, warning, held.ids)
            if code is not None:
                if code == OK:  # slot: where the engine's handle on these ids is kept
                    ids, order = ids_out, None
                else:
                    ids, order = self._finish(code, slot, col, ids_in, qpos, qvel, rows)
                    slot = -1
            else:  # anything else: the full checks
                slot = -1
                ids, order = convert_rows(
                    ids_in, self.num_envs, ids_out, qpos, qvel, out, self._act_qadr,
                    self._ctrl_lo, self._ctrl_hi, xyzw=self._xyzw, fresh=self.poses.fresh,
                    stale=self._kin_stale, lazy=bool(self.lazy_kinematics), state=state,
                    warning=warning)
            if randomization is not None and order is not None:
                randomization = reorder_rows(randomization, order)
            if k:
                try:
                    self._write_rows(rec, outer, ids, out, randomization, held, slot)
                except BaseException:  # the engine failed: recompute these rows' kinematics
                    self._kin_stale[ids] = True
                    raise
        return {"timing": t} if (t := outer.timing()) is not None else None

    def _finish(self, code: int, row: int, col: int, ids_in: np.ndarray, qpos: np.ndarray,
                qvel: np.ndarray, rows: PassRows) -> tuple[np.ndarray, np.ndarray | None]:
        """After a first pass that did not return OK (unsorted ids, or a bad id or row):
        :func:`finish_pass` on this backend's scratch."""
        return finish_pass(code, row, col, ids_in, self.num_envs, rows.ids_out, qpos, qvel,
                           rows.out, *cast(PassConstants, self._consts),
                           bool(self.lazy_kinematics), rows.state,
                           rows.warning)

    def _pass_rows(self, k: int) -> PassRows:
        """The k-row scratch of the pass (:meth:`_reset_rows`' and the int32 ids), checked
        against what the pass indexes unchecked, with the pass bound to it for int64 ids
        and float64 rows of any layout and the engine's handles on id sets of k rows, kept
        for the next reset of k rows. A closed backend (its kept passes cleared by
        ``close``) refuses here, before any write."""
        if self._is_closed():
            raise RuntimeError(f"the {self.name} backend is closed")
        out, state, warning = self._reset_rows(k)
        state, warning = check_pass_target(k, self.num_envs, out, self._ctrl_lo,
                                           self.poses.fresh, self._kin_stale, state, warning)
        if self._consts is None:  # the pose cache is the subclass's: set by now
            self._consts = PassConstants(self._act_qadr, self._ctrl_lo, self._ctrl_hi,
                                         self._xyzw, self.poses.fresh, self._kin_stale)
        ids_out = self._ids.rows(k)[0]
        q, oq, v, ov, c, oc = out[:6]
        held = KeptHandles(k, self._kept_handles)
        bound = bind_pass(k, self.num_envs, ids_out, q, oq, v, ov, c, oc, *self._consts,
                          state, warning, held.ids, self.nq, self.nv)
        # pinned: the bound arrays, kept alive with their context (whatever is reassigned)
        call, ctx, pinned = (None, None, ()) if bound is None else bound
        rows = PassRows(ids_out, out, state, warning, call, ctx, (k, self.nq), (k, self.nv),
                        pinned, held)
        if len(self._passes) >= _PASSES:
            self._passes.clear()
        self._passes[k] = rows
        return rows

    # -- each engine's own -----------------------------------------------------------------
    def _is_closed(self) -> bool:
        """Whether ``close`` has let the engine go (``close`` also clears ``_passes``)."""
        return False

    def _reset_rows(self, k: int) -> PassTarget:
        """Where the compiled pass writes k rows: the output rows, the engine's state rows
        it scatters them to itself (``state[ids] = rows``, or None) and their warning
        counters (or None). Here: k scratch rows of qpos, qvel and ctrl, nothing
        scattered."""
        q, v, ctrl = self._scratch.rows(k)
        return OutRows(q, 0, v, 0, ctrl, 0, self.nq, self.nv), None, None

    def _write_rows(self, rec: Recorder | NoopRecorder, outer: Scope | NoopScope,
                    ids: np.ndarray, rows: OutRows, rand: RandomizationRows | None,
                    held: KeptHandles, slot: int) -> None:
        """Write the k validated rows (``ids``: sorted int32 scratch, valid until the next
        ``set_state``; ``rows``: what :meth:`_reset_rows` gave, filled) to the engine, each
        step in its phase: a lap of set_state's scope ``outer`` (the first ends
        qpos_convert's), or a ``rec.scope`` once ``outer.lap(None)`` has ended the running
        lap. ``held``: the engine's handles on id sets of k rows, ``slot`` the one that
        holds ``ids`` (-1: none), found by the compiled pass."""
        raise NotImplementedError
