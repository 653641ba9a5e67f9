"""Helpers shared by the tests (importable: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from resettrace import catalog as C

#: the tests of the compiled recorder itself, left out of the suite's pure-Python pass
#: (make test runs the suite a second time with RESETTRACE_PURE_PYTHON=1)
compiled_only = pytest.mark.skipif(
    os.environ.get("RESETTRACE_PURE_PYTHON", "0").strip() not in ("", "0"),
    reason="about the compiled recorder; this is the pure-Python pass")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any resettrace or OpenTelemetry setting (nor
    PYTHONPATH, RANK), the venv's bin first on PATH, then ``extra``: for a child process."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESETTRACE", "OTEL_")) and k not in ("PYTHONPATH", "RANK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def assert_closed(stats: dict[str, Any], phase: C.Phase, catalog: Any = None) -> None:
    """A phase's account is closed: its children's totals and its gap make its total
    (``stats``: a session's ``KeyStats`` or a run record's dicts; ``catalog``: the one
    that names its children, default the process's: a run record's own, from
    ``RunRecord.catalog()``, when the run registered phases this process has not)."""
    def total(key: str) -> float:
        s = stats[key]
        return s["total_ms"] if isinstance(s, dict) else s.total_ms

    cat = C.CATALOG if catalog is None else catalog
    keys = [k for k in cat.timing_keys(cat.resolve(phase.span)) if k != phase.key]
    parts = sum(total(k) for k in keys if k in stats)
    assert parts == pytest.approx(total(phase.key), rel=1e-6, abs=1e-6), (phase.span, keys)


def stand_rows(backend, k: int, rng: np.random.Generator | None = None):
    """k valid reset states: the keyframe with a little noise (unit base quaternion)."""
    q = np.tile(backend.keyframe_qpos, (k, 1))
    v = np.zeros((k, backend.nv))
    if rng is not None:
        q[:, 0:2] += rng.uniform(-0.3, 0.3, (k, 2))
        q[:, 7:] += rng.uniform(-0.05, 0.05, (k, backend.nq - 7))
        v[:] = rng.uniform(-0.5, 0.5, v.shape)
    return q, v


def reset_timings(backend, ks, rng: np.random.Generator):
    """``(lazy, timing)`` of one ``set_state`` of k sorted random rows per k in ``ks``, in
    each kinematics mode (lazy first); each timing checked: the 16 keys, floats >= 0."""
    from resettrace import catalog as C

    for lazy in (True, False):
        backend.lazy_kinematics = lazy
        for k in ks:
            ids = np.sort(rng.choice(backend.num_envs, k, replace=False))
            out = backend.set_state(ids, *stand_rows(backend, k, rng))
            assert out is not None
            timing = out["timing"]
            assert tuple(timing) == C.SET_STATE_KEYS
            assert all(isinstance(x, float) and x >= 0.0 for x in timing.values()), timing
            yield lazy, timing


class FakeClock:
    """perf_counter_ns stand-in for the recorder: tests advance ``now`` by hand."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def record_traces(session, n: int, *, count: int = 3, plan: bool = True) -> None:
    """``n`` traces on a new recorder of ``session``: ``dr_reset`` (``count`` envs) holding
    ``dr_reset.plan`` (unless ``plan`` is False) and ``set_state``: 3 (or 2) spans each."""
    from resettrace import catalog as C

    rec = session.recorder(backend="test")
    for _ in range(n):
        with rec.scope(C.DR_RESET, count):
            if plan:
                with rec.scope(C.DR_RESET_PLAN):
                    pass
            with rec.scope(C.SET_STATE):
                pass


#: a job for two overlapping processes on one output path: records one scope, prints its
#: pid, touches argv[1], then waits for argv[2] to exist ("-": no wait)
OVERLAPPING_JOB = """import os, sys, time
from pathlib import Path
import resettrace
with resettrace.current_recorder().scope("dr_reset", 1):
    pass
print(os.getpid(), flush=True)
Path(sys.argv[1]).touch()
while sys.argv[2] != "-" and not Path(sys.argv[2]).exists():
    time.sleep(0.01)
"""
