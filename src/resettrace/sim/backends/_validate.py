"""Input checks shared by every backend, run before any engine call.

Each check raises ``ValueError`` naming the argument and the problem, so that a
bad call never reaches an engine (MotrixSim has no bounds checks and can crash the
process) and leaves every env's state untouched.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["check_ids", "id_array", "convert_rows", "check_pass_target", "finish_pass",
           "OutRows", "check_rows", "normalise_quat_into", "quat_problem", "QUAT_EPS",
           "PASS_DTYPES"]

#: A base quaternion shorter than this cannot be normalised (nor one whose squared norm
#: overflows float64).
QUAT_EPS = 1e-9
#: the dtypes the compiled pass takes as they are (native-order integers and floats);
#: other numeric rows (float16, long double, another byte order) are converted first
PASS_DTYPES = frozenset(np.dtype(t) for t in (
    np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float32, np.float64))


def id_array(env_ids: object) -> np.ndarray:
    """``env_ids`` as a 1-D integer array (a view where possible): the checks that need no
    pass over the values (those are in the compiled pass, or :func:`check_ids`)."""
    ids = np.asarray(env_ids)
    if ids.dtype == np.bool_:
        raise ValueError("env_ids must be integer ids, not a boolean mask "
                         "(use np.flatnonzero(mask))")
    if ids.ndim != 1:
        raise ValueError(f"env_ids must be one-dimensional, got shape {ids.shape}")
    if ids.size and ids.dtype.kind not in "iu":
        raise ValueError(f"env_ids must be integers, got dtype {ids.dtype}")
    if ids.dtype.kind in "iu" and ids.dtype not in PASS_DTYPES:  # another byte order
        ids = ids.astype(ids.dtype.newbyteorder("="))  # (the pass cannot read it)
    return ids


def check_ids(env_ids: object, num_envs: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate env ids; return them sorted as int32, and the sorting order (or None).

    Ids must be a 1-D array of integers, unique, in ``[0, num_envs)``. Unsorted ids
    are accepted: the returned order puts the caller's rows in id order.
    """
    ids = id_array(env_ids)
    if ids.size == 0:
        return np.zeros(0, np.int32), None
    order = None
    if ids.size > 1 and not (ids[1:] > ids[:-1]).all():
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        dup = np.flatnonzero(ids[1:] == ids[:-1])
        if dup.size:
            raise ValueError(f"env_ids must be unique, got {ids[dup[0]]} twice")
    lo, hi = ids[0], ids[-1]  # sorted: the ends are the extremes
    if lo < 0 or hi >= num_envs:
        _out_of_range(lo if lo < 0 else hi, num_envs)
    if ids.dtype != np.int32 or not ids.flags.c_contiguous:
        ids = np.ascontiguousarray(ids, dtype=np.int32)
    return ids, order


def _out_of_range(bad: object, num_envs: int) -> None:
    raise ValueError(f"env_ids must be in [0, {num_envs}), got {bad}")


def check_rows(name: str, rows: object, k: int, width: int) -> np.ndarray:
    """A finite float array of shape ``(k, width)`` (a view where possible)."""
    a = np.asarray(rows)
    if a.shape != (k, width):
        raise ValueError(f"{name} must have shape ({k}, {width}) for {k} env ids, "
                         f"got {a.shape}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} must be numeric, got dtype {a.dtype}")
    if not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"{name} has a non-finite value at row {bad[0]}, column {bad[1]}")
    return a


def normalise_quat_into(out: np.ndarray, quat: np.ndarray, name: str) -> None:
    """Write unit quaternions of ``quat`` ``(k, 4)`` into ``out``; reject the ones that
    cannot be normalised (:func:`quat_problem`)."""
    with np.errstate(over="ignore"):
        norm = np.sqrt(np.einsum("ij,ij->i", quat, quat))
    bad = ~((norm >= QUAT_EPS) & (norm < np.inf))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(quat_problem(name, quat[row], row))
    np.divide(quat, norm[:, None], out=out)


