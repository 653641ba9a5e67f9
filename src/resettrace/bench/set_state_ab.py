"""``resettrace bench set-state-ab``: the shipped ``set_state`` against the published path.

Three variants reset the same k rows of one backend instance, one call each in a fresh
random order per round, with the same inputs:

``baseline``
    A faithful reimplementation of the published pre-optimisation path (the one whose
    breakdown is in the project context), not a strawman: it validates its input with the
    same rules as the shipped path, as plain numpy calls (:func:`check_ids`,
    :func:`check_rows`; the shipped path does the row checks inside its one compiled
    conversion pass, so part of the ``qpos_convert`` difference is validation), and emits
    the same catalog phase scopes, so its per-key milliseconds compare one to one. Per
    call it builds a fresh bool mask, copies qpos (``np.array(qpos, copy=True)``),
    converts the ids again inside each helper (``np.asarray(env_ids, dtype=np.intp)``)
    and forces ``np.ascontiguousarray`` on every engine input. MotrixSim: ``data[mask]``
    (O(N)), then ``reset``, ``set_dof_vel``,
    ``set_dof_pos``, ``actuator_ctrls`` and ``forward_kinematic`` on that slice, and the
    link poses of the reset rows through the same slice into the pose cache. MuJoCo:
    ``Batch.reset(ids, stage=NONE)``, separate qpos / qvel / ctrl writes, a full
    ``forward(ids)`` and the poses of the reset rows into the cache.
``optimized``
    The backend's own ``set_state`` with eager kinematics (``lazy_kinematics = False``:
    forward kinematics of the reset rows inside the call).
``lazy``
    The backend's own ``set_state`` as shipped (``lazy_kinematics = True``): the reset rows'
    kinematics are left to the next pose read or physics step, so the call does less than
    the floor, which computes them.
``floor``
    The bare engine floor for the same k rows: the engine calls of the backend's own route
    to the same final state (qpos, qvel, ctrl, kinematics of the reset rows fresh in the
    engine), with every input converted and the index built before the clock starts.
    MotrixSim: a pre-built ``data[DisjointIndices(ids)]`` handle, ``sub.reset(model, q, v,
    forward_kinematic=True)`` then ``sub.actuator_ctrls = ctrl`` (2 calls; MotrixSim's
    one-call write program, ``model.compile_write(..., reset=True)``, measured 10-18%
    faster at k <= 51 and slower from k ~ 64 on, is not that route: ``set_state`` does
    not use it; both resets clear the rows' per-env overrides). MuJoCo: one scatter of
    whole pre-built state rows (template + qpos + qvel + ctrl), the warning counters
    zeroed, the engine's ``forward(ids, stage=POS)`` on the ids checked beforehand (1 call;
    ``Batch.forward`` would check them again, as ``set_state`` does not). ``set_state``
    calls the same engine calls; what it adds at small k is its fixed Python work (checks,
    the compiled pass's call, scopes).
``floor_aa``
    The A/A twin: the floor's calls timed a second time in each round. ``aa_ratio`` (its
    p50 over the floor's) shows how far two identical variants' p50s drift apart in the
    same run, the noise beside ``opt/floor``.

Every call of every variant follows ``idle_us`` of busy Python (:func:`_busy`, default
1 ms): in training the physics step ends ~2 ms before ``set_state``'s first engine call,
and an engine call right after another is faster (figures in docs/benchmarks.md), which
``set_state``'s, coming after its own checks, never is. ``idle_us=0`` runs the calls back
to back.

Sweeps backends x ``num_envs`` x reset ratios (k = round(ratio * num_envs)), ``warmup``
untimed then ``calls`` timed calls per variant and cell, or more where the warmup rounds
say that ``calls`` rounds fill less than ``min_seconds`` (small k: a 20-row cell's round
takes ~6 ms, and a p50 ratio of 200 rounds moved by a few percent from run to run;
``calls`` in each cell's result). ``baseline_ms`` and
``optimized_ms`` are the medians of the ``set_state`` span (the sum of the 16 keys);
``floor_ms`` the median wall time of the floor's engine calls; ``floor_ratio_ci`` and
``aa_ratio_ci`` 95% paired bootstrap intervals (rounds resampled) of opt/floor and A/A.
With ``fixed_k`` the optimized path also resets ``fixed_k`` rows on every ``num_envs``
instance, round-robin across them, and reports the largest-N / smallest-N ratio (it should
be ~1: no O(N) work).

The variants leave identical state (:func:`final_state` reads it; a test compares them).
No physics step runs between calls: each call rewrites the same rows to the same values,
and the random order spreads any cache warmth evenly over the variants.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.bench._stats import paired_ratio_ci
from resettrace.sim.backends.published import baseline_set_state, final_state, make_floor
from resettrace.tables import format_table
from resettrace.tracing.recorder import Recorder

__all__ = ["SetStateABConfig", "run_set_state_ab", "render_set_state_ab", "VARIANTS",
           "baseline_set_state", "make_floor", "final_state", "make_inputs"]

VARIANTS = ("baseline", "optimized", "lazy", "floor", "floor_aa")
BACKENDS = ("mujoco", "motrix")


@dataclass(frozen=True, kw_only=True)
class SetStateABConfig:
    #: simulator backends to compare, each on its own instances
    backends: tuple[str, ...] = BACKENDS
    #: batch sizes; one backend instance per size
    num_envs: tuple[int, ...] = (1024, 2048, 4096)
    #: shares of the batch reset per call
    ratios: tuple[float, ...] = (0.02, 0.05, 0.25, 0.5)
    #: timed calls per variant and cell (at least; see ``min_seconds``)
    calls: int = 30
    #: timed seconds per cell at least: a cell whose rounds are short (small k) runs more
    #: than ``calls`` of them, as many as its warmup rounds (after the first) say fill this
    #: (0, or no warmup: ``calls``)
    min_seconds: float = 3.0
    #: untimed calls per variant and cell first
    warmup: int = 5
    #: rows of the N-independence check (0: skip it)
    fixed_k: int = 82
    #: MJCF path instead of the bundled G1
    model: str | None = None
    #: engine threads (None: all CPUs)
    nthread: int | None = None
    seed: int = 0
    #: distinct input sets cycled through (ids and states), built before timing
    pool: int = 8
    #: microseconds of busy Python before every call of every variant, as in training
    #: (the physics step ends ~2 ms before set_state's first engine call; 0: calls back
    #: to back)
    idle_us: float = 1000.0

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("--backends needs at least one backend")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown backend(s) {unknown}; known: {', '.join(BACKENDS)}")
        if not self.num_envs or min(self.num_envs) < 1:
            raise ValueError("--num-envs needs values >= 1")
        if not self.ratios or not all(0.0 < r <= 1.0 for r in self.ratios):
            raise ValueError(f"--ratios must be in (0, 1], got {list(self.ratios)}")
        if self.calls < 1 or self.warmup < 0 or self.pool < 1:
            raise ValueError("--calls must be >= 1 and --warmup >= 0")
        if not 0.0 <= self.idle_us <= 1e6:
            raise ValueError(f"--idle-us must be in [0, 1e6], got {self.idle_us}")
        if not 0.0 <= self.min_seconds <= 3600.0:
            raise ValueError(f"--min-seconds must be in [0, 3600], got {self.min_seconds}")
        if self.fixed_k < 0:
            raise ValueError(f"--fixed-k must be >= 0, got {self.fixed_k}")
        if self.fixed_k > min(self.num_envs):
            raise ValueError(f"--fixed-k {self.fixed_k} exceeds the smallest --num-envs "
                             f"{min(self.num_envs)}")


# -- inputs ------------------------------------------------------------------------------------
def make_inputs(backend: Any, k: int, rng: np.random.Generator
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted unique ids (int64, as ``np.flatnonzero(done)`` gives them) and valid reset
    states: the keyframe with xy, yaw, joint and velocity noise (contract layout, wxyz)."""
    n = backend.num_envs
    ids = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
    q = np.tile(backend.keyframe_qpos, (k, 1))
    q[:, 0:2] += rng.uniform(-0.5, 0.5, (k, 2))
    yaw = rng.uniform(-np.pi, np.pi, k)
    q[:, 3:7] = np.stack([np.cos(yaw / 2), np.zeros(k), np.zeros(k), np.sin(yaw / 2)], 1)
    q[:, 7:] += rng.uniform(-0.1, 0.1, (k, backend.nq - 7))
    v = rng.uniform(-0.5, 0.5, (k, backend.nv))
    return ids, q, v


