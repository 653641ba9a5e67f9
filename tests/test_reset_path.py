"""The small-k reset path: ids checked inside the compiled row pass, the MuJoCo backend's
one scatter of whole state rows, MotrixSim's row handles reused for ids that repeat."""

from __future__ import annotations

import numpy as np
import pytest

import resettrace
from helpers import stand_rows

N = 24


def _make(name: str):
    return resettrace.make_backend(name, num_envs=N, nthread=1)


def _state(b) -> tuple[np.ndarray, ...]:
    ctrl = np.asarray(b.data.actuator_ctrls, np.float64) if b.name == "motrix" \
        else np.array(b._ctrl)
    return (np.array(b.get_qpos_rows()), np.array(b.get_qvel_rows()), ctrl,
            np.array(b.get_body_pose_rows(None, b.info.body_names)))


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                   np.uint32, np.uint64, list])
def test_every_integer_id_type_resets_the_same_rows(name, dtype) -> None:
    ids = np.array([1, 5, 6, 20])
    q, v = stand_rows(_make(name), len(ids), np.random.default_rng(2))
    want, got = _make(name), _make(name)
    want.set_state(ids.astype(np.int64), q, v)
    got.set_state(ids.tolist() if dtype is list else ids.astype(dtype), q, v)
    for a, b in zip(_state(want), _state(got), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
@pytest.mark.parametrize("ids,match", [
    (np.array([3, 1, N]), f"in \\[0, {N}\\), got {N}"),  # unsorted and out of range
    (np.array([5, -2, 1]), f"in \\[0, {N}\\), got -2"),
    (np.array([2, 9, 1, 9]), "unique, got 9 twice"),
    (np.array([1, 2**63 + 5], np.uint64), f"got {2**63 + 5}"),  # no wrap to a valid id
    (np.array([2, 4, N + 3]), f"got {N + 3}"),  # sorted: found by the compiled pass
])
def test_bad_ids_name_the_id_and_touch_nothing(name, ids, match) -> None:
    b = _make(name)
    before = _state(b)
    q, v = stand_rows(b, len(ids), np.random.default_rng(3))
    with pytest.raises(ValueError, match=match):
        b.set_state(ids, q, v)
    for x, y in zip(before, _state(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _bad_last_row(field: str, q: np.ndarray, v: np.ndarray) -> None:
    if field == "nan_qpos":
        q[-1, 9] = np.nan
    elif field == "inf_qvel":
        v[-1, 4] = np.inf
    else:
        q[-1, 3:7] = 0.0


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
@pytest.mark.parametrize("ids", [np.array([2, 5, 9, 17]), np.array([17, 2, 9, 5])])
@pytest.mark.parametrize("field,match", [("nan_qpos", "qpos has a non-finite"),
                                         ("inf_qvel", "qvel has a non-finite"),
                                         ("zero_quat", "zero base quaternion")])
def test_a_bad_last_row_touches_no_row(name, ids, field, match) -> None:
    """The pass writes engine rows itself (MuJoCo: the state rows): a bad value in the
    last row, found after the earlier rows were converted, leaves every row as it was."""
    b = _make(name)
    b.step(np.zeros((N, b.nu)), 2)
    before = _state(b)
    marks = b.poses.fresh.copy(), b._kin_stale.copy()
    raw = np.array(b._state) if name == "mujoco" else None
    q, v = stand_rows(b, len(ids), np.random.default_rng(5))
    _bad_last_row(field, q, v)
    with pytest.raises(ValueError, match=match):
        b.set_state(ids, q, v)
    np.testing.assert_array_equal(marks[0], b.poses.fresh)  # no row marked either
    np.testing.assert_array_equal(marks[1], b._kin_stale)
    for x, y in zip(before, _state(b), strict=True):
        np.testing.assert_array_equal(x, y)
    if raw is not None:
        np.testing.assert_array_equal(raw, b._state)


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
def test_a_bad_randomization_payload_touches_no_row(name) -> None:
    from resettrace.sim.randomization import RandomizationRows

    b = _make(name)
    b.step(np.zeros((N, b.nu)), 2)
    before = _state(b)
    marks = b.poses.fresh.copy(), b._kin_stale.copy()
    raw = np.array(b._state) if name == "mujoco" else None
    q, v = stand_rows(b, 3, np.random.default_rng(6))
    bad = RandomizationRows(friction=np.array([1.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match="friction must be finite"):
        b.set_state(np.array([4, 1, 8]), q, v, randomization=bad)
    np.testing.assert_array_equal(marks[0], b.poses.fresh)
    np.testing.assert_array_equal(marks[1], b._kin_stale)
    for x, y in zip(before, _state(b), strict=True):
        np.testing.assert_array_equal(x, y)
    if raw is not None:
        np.testing.assert_array_equal(raw, b._state)


def test_mujoco_writes_whole_fresh_state_rows() -> None:
    """After steps have filled every state component, set_state's one scatter leaves each
    reset row as a fresh engine reset followed by the qpos, qvel and ctrl writes, also
    once the scratch rows have grown."""
    from resettrace.sim.backends.mujoco import STAGE_NONE

    b, twin = _make("mujoco"), _make("mujoco")
    rng = np.random.default_rng(4)
    for be in (b, twin):
        for _ in range(5):
            be.step(np.random.default_rng(1).normal(0, 0.5, (N, be.nu)), 3)
    for ids in (np.array([3]), np.array([0, 2, 3, 7, 8, 11, 12, 19, 20, 23])):  # k grows
        q, v = stand_rows(b, len(ids), rng)
        b._warning[:] = twin._warning[:] = 7  # counters a reset clears (its rows only)
        b.set_state(ids, q, v)
        assert (b._warning[ids] == 0).all()
        np.testing.assert_array_equal(np.delete(b._warning, ids, axis=0), 7)
        # the published path: the engine's reset, then each field written
        twin.batch.reset(ids, stage=STAGE_NONE)
        tq = np.array(q)
        tq[:, 3:7] /= np.linalg.norm(tq[:, 3:7], axis=1, keepdims=True)
        twin._qpos[ids], twin._qvel[ids] = tq, v
        twin._ctrl[ids] = np.clip(tq[:, 7 + b.info.actuator_joint], b._ctrl_lo, b._ctrl_hi)
        np.testing.assert_array_equal(b._state[ids], twin._state[ids])
        np.testing.assert_array_equal(b._state, twin._state)  # other rows untouched too


def test_motrix_reuses_the_row_handle_of_ids_that_repeat() -> None:
    b = _make("motrix")
    rng = np.random.default_rng(5)
    a, c = np.array([1, 4, 9]), np.array([2, 4, 10])
    b.set_state(a, *stand_rows(b, 3, rng))
    handle = b._slices[a.astype(np.int32).tobytes()]
    b.set_state(c, *stand_rows(b, 3, rng))  # the scratch ids now hold c
    qa, va = stand_rows(b, 3, rng)
    b.set_state(a, qa, va)
    assert b._slices[a.astype(np.int32).tobytes()] is handle  # reused, not rebuilt
    ref = _make("motrix")
    ref.set_state(a, qa, va)
    np.testing.assert_array_equal(b.get_qpos_rows(a), ref.get_qpos_rows(a))
    np.testing.assert_array_equal(b.get_body_pose_rows(a, ["pelvis"]),
                                  ref.get_body_pose_rows(a, ["pelvis"]))
    for i in range(40):  # bounded: the first kept go first
        b.set_state([i % N, (i + 1) % N] if i % N < N - 1 else [0, N - 1],
                    *stand_rows(b, 2, rng))
    assert len(b._slices) <= 16


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
def test_the_pass_scratch_of_each_reset_size_is_kept_and_stays_right(name) -> None:
    """The k-row scratch is made and checked once per k and reused; resets of other sizes
    in between, unsorted ids, a list and float32 rows leave the same state as a fresh
    backend given the same call, and a bad call leaves every row alone."""
    b = _make(name)
    rng = np.random.default_rng(11)
    calls = [np.array([1, 4, 9]), np.array([2, 3, 5, 7, 8, 11, 12, 13, 15, 17, 19, 21, 23]),
             np.array([9, 4, 1]), [0, 6, 22], np.array([2, 4, 10])]
    for i, ids in enumerate(calls):
        q, v = stand_rows(b, len(ids), rng)
        if i == 3:
            q, v = q.astype(np.float32), v.astype(np.float32)
        b.set_state(ids, q, v)
        ref = _make(name)
        ref.set_state(ids, q, v)
        rows = np.asarray(ids)
        np.testing.assert_array_equal(b.get_qpos_rows(rows), ref.get_qpos_rows(rows))
        np.testing.assert_array_equal(b.get_qvel_rows(rows), ref.get_qvel_rows(rows))
        np.testing.assert_array_equal(b.get_body_pose_rows(rows, ["pelvis"]),
                                      ref.get_body_pose_rows(rows, ["pelvis"]))
    assert sorted(b._passes) == [3, 13, N]  # N: the start at the keyframe
    kept = b._passes[3]
    before = _state(b)
    q, v = stand_rows(b, 3, rng)
    q[2, 0] = np.nan
    with pytest.raises(ValueError, match="qpos has a non-finite value at row 2, column 0"):
        b.set_state(np.array([5, 6, 7]), q, v)
    assert b._passes[3] is kept
    for a, c in zip(before, _state(b), strict=True):
        np.testing.assert_array_equal(a, c)
    for k in range(1, N + 1):  # bounded: all dropped when one size too many comes
        b.set_state(np.arange(k), *stand_rows(b, k, rng))
    assert 0 < len(b._passes) <= 64


def _odd_rows(kind: str, q: np.ndarray, v: np.ndarray, ids: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same ids and rows as arrays of another numba type than int64 ids and float64
    C-contiguous writable rows."""
    if kind == "int32 ids":
        return ids.astype(np.int32), q, v
    if kind == "strided ids":
        wide = np.zeros(2 * len(ids), np.int64)
        wide[::2] = ids
        return wide[::2], q, v
    if kind == "float32 rows":
        return ids, q.astype(np.float32), v.astype(np.float32)
    if kind == "fortran rows":
        return ids, np.asfortranarray(q), np.asfortranarray(v)
    if kind == "read-only rows":
        q, v = q.copy(), v.copy()
        q.flags.writeable = v.flags.writeable = False
        return ids, q, v
    if kind == "strided rows":
        wq, wv = np.zeros((len(q), 2 * q.shape[1])), np.zeros((len(v), 2 * v.shape[1]))
        wq[:, ::2], wv[:, ::2] = q, v
        return ids, wq[:, ::2], wv[:, ::2]
    if kind == "list rows":
        return ids, q.tolist(), v.tolist()
    if kind == "float16 rows":  # (the reference widens the same float16 values)
        return ids, q.astype(np.float16), v.astype(np.float16)
    if kind == "big-endian ids":
        return ids.astype(">i8"), q, v
    if kind == "unaligned rows":  # float64 at an odd address: numpy flags it unaligned
        def unaligned(a: np.ndarray) -> np.ndarray:
            buf = np.zeros(a.nbytes + 1, np.uint8)
            out = np.frombuffer(buf.data, np.float64, a.size, offset=1).reshape(a.shape)
            out[...] = a
            assert not out.flags.aligned
            return out
        return ids, unaligned(q), unaligned(v)
    assert kind == "big-endian rows"
    return ids, q.astype(">f8"), v.astype(">f8")


#: arrays the pass's entry point reads as they are (int64 ids, float64 rows, any layout)
_ENTRY_KINDS = ("strided ids", "fortran rows", "read-only rows", "strided rows",
                "unaligned rows")
#: arrays of another numba dtype (the dispatcher) or none the pass takes (converted first)
_DISPATCHED_KINDS = ("int32 ids", "float32 rows", "big-endian rows", "list rows",
                     "float16 rows", "big-endian ids")


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
def test_only_the_usual_dtypes_take_the_pass_entry_point(name, monkeypatch) -> None:
    """int64 ids with float64 rows, in any layout (C, Fortran, strided, read-only,
    unaligned), go to the pass's entry point compiled for them (no type dispatch); arrays
    of any other numba dtype, which that entry point would misread, go through the
    dispatcher, and every route leaves the state that float64 C rows leave."""
    from resettrace.sim.backends import _base, _kernels

    dispatched = []
    real = _base.prepare_rows

    def spy(*args):
        dispatched.append(args[3].dtype)  # qpos as the pass reads it
        return real(*args)

    monkeypatch.setattr(_base, "prepare_rows", spy)
    monkeypatch.setattr(_kernels, "prepare_rows", spy)  # convert_rows' route
    rng = np.random.default_rng(21)
    for k in (2, 5):  # (one row is C-contiguous whatever its strides)
        ids = np.sort(rng.choice(N, k, replace=False))
        q, v = stand_rows(_make(name), k, rng)
        for kind in _ENTRY_KINDS + _DISPATCHED_KINDS:
            odd_ids, oq, ov = _odd_rows(kind, q, v, ids)
            ref, got = _make(name), _make(name)
            dispatched.clear()
            # the same values as int64 ids and float64 C rows (float32 widens exactly)
            ref.set_state(ids.copy(), np.array(oq, np.float64, order="C"),
                          np.array(ov, np.float64, order="C"))
            assert dispatched == [], "the usual types went through the dispatcher"
            got.set_state(odd_ids, oq, ov)
            assert len(dispatched) == (kind in _DISPATCHED_KINDS), kind
            for x, y in zip(_state(ref), _state(got), strict=True):
                np.testing.assert_array_equal(x, y, err_msg=kind)


def test_mujoco_forward_falls_back_to_the_public_call() -> None:
    """Without mujoco.batch's internals, forward kinematics goes through Batch.forward."""
    from resettrace.sim.backends.mujoco import _STAGE_POS, forward_rows

    calls = []

    class PublicOnly:
        def forward(self, ids, stage):
            calls.append((list(ids), stage))

    forward_rows(PublicOnly())(np.array([1, 3], np.int32))
    assert calls == [([1, 3], _STAGE_POS)]
    b = _make("mujoco")  # the engine's own call computes the same poses as Batch.forward
    q, v = stand_rows(b, 2, np.random.default_rng(6))
    b.set_state(np.array([4, 9]), q, v)
    ids = np.array([4, 9], np.int32)
    b._fk(ids)
    fast = np.array(b._xpos[ids])
    b.batch.forward(ids, stage=_STAGE_POS)
    np.testing.assert_array_equal(fast, b._xpos[ids])


def test_the_pass_refuses_engine_arrays_it_would_index_past() -> None:
    """The compiled pass writes marks and state rows by id with no bounds checks: arrays
    shorter than num_envs (or state rows of another width) are refused before it runs."""
    from resettrace.sim.backends._validate import OutRows, convert_rows

    b = _make("mujoco")
    ids = np.array([1, N - 1])
    q, v = stand_rows(b, 2, np.random.default_rng(7))
    (rows,) = b._state_rows.rows(2)
    out = OutRows(rows, b._state_cols[0], rows, b._state_cols[1], rows, b._state_cols[2],
                  b.nq, b.nv)
    ok = np.zeros(N, bool)

    def call(**kw):
        args = {"fresh": ok, "stale": ok, "state": np.array(b._state),
                "warning": np.array(b._warning)} | kw
        return convert_rows(ids, N, np.zeros(2, np.int32), q, v, out, b._act_qadr,
                            b._ctrl_lo, b._ctrl_hi, xyzw=False, lazy=True, **args)

    for kw, match in (({"fresh": np.zeros(N - 1, bool)}, "row marks"),
                      ({"stale": np.zeros(3, bool)}, "row marks"),
                      ({"state": np.zeros((N - 1, rows.shape[1]))}, "state rows"),
                      ({"state": np.zeros((N, rows.shape[1] - 1))}, "state rows"),
                      ({"warning": np.zeros((N - 1, 7, 2), np.int32)}, "warning counters")):
        with pytest.raises(ValueError, match=match):
            call(**kw)
    state = np.array(b._state)
    call(state=state)  # the right sizes: the rows are written
    np.testing.assert_array_equal(state[ids], rows)


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
def test_an_eager_reset_leaves_no_row_stale(name, monkeypatch) -> None:
    """Rows a lazy reset left stale and an eager reset then computed are not computed a
    second time at the next pose read."""
    b = _make(name)
    ids = np.array([1, 3])
    q, v = stand_rows(b, 2, np.random.default_rng(8))
    b.set_state(ids, q, v)  # lazy (the default): stale
    assert b._kin_stale[ids].all()
    b.lazy_kinematics = False
    b.set_state(ids, q, v)  # eager: computed here
    assert not b._kin_stale[ids].any()
    calls = []
    forward = b._forward
    monkeypatch.setattr(b, "_forward", lambda rows, index: calls.append(rows) or
                        forward(rows, index))
    b.get_body_pose_rows(ids, ["pelvis"])
    assert calls == []


def test_a_failed_engine_write_leaves_its_rows_stale(monkeypatch) -> None:
    """An eager reset whose kinematics call fails leaves the rows' kinematics stale, so
    that the next pose read computes them rather than returning the old ones."""
    b = _make("mujoco")
    b.step(np.zeros((N, b.nu)), 1)  # every row's kinematics computed
    b.lazy_kinematics = False
    ids = np.array([2, 5])

    def fail(rows, index):
        raise RuntimeError("forward failed")

    monkeypatch.setattr(b, "_forward", fail)
    with pytest.raises(RuntimeError, match="forward failed"):
        b.set_state(ids, *stand_rows(b, 2, np.random.default_rng(9)))
    assert b._kin_stale[ids].all() and b._kin_stale.sum() == 2


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
def test_scratch_the_pass_cannot_bind_takes_the_dispatcher(name, monkeypatch) -> None:
    """A backend whose scratch bind_pass does not bind (a user's own dtype or layout) resets
    through numba's dispatcher with the same result as the bound pass."""
    from resettrace.sim.backends import _base

    rng = np.random.default_rng(8)
    ids = np.sort(rng.choice(N, 5, replace=False))
    ref = _make(name)
    q, v = stand_rows(ref, 5, rng)
    ref.set_state(ids, q, v)
    assert ref._passes[5].bound is not None  # bound
    monkeypatch.setattr(_base, "bind_pass", lambda *a: None)
    got = _make(name)
    dispatched = []
    real = _base.prepare_rows

    def spy(*args):
        dispatched.append(len(args))
        return real(*args)

    monkeypatch.setattr(_base, "prepare_rows", spy)
    got.set_state(ids, q, v)
    assert got._passes[5].bound is None and dispatched == [22]
    for x, y in zip(_state(ref), _state(got), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["mujoco", "motrix"])
def test_a_closed_backend_refuses_every_reset_before_writing(name) -> None:
    """After close, set_state raises a RuntimeError naming the backend before any write:
    a size reset before (its kept pass dropped), a new size, and no rows at all; so does a
    physics step."""
    b = _make(name)
    rng = np.random.default_rng(13)
    b.set_state(np.array([1, 4]), *stand_rows(b, 2, rng))
    marks = (b.poses.fresh.copy(), b._kin_stale.copy())
    b.close()
    for k in (2, 3, 0):
        with pytest.raises(RuntimeError, match=f"the {name} backend is closed"):
            b.set_state(np.arange(k), *stand_rows(b, k, rng))
    np.testing.assert_array_equal(b.poses.fresh, marks[0])  # nothing marked either
    np.testing.assert_array_equal(b._kin_stale, marks[1])
    with pytest.raises(RuntimeError, match=f"the {name} backend is closed"):
        b.step(np.zeros((N, b.nu)))