def quat_problem(name: str, quat: np.ndarray, row: int) -> str:
    """Why the base quaternion ``quat`` (4 finite values) of ``row`` cannot be normalised:
    it is zero (shorter than :data:`QUAT_EPS`), or its squared norm overflows float64
    (parts beyond ~1e154), which would normalise it to zeros."""
    if float(np.abs(np.asarray(quat, np.float64)).max()) < 1.0:  # refused: so not long
        return f"{name} has a zero base quaternion at row {row}"
    return (f"{name} has a base quaternion too large to normalise at row {row} (its "
            "squared norm overflows float64)")


def _shaped(name: str, rows: object, k: int, width: int) -> np.ndarray:
    a = np.asarray(rows)
    if a.shape != (k, width):
        raise ValueError(f"{name} must have shape ({k}, {width}) for {k} env ids, "
                         f"got {a.shape}")
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be numeric, got dtype {a.dtype}")
    if a.dtype not in PASS_DTYPES:  # float16, long double, another byte order
        a = a.astype(np.float64)
    return a


class OutRows(NamedTuple):
    """Where :func:`convert_rows` writes k rows: qpos to columns ``oq:oq + nq`` of ``q``,
    qvel to ``ov:ov + nv`` of ``v``, the targets from ``oc`` on of ``ctrl`` (the three may
    be one array of whole engine rows)."""

    q: np.ndarray
    oq: int
    v: np.ndarray
    ov: int
    ctrl: np.ndarray
    oc: int
    nq: int
    nv: int


