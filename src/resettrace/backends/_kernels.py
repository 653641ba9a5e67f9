"""One numba pass that turns the caller's reset rows into engine rows.

``prepare_rows`` does in one call what would otherwise be a dozen small numpy calls
on every reset (each costs microseconds, several times that right after a physics step
or forward kinematics has evicted the caches): check that the env ids are sorted, unique
and in range and copy them into the engine's int32 index, copy qpos/qvel rows into
reused scratch (in id order), reject non-finite values (also values that overflow a
float32 engine), normalise the base quaternion (rejecting a zero one), optionally
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
:data:`ZERO_QUAT` at the caller's row ``row``); nothing has reached an engine, and no
mark is set, then.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import njit

__all__ = ["prepare_rows", "pass_entry", "NO_ORDER", "NO_STATE", "NO_WARNING", "NO_KEPT", "OK",
           "BAD_QPOS", "BAD_QVEL", "ZERO_QUAT", "BAD_ID", "UNSORTED"]

OK, BAD_QPOS, BAD_QVEL, ZERO_QUAT, BAD_ID, UNSORTED = 0, 1, 2, 3, 4, 5
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
        if norm < _QUAT_EPS:
            return ZERO_QUAT, src, 3
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


#: compiled entry points of ``prepare_rows``, by the description of their arguments
_ENTRIES: dict[tuple[tuple[object, ...], tuple[int, ...]], Callable[..., tuple[int, int, int]]] = {}


def _describe(arg: object) -> object:
    """What numba types ``arg`` by: an ndarray's dtype, dimensions, layout flags,
    alignment and writability; another value's class."""
    if isinstance(arg, np.ndarray) and arg.__class__ is np.ndarray:
        f = arg.flags
        return (arg.dtype, arg.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned)
    return arg.__class__


def pass_entry(args: tuple[object, ...], any_layout: tuple[int, ...] = ()
               ) -> Callable[..., tuple[int, int, int]]:
    """``prepare_rows``' compiled entry point for arguments of exactly the types of
    ``args``, compiled (or loaded from the cache) on first use. The arrays at the positions
    ``any_layout`` (arrays the pass only reads) are typed by their dtype and dimensions
    alone: any layout, alignment and writability (C, Fortran or strided, read through
    their strides), so that the caller need check only those two.

    Called directly it skips the dispatcher's type lookup of all 22 arguments: 3-7 us
    of a 20-row reset right after engine work, where the pass's own work is ~3 us. The
    caller must pass arguments of exactly these types (the same classes; ndarrays of the
    same dtype and dimensions and, outside ``any_layout``, the same layout, alignment and
    writability): the entry point unboxes them as typed here, unchecked.
    """
    key = (tuple((a.dtype, a.ndim) if i in any_layout else _describe(a)  # type: ignore[attr-defined]
                 for i, a in enumerate(args)), any_layout)
    entry = _ENTRIES.get(key)
    if entry is None:
        from numba import typeof, types

        sig = [typeof(a) for a in args]
        for i in any_layout:
            sig[i] = types.Array(sig[i].dtype, sig[i].ndim, "A", readonly=True, aligned=False)
        entry = prepare_rows.compile(tuple(sig))
        _ENTRIES[key] = entry
    return entry
