"""One numba pass that turns the caller's reset rows into engine rows.

``prepare_rows`` does in one call what would otherwise be a dozen small numpy calls
on every reset (each costs microseconds, several times that right after a physics step
or forward kinematics has evicted the caches): check that the env ids are sorted, unique
and in range and copy them into the engine's int32 index, copy qpos/qvel rows into
reused scratch (in id order), reject non-finite values (also values that overflow a
float32 engine), normalise the base quaternion (rejecting one it cannot: zero, or so large
that its squared norm overflows and it would normalise to zeros), optionally
reorder it wxyz -> xyzw, and compute the actuator targets that hold the new joint pose,
clipped to the control range. qpos, qvel and the targets go to columns ``oq``, ``ov``
and on from ``oc`` of their output rows, which may be one array (the MuJoCo backend's whole
state rows).

Once everything checked out it marks the rows' pose cache stale (``fresh[id] = False``)
and their kinematics stale with ``lazy`` (``stale[id] = lazy``: eager computes them
next); given an engine state array ``state`` (``num_envs`` rows; :data:`NO_STATE` for
none) it copies the whole output rows ``q_out`` into ``state[ids]`` and zeroes
``warning[ids]`` (when ``warning`` has rows): the MuJoCo backend's data reset, in the same
call. Each numpy call this saves would run on the caches the engine's last call evicted.

``kept`` holds id sets whose engine handles the caller keeps, one per row (sorted int32,
-1 where none; :data:`NO_KEPT` for none). It returns ``(code, row, col)``: ``(0, slot,
0)`` when the ids and rows are good, ``slot`` the row of ``kept`` that holds exactly these
ids (-1: none; a search of a few compares per kept set, where a bytes key and a dict
lookup in Python cost microseconds on the small-k path), else the first problem
(:data:`BAD_ID` at position ``row`` of the ids, :data:`UNSORTED` ids at ``row``: the
caller sorts them and calls again with the order, :data:`BAD_QPOS`, :data:`BAD_QVEL`,
:data:`BAD_QUAT` at the caller's row ``row``); nothing has reached an engine, and no
mark is set, then.

:func:`bind_pass` binds it, once per k, to everything but the caller's ids and rows:
``set_state``'s usual call unboxes 3 arrays and an int64 context of values and addresses
instead of 22 arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prepare_rows", "bind_pass", "BAD_SHAPE", "NO_ORDER", "NO_STATE", "NO_WARNING",
           "NO_KEPT", "OK", "BAD_QPOS", "BAD_QVEL", "BAD_QUAT", "BAD_ID", "UNSORTED"]

OK, BAD_QPOS, BAD_QVEL, BAD_QUAT, BAD_ID, UNSORTED = 0, 1, 2, 3, 4, 5
#: ``order`` argument for rows already in id order
NO_ORDER = np.zeros(0, np.int64)
#: ``state`` and ``warning`` arguments when no engine state is written in the pass
NO_STATE = np.zeros((0, 0), np.float64)
NO_WARNING = np.zeros((0, 0, 0), np.int32)
#: ``kept`` argument when no id sets are kept
NO_KEPT = np.zeros((0, 0), np.int32)
_QUAT_EPS = 1e-9


@njit(cache=True)
def prepare_rows(ids_in, num_envs, ids_out, q_in, v_in, order, q_out, oq, v_out, ov,
                 ctrl_out, oc, act_qadr, ctrl_lo, ctrl_hi, xyzw, fresh, stale,
                 lazy, state, warning, kept):  # pragma: no cover
    k, nq = q_in.shape
    prev = np.int64(-1)
    for i in range(k):
        x = ids_in[i]
        if x < 0 or x >= num_envs:
            return BAD_ID, i, 0
        xi = np.int64(x)
        if xi <= prev:
            return UNSORTED, i, 0
        prev = xi
        ids_out[i] = xi
    nv = v_in.shape[1]
    nu = ctrl_lo.shape[0]
    for i in range(k):
        src = order[i] if order.shape[0] else i
        for j in range(nq):
            q_out[i, oq + j] = q_in[src, j]
            if not math.isfinite(q_out[i, oq + j]) or not math.isfinite(q_in[src, j]):
                return BAD_QPOS, src, j
        for j in range(nv):
            v_out[i, ov + j] = v_in[src, j]
            if not math.isfinite(v_out[i, ov + j]) or not math.isfinite(v_in[src, j]):
                return BAD_QVEL, src, j
        w = float(q_in[src, 3])
        x = float(q_in[src, 4])
        y = float(q_in[src, 5])
        z = float(q_in[src, 6])
        norm = math.sqrt(w * w + x * x + y * y + z * z)
        if not _QUAT_EPS <= norm < math.inf:  # zero, or finite parts whose squares overflow
            return BAD_QUAT, src, 3
        if xyzw:
            q_out[i, oq + 3] = x / norm
            q_out[i, oq + 4] = y / norm
            q_out[i, oq + 5] = z / norm
            q_out[i, oq + 6] = w / norm
        else:
            q_out[i, oq + 3] = w / norm
            q_out[i, oq + 4] = x / norm
            q_out[i, oq + 5] = y / norm
            q_out[i, oq + 6] = z / norm
        for a in range(nu):
            c = q_out[i, oq + act_qadr[a]]
            if c < ctrl_lo[a]:
                c = ctrl_lo[a]
            elif c > ctrl_hi[a]:
                c = ctrl_hi[a]
            ctrl_out[i, oc + a] = c
    scatter, clear = state.shape[0] > 0, warning.shape[0] > 0
    for i in range(k):  # every row is good: mark them (and write the engine's rows)
        r = ids_out[i]
        fresh[r] = False
        stale[r] = lazy  # eager: the kinematics come next, in set_state
        if scatter:
            for j in range(state.shape[1]):
                state[r, j] = q_out[i, j]
            if clear:
                warning[r] = 0
    if kept.shape[1] != k:  # kept id sets of another size: none can match
        return OK, -1, 0
    for s in range(kept.shape[0]):  # the ids among the kept id sets: their slot
        same = True
        for i in range(k):
            if kept[s, i] != ids_out[i]:
                same = False
                break
        if same:
            return OK, s, 0
    return OK, -1, 0


@intrinsic
def _at(typingctx, address):  # pragma: no cover
    """The int64 ``address`` as a pointer, for ``numba.carray`` to view the memory there."""
    sig = types.voidptr(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


# the slots of a bound pass's context (:func:`bind_pass`): int64 values and addresses
(_K, _NUM_ENVS, _XYZW, _NQ, _NV, _NU, _OQ, _OV, _OC, _Q, _Q_ROWS, _Q_COLS, _V, _V_ROWS,
 _V_COLS, _C, _C_ROWS, _C_COLS, _IDS, _ACT, _LO, _HI, _FRESH, _STALE, _KEPT, _KEPT_ROWS,
 _STATE, _STATE_COLS, _WARNING, _WARNING_1, _WARNING_2, _CTX_SIZE) = range(32)
#: what a bound pass returns when the caller's arrays are not of the k rows it was bound to
BAD_SHAPE = 6


@njit(cache=True)
def _bound_checks(ids_in, q_in, v_in, ctx):  # pragma: no cover
    k = ctx[_K]
    return (ids_in.shape[0] == k and q_in.shape[0] == k and v_in.shape[0] == k
            and q_in.shape[1] == ctx[_NQ] and v_in.shape[1] == ctx[_NV])


@njit(cache=True)
def prepare_bound32(ids_in, q_in, v_in, lazy, ctx):  # pragma: no cover
    """``prepare_rows`` into float32 output rows ``q``, ``v`` and ``ctrl`` of their own,
    with no engine state rows, every array but the caller's three viewed at the addresses
    in ``ctx`` (:func:`bind_pass`)."""
    if not _bound_checks(ids_in, q_in, v_in, ctx):
        return BAD_SHAPE, 0, 0
    n, k, nu = ctx[_NUM_ENVS], ctx[_K], ctx[_NU]
    return prepare_rows(
        ids_in, n, carray(_at(ctx[_IDS]), k, np.int32), q_in, v_in, NO_ORDER,
        carray(_at(ctx[_Q]), (ctx[_Q_ROWS], ctx[_Q_COLS]), np.float32), ctx[_OQ],
        carray(_at(ctx[_V]), (ctx[_V_ROWS], ctx[_V_COLS]), np.float32), ctx[_OV],
        carray(_at(ctx[_C]), (ctx[_C_ROWS], ctx[_C_COLS]), np.float32), ctx[_OC],
        carray(_at(ctx[_ACT]), nu, np.int64), carray(_at(ctx[_LO]), nu, np.float64),
        carray(_at(ctx[_HI]), nu, np.float64), ctx[_XYZW] != 0,
        carray(_at(ctx[_FRESH]), n, np.bool_), carray(_at(ctx[_STALE]), n, np.bool_), lazy,
        np.empty((0, 0), np.float64), np.empty((0, 0, 0), np.int32),  # (no state rows)
        carray(_at(ctx[_KEPT]), (ctx[_KEPT_ROWS], k), np.int32))


@njit(cache=True)
def prepare_bound64(ids_in, q_in, v_in, lazy, ctx):  # pragma: no cover
    """``prepare_rows`` into float64 output rows that hold qpos, qvel and ctrl as columns,
    scattered into the engine's float64 state rows with their int32 warning counters
    zeroed, every array but the caller's three viewed at the addresses in ``ctx``."""
    if not _bound_checks(ids_in, q_in, v_in, ctx):
        return BAD_SHAPE, 0, 0
    n, k, nu = ctx[_NUM_ENVS], ctx[_K], ctx[_NU]
    rows = carray(_at(ctx[_Q]), (ctx[_Q_ROWS], ctx[_Q_COLS]), np.float64)
    return prepare_rows(
        ids_in, n, carray(_at(ctx[_IDS]), k, np.int32), q_in, v_in, NO_ORDER, rows,
        ctx[_OQ], rows, ctx[_OV], rows, ctx[_OC], carray(_at(ctx[_ACT]), nu, np.int64),
        carray(_at(ctx[_LO]), nu, np.float64), carray(_at(ctx[_HI]), nu, np.float64),
        ctx[_XYZW] != 0, carray(_at(ctx[_FRESH]), n, np.bool_),
        carray(_at(ctx[_STALE]), n, np.bool_), lazy,
        carray(_at(ctx[_STATE]), (n, ctx[_STATE_COLS]), np.float64),
        carray(_at(ctx[_WARNING]), (n, ctx[_WARNING_1], ctx[_WARNING_2]), np.int32),
        carray(_at(ctx[_KEPT]), (ctx[_KEPT_ROWS], k), np.int32))