# -- the benchmark -----------------------------------------------------------------------------
def _make_backend(name: str, num_envs: int, cfg: SetStateABConfig) -> Any:
    from resettrace.sim.backends import make_backend

    options: dict[str, Any] = {} if cfg.nthread is None else {"nthread": cfg.nthread}
    return make_backend(name, num_envs=num_envs, model=cfg.model, recorder=Recorder(),
                        **options)


def _p50(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _busy(ns: int) -> None:
    """Spin ``ns`` ns: the env's own Python between a physics step and its resets (an
    engine call right after another is tens of us faster at small k than one after a
    millisecond of Python; the cause, likely its thread pool, was not isolated)."""
    if ns:
        until = time.perf_counter_ns() + ns
        while time.perf_counter_ns() < until:
            pass


def _run_cell(be: Any, k: int, cfg: SetStateABConfig, rng: np.random.Generator
              ) -> dict[str, Any]:
    inputs = [make_inputs(be, k, rng) for _ in range(cfg.pool)]
    floors = [make_floor(be, *inp) for inp in inputs]
    timings: dict[str, list[dict[str, float]]] = {"baseline": [], "optimized": [], "lazy": []}
    floor_ms: list[float] = []
    floor_aa_ms: list[float] = []  # the A/A twin: the same floor calls, timed again

    idle_ns = int(cfg.idle_us * 1e3)

    def one(variant: str, i: int, record: bool) -> None:
        ids, q, v = inputs[i % cfg.pool]
        _busy(idle_ns)
        if variant in ("floor", "floor_aa"):
            f = floors[i % cfg.pool]
            t0 = time.perf_counter_ns()
            f()
            t1 = time.perf_counter_ns()
            if record:
                (floor_ms if variant == "floor" else floor_aa_ms).append((t1 - t0) * 1e-6)
            return
        if variant == "baseline":
            out = baseline_set_state(be, ids, q, v)
        else:
            be.lazy_kinematics = variant == "lazy"
            out = be.set_state(ids, q, v)
        if record:
            assert out is not None
            timings[variant].append(out["timing"])

    t0, timed = time.perf_counter(), cfg.warmup
    shipped = be.lazy_kinematics
    for i in range(cfg.warmup):
        for variant in VARIANTS:
            one(variant, i, False)
        if i == 0 and cfg.warmup > 1:  # the first round binds each k's pass: not timed
            t0, timed = time.perf_counter(), cfg.warmup - 1
    calls = cfg.calls
    if cfg.min_seconds and timed:  # small cells: enough rounds for a stable p50
        per_round = (time.perf_counter() - t0) / timed
        calls = max(calls, math.ceil(cfg.min_seconds / max(per_round, 1e-9)))
    for i in range(calls):
        for variant in rng.permutation(VARIANTS):
            one(str(variant), i, True)
    be.lazy_kinematics = shipped  # as shipped again
    base = [sum(t.values()) for t in timings["baseline"]]
    opt = [sum(t.values()) for t in timings["optimized"]]
    lazy = [sum(t.values()) for t in timings["lazy"]]
    keys = {}
    for key in C.SET_STATE_KEYS:
        b = _p50([t[key] for t in timings["baseline"]])
        o = _p50([t[key] for t in timings["optimized"]])
        lz = _p50([t[key] for t in timings["lazy"]])
        keys[key] = {"baseline_ms": b, "optimized_ms": o, "lazy_ms": lz,
                     "speedup": _ratio(b, o)}
    b50, o50, l50, f50 = _p50(base), _p50(opt), _p50(lazy), _p50(floor_ms)
    return {"calls": calls, "baseline_ms": b50, "optimized_ms": o50, "lazy_ms": l50,
            "floor_ms": f50,
            "floor_aa_ms": _p50(floor_aa_ms),
            "floor_ratio_ci": paired_ratio_ci(opt, floor_ms),
            "aa_ratio": _ratio(_p50(floor_aa_ms), f50),
            "aa_ratio_ci": paired_ratio_ci(floor_aa_ms, floor_ms),
            "baseline_p90_ms": float(np.percentile(base, 90)),
            "optimized_p90_ms": float(np.percentile(opt, 90)),
            "lazy_p90_ms": float(np.percentile(lazy, 90)),
            "floor_p90_ms": float(np.percentile(floor_ms, 90)),
            "speedup": _ratio(b50, o50), "floor_ratio": _ratio(o50, f50),
            "lazy_floor_ratio": _ratio(l50, f50), "keys": keys}


def _run_fixed_k(instances: dict[int, Any], cfg: SetStateABConfig,
                 rng: np.random.Generator) -> dict[str, Any]:
    """Optimized (eager) ``set_state`` of ``fixed_k`` rows on every instance, round-robin."""
    sizes = sorted(instances)
    shipped = {n: be.lazy_kinematics for n, be in instances.items()}
    for be in instances.values():
        be.lazy_kinematics = False
    inputs = {n: [make_inputs(instances[n], cfg.fixed_k, rng) for _ in range(cfg.pool)]
              for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    idle_ns = int(cfg.idle_us * 1e3)
    for i in range(cfg.warmup + cfg.calls):
        for n in rng.permutation(sizes):
            _busy(idle_ns)
            out = instances[int(n)].set_state(*inputs[int(n)][i % cfg.pool])
            if i >= cfg.warmup:
                assert out is not None
                times[int(n)].append(sum(out["timing"].values()))
    for n, be in instances.items():
        be.lazy_kinematics = shipped[n]
    p50 = [_p50(times[n]) for n in sizes]
    return {"k": cfg.fixed_k, "num_envs": sizes, "optimized_ms": p50,
            "ratio": _ratio(p50[-1], p50[0])}


def run_set_state_ab(cfg: SetStateABConfig, progress: Callable[[str], None] | None = None
                     ) -> dict[str, Any]:
    say = progress or (lambda _m: None)
    rng = np.random.default_rng(cfg.seed)
    cells: list[dict[str, Any]] = []
    fixed: list[dict[str, Any]] = []
    for name in cfg.backends:
        instances: dict[int, Any] = {}
        try:
            for n in sorted(set(cfg.num_envs)):
                say(f"{name}: building {n} envs")
                instances[n] = be = _make_backend(name, n, cfg)
                for ratio in cfg.ratios:
                    k = max(1, round(ratio * n))
                    cell = _run_cell(be, k, cfg, rng)
                    cells.append({"backend": name, "num_envs": n, "ratio": ratio, "k": k}
                                 | cell)
                    say(f"{name} {n} envs, k={k}: baseline {cell['baseline_ms']:.3f} ms, "
                        f"optimized {cell['optimized_ms']:.3f} ms, floor "
                        f"{cell['floor_ms']:.3f} ms ({cell['calls']} calls)")
            if cfg.fixed_k:
                fixed.append({"backend": name} | _run_fixed_k(instances, cfg, rng))
        finally:
            for be in instances.values():
                be.close()
    return {"config": asdict(cfg) | {"cpus": os.cpu_count()},
            "cells": cells, "fixed_k": fixed}


# -- rendering ---------------------------------------------------------------------------------
def _x(v: float | None) -> float:
    return float("nan") if v is None else v


def _interval(ci: list[float] | None) -> str:
    return "n/a" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def render_set_state_ab(result: dict[str, Any], per_key: bool = True) -> str:
    out: list[str] = []
    by_backend: dict[str, list[dict[str, Any]]] = {}
    for c in result["cells"]:
        by_backend.setdefault(c["backend"], []).append(c)
    for name, cells in by_backend.items():
        rows = [[c["num_envs"], f"{100 * c['ratio']:g}%", c["k"], c["baseline_ms"],
                 c["optimized_ms"], c["lazy_ms"], c["floor_ms"], _x(c["speedup"]),
                 _x(c["floor_ratio"]), _interval(c.get("floor_ratio_ci")),
                 _x(c.get("aa_ratio")), _interval(c.get("aa_ratio_ci")),
                 _x(c["lazy_floor_ratio"])]
                for c in cells]
        out.append(format_table(
            f"set_state A/B, {name}: p50 ms of the set_state span (floor: engine calls only; "
            "optimized: eager kinematics; lazy: as shipped; A/A: the floor timed twice, "
            "its twin's p50 over its own; 95% paired bootstrap intervals)",
            ["envs", "ratio", "k", "baseline", "optimized", "lazy", "floor", "speedup",
             "opt/floor", "95% CI", "A/A", "A/A 95% CI", "lazy/floor"], rows))
        out.append("")
        if per_key:
            for c in cells:
                krows = [[key, v["baseline_ms"], v["optimized_ms"], v["lazy_ms"],
                          _x(v["speedup"])]
                         for key, v in c["keys"].items()
                         if v["baseline_ms"] > 0.0 or v["optimized_ms"] > 0.0]
                out.append(format_table(
                    f"{name} {c['num_envs']} envs, k={c['k']}: per-key p50 ms "
                    f"(set_state speedup {_x(c['speedup']):.2f}x)",
                    ["key", "baseline", "optimized", "lazy", "speedup"], krows))
                out.append("")
    for f in result.get("fixed_k", []):
        sizes = ", ".join(f"{n} envs {ms:.3f} ms"
                          for n, ms in zip(f["num_envs"], f["optimized_ms"], strict=True))
        out.append(f"fixed k={f['k']}, {f['backend']}: optimized p50 {sizes}; "
                   f"largest/smallest N ratio {_x(f['ratio']):.3f}")
    return "\n".join(out).rstrip()
