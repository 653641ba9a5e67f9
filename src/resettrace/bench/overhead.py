"""``resettrace bench overhead``: what tracing costs on the reset hot path.

One env serves every tracing mode (``off``, ``timing``, ``trace`` with a span
file, ``otlp``: every reset exported over OTLP/gRPC to a real receiver on
127.0.0.1): its recorder is swapped before each call, so the modes share one
memory layout. Each round visits the modes in a fresh random order and runs ``calls``
iterations of the training pattern in each: one physics substep (untimed; it
releases the GIL, as training does), then ``reset_done`` of a random ``ratio``
share of envs, timed from outside with ``perf_counter_ns``. Medians per mode and
the ratios timing/off and trace/off are measured in one run, so machine noise hits
every mode alike.

``noop_share``: the measured cost of one no-op scope, times the scopes of one
reset, as a share of the median ``reset_done`` with tracing off.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from resettrace import catalog as C
from resettrace.bench.collector import render_export
from resettrace.config import Config
from resettrace.sim.contract import MAX_ENVS
from resettrace.tables import format_table
from resettrace.testing.receivers import ReceiverProcess
from resettrace.tracing.recorder import NOOP_RECORDER

__all__ = ["OverheadConfig", "run_overhead", "render_overhead", "noop_scope_cost_ns"]

MODES = ("off", "off_aa", "timing", "trace", "otlp")
RATIO_MODES = ("off_aa", "timing", "trace", "otlp")


@dataclass(frozen=True, kw_only=True)
class OverheadConfig:
    task: str = "g1_walk_flat"
    backend: str = "mujoco"
    num_envs: int = 1024
    ratio: float = 0.05
    rounds: int = 100
    calls: int = 3
    warmup: int = 5
    repeats: int = 5
    model: str | None = None
    nthread: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"--ratio must be in (0, 1], got {self.ratio}")
        if self.num_envs < 1 or self.rounds < 1 or self.calls < 1 or self.warmup < 0:
            raise ValueError("--num-envs, --rounds and --calls must be >= 1, --warmup >= 0")
        if self.num_envs > MAX_ENVS:
            raise ValueError(f"--num-envs must be at most {MAX_ENVS}, got {self.num_envs}")
        if not 1 <= self.repeats <= self.rounds:
            raise ValueError(f"--repeats must be in [1, --rounds], got {self.repeats}")


def noop_scope_cost_ns(n: int = 200_000) -> float:
    """Median over 5 repeats of the cost of one ``with NOOP_RECORDER.scope(...)``."""
    rec, phase = NOOP_RECORDER, C.SET_STATE_MASK
    costs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            with rec.scope(phase):
                pass
        t1 = time.perf_counter_ns()
        for _ in range(n):
            pass
        t2 = time.perf_counter_ns()
        costs.append(((t1 - t0) - (t2 - t1)) / n)
    return statistics.median(costs)


def traced_call_cost_ns(n: int = 100_000) -> dict[str, float]:
    """Median over 5 repeats of what ``@traced`` adds to one call, warm (ns).

    ``on``: calls nested in an open trace of a recorder without sinks, so this is the
    training thread's own work (traces are aggregated on a background thread, whose
    cost the ``timing`` mode of this benchmark includes); ``off``: tracing off.
    """
    import resettrace
    from resettrace.tracing.recorder import Recorder
    from resettrace.tracing.session import Tracing

    def plain(ids: list[int]) -> int:
        return 0

    wrapped = resettrace.traced(C.DR_RESET_PAYLOAD_FILTER, count="ids")(plain)
    ids = [1, 2, 3]
    batch = 100
    scope_rec = Recorder(())
    phase = C.DR_RESET_PAYLOAD_FILTER

    def scoped(ids: list[int]) -> int:  # what a hand-written scope costs, for comparison
        with scope_rec.scope(phase, 3):
            return 0

    def added_ns(rec: Any, fn: Callable[[list[int]], int]) -> float:
        """Median over 5 repeats (after one warm-up) of fn's cost over ``plain``'s."""
        costs = []
        for _ in range(6):
            spent = []
            for f in (fn, plain):
                t0 = time.perf_counter_ns()
                for _ in range(n // batch):
                    with rec.scope(C.ENV_STEP):  # calls nested in an open trace
                        for _ in range(batch):
                            f(ids)
                spent.append(time.perf_counter_ns() - t0)
            costs.append((spent[0] - spent[1]) / (n // batch * batch))
        return statistics.median(costs[1:])

    out = {"scope": added_ns(scope_rec, scoped)}
    for mode in ("on", "off"):
        rec: Any = Recorder(()) if mode == "on" else NOOP_RECORDER
        # off: nothing bound and the default session off, as in training with RESETTRACE=off
        bound = resettrace.bind(rec) if mode == "on" else contextlib.nullcontext()
        with resettrace.use_tracing(Tracing(Config(mode="off"))), bound:
            out[mode] = added_ns(rec, wrapped)
    return out


def _reset_trace(rec: Any) -> None:
    """One reset trace of the shipped path's shape (17 records): ``reset_done`` and its
    stages, ``dr_reset`` and its stages, ``set_state`` with its phases as laps, its timing
    dict read."""
    with rec.scope(C.RESET_DONE, 3):
        with rec.scope(C.RESET_DONE_TERMINAL_OBS):
            pass
        with rec.scope(C.RESET_DONE_RESET_CALL):
            with rec.scope(C.DR_RESET, 3):
                with rec.scope(C.DR_RESET_PLAN):
                    pass
                with rec.scope(C.DR_RESET_PAYLOAD_FILTER):
                    pass
                with rec.scope(C.SET_STATE, 3, C.SET_STATE_QPOS_CONVERT) as outer:
                    outer.lap(C.SET_STATE_DATA_RESET)
                    outer.lap(C.SET_STATE_SET_DOF_VEL)
                    outer.lap(C.SET_STATE_SET_DOF_POS)
                    outer.lap(C.SET_STATE_ACTUATOR_CTRL)
                    outer.lap(C.SET_STATE_FORWARD_KINEMATIC)
                    outer.lap(C.SET_STATE_REFRESH_POSE_CACHE)
                outer.timing()
                with rec.scope(C.DR_RESET_BUILD_OBSERVATION):
                    pass
        with rec.scope(C.RESET_DONE_OBS_SCATTER):
            pass
        with rec.scope(C.RESET_DONE_INFO_SCATTER):
            pass


def trace_cpu_us(n: int = 20_000) -> dict[str, float]:
    """CPU (every thread's, ``time.process_time``) per reset trace of :func:`_reset_trace`,
    warm, best of 3: ``off`` the same code with tracing off (:data:`NOOP_RECORDER`: the
    code's own ``with`` statements and calls), ``recorded`` by a recorder with no sink,
    ``aggregated`` recorded by one whose sink is an
    :class:`~resettrace.tracing.aggregate.Aggregator`, its queue aggregated at the end,
    ``aggregated_full`` the same with reservoirs of a tenth of the traces (a long run:
    ten times ``max_samples`` resets, most of them past it, where each fold draws which
    values to keep);
    ``records`` per trace. What tracing adds is the difference with ``off``."""
    from resettrace.tracing.aggregate import Aggregator
    from resettrace.tracing.recorder import Recorder

    def per_trace(sink: bool | None, samples: int = 100_000) -> float:
        agg = Aggregator(max_pending=n + 1, max_samples=samples)
        rec = NOOP_RECORDER if sink is None else Recorder([agg] if sink else [])
        t0 = time.process_time()
        for _ in range(n):
            _reset_trace(rec)
        agg.stats()  # what the aggregation thread has not done yet
        spent = time.process_time() - t0
        agg.shutdown()
        return spent / n * 1e6

    rec = Recorder([])
    _reset_trace(rec)
    out = {"records": float(len(rec._last))}
    for name, sink, samples in (("off", None, n), ("recorded", False, n),
                                ("aggregated", True, n),
                                ("aggregated_full", True, n // 10)):
        per_trace(sink, samples)  # warm-up
        out[name] = min(per_trace(sink, samples) for _ in range(3))
    return out


def aggregation_cpu_us(n: int = 40_960, chunk: int = 1_024) -> dict[str, float]:
    """Recording and aggregation apart, per reset trace of :func:`_reset_trace`, as a
    training run's two threads share them: the training thread's CPU
    (``time.thread_time``) to run the trace with tracing off, recorded with no sink, and
    recorded and queued for an :class:`~resettrace.tracing.aggregate.Aggregator`
    (``hand_off``: queued less recorded); then the aggregation's CPU, its drain and folds
    of each ``chunk`` of queued traces taken as its thread takes them, run here on the
    calling thread so nothing else shares the count: ``aggregation`` while the reservoirs
    fill (``max_samples`` above the traces: every value kept, the first touch of its
    memory included), ``aggregation_full`` past them (a long run). Each a best of 3; the
    three modes interleaved chunk by chunk, so each runs as cold as the others."""
    from resettrace.tracing.aggregate import Aggregator
    from resettrace.tracing.recorder import Recorder

    def once(samples: int) -> list[float]:
        agg = Aggregator(max_pending=n + 1, max_samples=samples)
        agg._start_worker = lambda: None  # type: ignore[method-assign]  # (drained below)
        queued, bare = Recorder([agg]), Recorder([])
        spent = [0.0] * 4  # off, recorded, queued, aggregation
        clock = time.thread_time
        for _ in range(n // chunk):
            for j, rec in enumerate((NOOP_RECORDER, bare, queued)):
                t0 = clock()
                for _ in range(chunk):
                    _reset_trace(rec)
                spent[j] += clock() - t0
            t0 = clock()
            agg._drain()  # (the thread's turn: folds at the same marks)
            spent[3] += clock() - t0
        t0 = clock()
        agg.force_flush()  # (what the last fold left buffered)
        spent[3] += clock() - t0
        agg.shutdown()
        return [x / (n // chunk * chunk) * 1e6 for x in spent]

    out: dict[str, float] = {}
    for name, samples in (("aggregation", 10 * n), ("aggregation_full", n // 20)):
        once(samples)  # warm-up
        runs = [once(samples) for _ in range(3)]
        out[name] = min(r[3] for r in runs)
        if name == "aggregation":
            best = min(runs, key=lambda r: r[1] + r[2])
            out["recording"] = best[1] - best[0]
            out["hand_off"] = best[2] - best[1]
    return out


def run_overhead(cfg: OverheadConfig, progress: Callable[[str], None] | None = None
                 ) -> dict[str, Any]:
    import resettrace
    from resettrace.tracing.session import Tracing

    say = progress or (lambda _m: None)
    k = max(1, round(cfg.ratio * cfg.num_envs))
    options: dict[str, Any] = {} if cfg.nthread is None else {"nthread": cfg.nthread}
    with tempfile.TemporaryDirectory(prefix="resettrace-overhead-") as tmp, \
            ReceiverProcess() as receiver:
        sessions = {
            "off": Tracing(Config(mode="off")),
            "off_aa": Tracing(Config(mode="off")),
            "timing": Tracing(Config(mode="timing")),
            "trace": Tracing(Config(mode="trace",
                                    exporters=(f"file:{Path(tmp) / 'spans.jsonl'}",))),
            # every reset exported over OTLP/gRPC to a real receiver process on 127.0.0.1
            "otlp": Tracing(Config(mode="trace", exporters=("otlp",),
                                   otlp_endpoint=receiver.endpoint)),
        }
        # one env for every mode, its recorder swapped per call: no instance-placement bias
        env = resettrace.make_env(cfg.task, backend=cfg.backend, num_envs=cfg.num_envs,
                                  model=cfg.model, seed=cfg.seed, tracing=sessions["off"],
                                  **options)
        recorders = {m: sessions[m].recorder(backend=cfg.backend, task=cfg.task,
                                             env_count=cfg.num_envs) for m in MODES}
        rng = np.random.default_rng(cfg.seed)
        times: dict[str, list[int]] = {m: [] for m in MODES}
        group: list[int] = []  # the repeat each timed call belongs to, per mode in order
        per = cfg.rounds / cfg.repeats
        mask = np.zeros(cfg.num_envs, dtype=bool)

        def one(mode: str, record: bool) -> None:
            env.use_recorder(recorders[mode])
            env.backend.step(env.ctrl, 1)
            mask[:] = False
            mask[rng.choice(cfg.num_envs, k, replace=False)] = True
            t0 = time.perf_counter_ns()
            env.reset_done(mask)
            t1 = time.perf_counter_ns()
            if record:
                times[mode].append(t1 - t0)

        for m in MODES:
            for _ in range(cfg.warmup):
                one(m, False)
        for r in range(cfg.rounds):
            group.append(min(cfg.repeats - 1, int(r / per)))
            for m in rng.permutation(MODES):
                for _ in range(cfg.calls):
                    one(str(m), True)
            if (r + 1) % max(1, cfg.rounds // 5) == 0 or r + 1 == cfg.rounds:
                say(f"round {r + 1}/{cfg.rounds}")
        scopes = _scopes_per_reset(sessions["timing"])
        env.close()
        for m in MODES:
            sessions[m].shutdown()
        export = {m: sessions[m].export_report() for m in ("trace", "otlp")}
        export["otlp"]["received_by_receiver"] = receiver.stop()
    p50 = {m: statistics.median(times[m]) / 1e6 for m in MODES}
    reps: dict[str, list[float]] = {m: [] for m in RATIO_MODES}
    for g in range(cfg.repeats):
        rounds = [r for r, gr in enumerate(group) if gr == g]
        lo, hi = rounds[0] * cfg.calls, (rounds[-1] + 1) * cfg.calls
        base = statistics.median(times["off"][lo:hi])
        for m in RATIO_MODES:
            reps[m].append(statistics.median(times[m][lo:hi]) / base)
    noop_ns = noop_scope_cost_ns()
    traced = traced_call_cost_ns()
    trace_cpu = trace_cpu_us() | aggregation_cpu_us()
    return {
        "config": asdict(cfg) | {"k": k},
        "modes": {m: {"reset_done_p50_ms": p50[m],
                      "reset_done_p90_ms": float(np.percentile(times[m], 90)) / 1e6,
                      "calls": len(times[m])} for m in MODES},
        "ratios": {f"{m}_vs_off": statistics.median(reps[m]) for m in RATIO_MODES},
        "repeats": {f"{m}_vs_off": reps[m] for m in RATIO_MODES},
        "aa_spread": max(abs(x - 1.0) for x in reps["off_aa"]),
        "traced_ns": traced,
        "trace_cpu_us": trace_cpu,
        "noop_scope_ns": noop_ns,
        "scopes_per_reset": scopes,
        "noop_share": noop_ns * scopes / (p50["off"] * 1e6),
        "export": export,
    }


def _render_trace_cpu(cpu: dict[str, float]) -> str:
    text = (f"a {cpu['records']:.0f}-record reset trace, warm, CPU of every thread: "
            f"{cpu['recorded']:.2f} us recorded, {cpu['aggregated']:.2f} us recorded and "
            "aggregated")
    if "off" in cpu:  # (results of before the figure)
        text += (f"; the same code with tracing off {cpu['off']:.2f} us: tracing adds "
                 f"{cpu['recorded'] - cpu['off']:.2f} us recorded, "
                 f"{cpu['aggregated'] - cpu['off']:.2f} us recorded and aggregated")
    if "aggregated_full" in cpu:  # (results of before the figure)
        text += (f"; {cpu['aggregated_full']:.2f} us recorded and aggregated in a long "
                 "run (10x max_samples traces)")
    if "aggregation" in cpu:  # (results of before the figure)
        text += (f"\napart, each thread's CPU: recording {cpu['recording']:.2f} us and "
                 f"hand-off {cpu['hand_off']:.2f} us on the training thread; aggregation "
                 f"{cpu['aggregation']:.2f} us while the reservoirs fill, "
                 f"{cpu['aggregation_full']:.2f} us past them")
    return text


def _scopes_per_reset(session: Any) -> int:
    """Scopes per reset_done: every trace of this benchmark is one reset_done."""
    proc = session.aggregator
    proc.force_flush()
    return round(proc.records_seen / max(1, proc.traces_seen))


def render_overhead(result: dict[str, Any]) -> str:
    cfg = result["config"]
    off = result["modes"]["off"]["reset_done_p50_ms"]
    rows = [[m, v["reset_done_p50_ms"], v["reset_done_p90_ms"],
             v["reset_done_p50_ms"] / off, v["calls"]] for m, v in result["modes"].items()]
    table = format_table(
        f"reset_done with tracing off / timing / trace / otlp: {cfg['num_envs']} envs, "
        f"k={cfg['k']} ({100 * cfg['ratio']:.0f}%) per call, {cfg['backend']}",
        ["mode", "p50 ms", "p90 ms", "vs off", "calls"], rows)
    r, reps = result["ratios"], result["repeats"]
    ratio_rows = [[name, r[name], min(reps[name]), max(reps[name]), len(reps[name])]
                  for name in r]
    lines = [table, "", format_table(
        f"ratios: median of {cfg['repeats']} interleaved repeats (p50 of the mode / p50 of "
        "off in each)", ["ratio", "median", "min", "max", "repeats"], ratio_rows),
             f"A/A spread (largest |off_aa/off - 1| over the repeats): "
             f"{100 * result['aa_spread']:.1f}%",
             f"@traced adds {result['traced_ns']['on']:.0f} ns per call warm with tracing on, "
             f"{result['traced_ns']['off']:.0f} ns with tracing off (a recorded scope written "
             f"by hand: {result['traced_ns']['scope']:.0f} ns)",
             _render_trace_cpu(result["trace_cpu_us"]),
             f"noop scope {result['noop_scope_ns']:.0f} ns x {result['scopes_per_reset']} "
             f"scopes = {100 * result['noop_share']:.3f}% of reset_done (off)"]
    for mode, exp in result["export"].items():
        lines.append(f"{mode} export: {render_export(exp)}")
    return "\n".join(lines)