#: the bound passes' entry points for int64 ids and float64 rows of any layout
_BOUND: dict[str, Callable[..., tuple[int, int, int]]] = {}


def _c(a: np.ndarray, dtype: object, ndim: int) -> bool:
    return (a.__class__ is np.ndarray and a.dtype == dtype and a.ndim == ndim
            and a.flags.c_contiguous and a.flags.writeable and a.flags.aligned)


def bind_pass(k: int, num_envs: int, ids_out: np.ndarray, q: np.ndarray, oq: int,
              v: np.ndarray, ov: int, ctrl: np.ndarray, oc: int, act_qadr: np.ndarray,
              ctrl_lo: np.ndarray, ctrl_hi: np.ndarray, xyzw: bool, fresh: np.ndarray,
              stale: np.ndarray, state: np.ndarray, warning: np.ndarray, kept: np.ndarray,
              nq: int, nv: int
              ) -> tuple[Callable[..., tuple[int, int, int]], np.ndarray,
                         tuple[np.ndarray, ...]] | None:
    """``prepare_rows`` for k rows with every argument but the caller's bound once: ``(pass,
    ctx, pinned)``, called as ``pass(ids_in, q_in, v_in, lazy, ctx)`` with int64 ids and
    float64 rows of any layout, alignment and writability (read through their strides);
    None when the arrays are not of a layout it binds (then call ``prepare_rows``).

    ``ctx`` holds the values and the addresses of the bound arrays, which the pass views
    in place (``numba.carray``): a call unboxes 3 arrays, not 16 (each ~0.2 us right
    after engine work, where the call costs ~3 us and its work ~3 us), and skips numba's
    type dispatch of all 22 arguments (3-7 us). The caller must keep ``pinned`` (the bound
    arrays) as long as it uses ``ctx``, and pass k ids and
    rows of ``nq`` and ``nv`` columns (else the pass returns :data:`BAD_SHAPE`). Binds
    float32 output rows of their own with no state rows (MotrixSim's scratch), or one
    float64 array of output rows with float64 state rows and int32 warning counters (the
    MuJoCo backend's), all C-contiguous; the arrays are checked here against what the
    pass indexes.
    """
    nu = ctrl_lo.shape[0]
    common = (_c(ids_out, np.int32, 1) and ids_out.shape[0] == k and _c(act_qadr, np.int64, 1)
              and _c(ctrl_lo, np.float64, 1) and _c(ctrl_hi, np.float64, 1)
              and act_qadr.shape[0] == nu == ctrl_hi.shape[0] and _c(fresh, np.bool_, 1)
              and _c(stale, np.bool_, 1) and min(fresh.shape[0], stale.shape[0]) >= num_envs
              and _c(kept, np.int32, 2) and kept.shape[1] == k
              and min(q.shape[0], v.shape[0], ctrl.shape[0]) >= k
              and oq + nq <= q.shape[1] and ov + nv <= v.shape[1]
              and oc + nu <= ctrl.shape[1] and bool((act_qadr >= 0).all())
              and bool((act_qadr < nq).all()))
    if not common:
        return None
    if (state.shape[0] == 0 and warning.shape[0] == 0
            and all(_c(a, np.float32, 2) for a in (q, v, ctrl))):
        name = "32"
    elif (q is v is ctrl and _c(q, np.float64, 2) and _c(state, np.float64, 2)
          and state.shape[0] >= num_envs and state.shape[1] == q.shape[1]
          and _c(warning, np.int32, 3) and warning.shape[0] >= num_envs):
        name = "64"
    else:
        return None
    ctx = np.zeros(_CTX_SIZE, np.int64)
    ctx[[_K, _NUM_ENVS, _XYZW, _NQ, _NV, _NU, _OQ, _OV, _OC]] = (
        k, num_envs, int(bool(xyzw)), nq, nv, nu, oq, ov, oc)
    for at, a in ((_Q, q), (_V, v), (_C, ctrl)):
        ctx[at:at + 3] = (a.ctypes.data, a.shape[0], a.shape[1])
    for at, a in ((_IDS, ids_out), (_ACT, act_qadr), (_LO, ctrl_lo), (_HI, ctrl_hi),
                  (_FRESH, fresh), (_STALE, stale), (_KEPT, kept)):
        ctx[at] = a.ctypes.data
    ctx[_KEPT_ROWS] = kept.shape[0]
    if name == "64":
        ctx[[_STATE, _STATE_COLS, _WARNING, _WARNING_1, _WARNING_2]] = (
            state.ctypes.data, state.shape[1], warning.ctypes.data, warning.shape[1],
            warning.shape[2])
    entry = _BOUND.get(name)
    if entry is None:
        from numba import typeof

        any_layout = (types.Array(types.int64, 1, "A", readonly=True, aligned=False),
                      types.Array(types.float64, 2, "A", readonly=True, aligned=False),
                      types.Array(types.float64, 2, "A", readonly=True, aligned=False))
        fn = prepare_bound32 if name == "32" else prepare_bound64
        entry = _BOUND[name] = fn.compile((*any_layout, types.boolean, typeof(ctx)))
    return entry, ctx, (ids_out, q, v, ctrl, act_qadr, ctrl_lo, ctrl_hi, fresh, stale, state,
                        warning, kept)