def convert_rows(ids_in: np.ndarray, num_envs: int, ids_out: np.ndarray, qpos: object,
                 qvel: object, out: OutRows, act_qadr: np.ndarray, ctrl_lo: np.ndarray,
                 ctrl_hi: np.ndarray, *, xyzw: bool, fresh: np.ndarray, stale: np.ndarray,
                 lazy: bool, state: np.ndarray | None = None, warning: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate the caller's ids and rows and write the engine's index and rows.

    ``ids_in`` is :func:`id_array`'s; ``ids_out`` (int32) and ``out`` (any float dtype)
    are ``k``-row scratch. Returns the sorted int32 ids (``ids_out``, or :func:`check_ids`' for ids
    that are not sorted) and the order that put the caller's rows in id order (None when
    they were): qpos and qvel in id order, the base quaternion normalised (and reordered
    to xyzw when ``xyzw``), the targets holding the new joint pose; once all is good the
    rows are marked in the bool arrays ``fresh`` (False: pose cache stale) and ``stale``
    (``lazy``: kinematics stale; eager: they are computed next), and, given the engine's
    float64 state rows ``state`` and int32 ``warning`` counters (``out.q`` then holds whole
    state rows), ``state[ids] = out.q[:k]`` and ``warning[ids] = 0`` written. One compiled pass
    (:mod:`resettrace.sim.backends._kernels`), two for unsorted ids; ``ValueError`` naming
    the caller's id or row on a bad id, a wrong shape, a non-finite or (for float32
    scratch) too large value, or a base quaternion that cannot be normalised (zero, or its
    squared norm overflowing float64). ``RowBackend.set_state`` calls the
    same pass directly, its scratch checked once per k (:func:`check_pass_target`).
    """
    from resettrace.sim.backends import _kernels as K

    k = ids_out.shape[0]
    q_in = _shaped("qpos", qpos, k, out.nq)
    v_in = _shaped("qvel", qvel, k, out.nv)
    if k == 0:
        return ids_out, None
    if ids_in.shape[0] != k:
        raise ValueError(f"{k} output rows do not hold {ids_in.shape[0]} ids")
    state, warning = check_pass_target(k, num_envs, out, ctrl_lo, fresh, stale, state,
                                       warning)
    q, oq, v, ov, c, oc = out[:6]
    code, row, col = K.prepare_rows(ids_in, num_envs, ids_out, q_in, v_in, K.NO_ORDER, q, oq,
                                    v, ov, c, oc, act_qadr, ctrl_lo, ctrl_hi, xyzw, fresh,
                                    stale, lazy, state, warning, K.NO_KEPT)
    if code == K.OK:
        return ids_out, None
    return finish_pass(code, row, col, ids_in, num_envs, ids_out, q_in, v_in, out, act_qadr,
                       ctrl_lo, ctrl_hi, xyzw, fresh, stale, lazy, state, warning)


def check_pass_target(k: int, num_envs: int, out: OutRows, ctrl_lo: np.ndarray,
                      fresh: np.ndarray, stale: np.ndarray, state: np.ndarray | None,
                      warning: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """What the compiled pass indexes unchecked holds ``k`` rows of ``num_envs`` envs
    (``ValueError`` otherwise); ``state`` and ``warning`` as the pass takes them (the empty
    stand-ins for None)."""
    from resettrace.sim.backends import _kernels as K

    q, oq, v, ov, c, oc = out[:6]
    if fresh.shape[0] < num_envs or stale.shape[0] < num_envs:  # the pass marks them
        raise ValueError(f"row marks {fresh.shape}, {stale.shape} do not hold {num_envs} rows")
    if (min(q.shape[0], v.shape[0], c.shape[0]) < k
            or oq + out.nq > q.shape[1] or ov + out.nv > v.shape[1]
            or oc + ctrl_lo.shape[0] > c.shape[1]):  # the pass indexes these unchecked too
        raise ValueError(f"{k} output rows {q.shape}, {v.shape}, {c.shape} do not hold "
                         f"{k} ids' qpos, qvel and ctrl at {oq}, {ov}, {oc}")
    if state is None or state is K.NO_STATE:  # (kept pass rows hold the stand-ins)
        state = K.NO_STATE
    elif state.shape[0] < num_envs or state.shape[1] != q.shape[1]:  # the pass indexes them
        raise ValueError(f"state rows {state.shape} do not hold {num_envs} rows of the "
                         f"output rows' width {q.shape[1]}")
    if warning is None or warning is K.NO_WARNING:
        warning = K.NO_WARNING
    elif warning.shape[0] < num_envs:
        raise ValueError(f"warning counters {warning.shape} do not hold {num_envs} rows")
    return state, warning


def finish_pass(code: int, row: int, col: int, ids_in: np.ndarray, num_envs: int,
                ids_out: np.ndarray, q_in: np.ndarray, v_in: np.ndarray, out: OutRows,
                act_qadr: np.ndarray, ctrl_lo: np.ndarray, ctrl_hi: np.ndarray, xyzw: bool,
                fresh: np.ndarray, stale: np.ndarray, lazy: bool, state: np.ndarray,
                warning: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """After a first pass that did not return OK: unsorted ids sorted (and checked unique)
    and the pass run again with their order; a bad id or row raised as ``ValueError``."""
    from resettrace.sim.backends import _kernels as K

    order: np.ndarray | None = None
    if code == K.UNSORTED:  # sort (and check unique) here, then the compiled pass again
        q, oq, v, ov, c, oc = out[:6]
        ids, order = check_ids(ids_in, num_envs)
        code, row, col = K.prepare_rows(ids, num_envs, ids_out, q_in, v_in, order, q, oq, v,
                                        ov, c, oc, act_qadr, ctrl_lo, ctrl_hi, xyzw, fresh,
                                        stale, lazy, state, warning, K.NO_KEPT)
    if code == K.OK:
        return ids_out, order
    if code == K.BAD_ID:
        _out_of_range(ids_in[row], num_envs)
    if code == K.BAD_QUAT:
        raise ValueError(quat_problem("qpos", q_in[row, 3:7], row))
    if code not in (K.BAD_QPOS, K.BAD_QVEL):  # (a bound pass given other k rows)
        raise RuntimeError(f"the compiled pass returned code {code} for {ids_out.shape[0]} rows")
    name, src = ("qpos", q_in) if code == K.BAD_QPOS else ("qvel", v_in)
    if np.isfinite(src[row, col]):
        raise ValueError(f"{name} has a value too large for float32 at row {row}, column {col}")
    raise ValueError(f"{name} has a non-finite value at row {row}, column {col}")
