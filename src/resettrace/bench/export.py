"""``resettrace bench export``: what span export costs training, per export design.

One env is stepped under every candidate in turn (its recorder swapped, as in ``bench
overhead``), ``steps`` env steps per candidate per round, for ``rounds`` rounds in a
fresh random order each time, so machine noise hits every candidate alike. A round ends
with its candidate's ``force_flush``, timed with it: the export work of its spans (up to
a second or two behind them, in the export process) lands in its own round and not in
the next candidate's. That flush waits a round trip (a few ms; ``timing``'s waits for its
aggregation thread): keep rounds long (1,000 steps of 64 envs take ~4 s) so that this wait,
charged to the candidate, stays small. The candidates:

``timing``
    aggregation only, no export: the reference;
``child-wire``
    the export child encoding OTLP protobuf straight from the packed records (shipped);
``child-sdk``
    the export child building SDK spans and encoding them with the SDK's exporter
    (``RESETTRACE_SPAN_ENCODER=sdk``);
``child-FORMAT`` and ``child-FORMAT-sdk``
    the export child writing the file format (``file``, ``perfetto``, ``otlp-json``,
    ``jaeger-json``) into a temporary folder, from the records (shipped) and from SDK
    spans (``--candidates``: the default runs ``child-file`` and ``child-file-sdk``);
``in-process``
    an SDK ``BatchSpanProcessor`` with the OTLP exporter in the training process (spans
    built there by resettrace's materialiser thread).

Every exporting candidate sends OTLP/gRPC to its own receiver process on 127.0.0.1 that
only counts spans, at nice 10 like the export process (its CPU is charged to the candidate:
conservative, as a collector elsewhere takes none from training).
Reported per candidate: env/s, slowdown against ``timing`` (``timing``'s env/s over the
candidate's: its total time over ``timing``'s, with a 95% paired bootstrap interval over
rounds), the median of the per-round ratios (with its interval and range: robust to a
burst of host steal in one round, which the total is not); ``timing_aa``, a second
``timing`` candidate, is the A/A noise of both; the training process's own CPU time (all
its threads) over ``timing``'s, what export adds inside it (steal is not CPU time); spans
produced, delivered and counted by the receiver, and, for the export children, their CPU
time per span in the steady state (from ``/proc``, after start-up and warm-up).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from resettrace.bench._stats import paired_ratio_ci
from resettrace.config import Config
from resettrace.sim.contract import MAX_ENVS
from resettrace.tables import format_table
from resettrace.testing.receivers import ReceiverProcess

__all__ = ["ExportBenchConfig", "run_export_bench", "render_export_bench"]

#: the file formats, each a candidate ``child-FORMAT`` (written from the records) and
#: ``child-FORMAT-sdk`` (from SDK spans)
FILE_FORMATS = ("file", "perfetto", "otlp-json", "jaeger-json")
CANDIDATES = ("timing", "timing_aa", "child-wire", "child-sdk", "in-process",
              *(f"child-{f}{v}" for f in FILE_FORMATS for v in ("", "-sdk")))
EXPORTING = CANDIDATES[2:]
#: run when ``--candidates`` is not given
DEFAULT_CANDIDATES = ("child-wire", "child-sdk", "in-process", "child-file", "child-file-sdk")


@dataclass(frozen=True, kw_only=True)
class ExportBenchConfig:
    task: str = "g1_walk_flat"
    backend: str = "mujoco"
    num_envs: int = 64
    rounds: int = 10
    steps: int = 1000
    warmup: int = 20
    model: str | None = None
    nthread: int | None = None
    seed: int = 0
    #: the exporting candidates run (``timing`` and ``timing_aa`` always run)
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES

    def __post_init__(self) -> None:
        if self.num_envs < 1 or self.rounds < 1 or self.steps < 1 or self.warmup < 0:
            raise ValueError("--num-envs, --rounds and --steps must be >= 1, --warmup >= 0")
        if self.num_envs > MAX_ENVS:
            raise ValueError(f"--num-envs must be at most {MAX_ENVS}, got {self.num_envs}")
        unknown = [c for c in self.candidates if c not in EXPORTING]
        if unknown or not self.candidates:
            raise ValueError(f"--candidates takes one or more of {', '.join(EXPORTING)}"
                             + (f"; got {', '.join(unknown)}" if unknown else ""))

    @property
    def run(self) -> tuple[str, ...]:
        return tuple(c for c in CANDIDATES
                     if c.startswith("timing") or c in self.candidates)


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _child_cpu(session: Any) -> float | None:
    proc = session.process
    pid = None if proc is None else proc.pid
    return None if pid is None else _cpu_s(pid)


def _sent(session: Any) -> int:
    return session.process.sent_spans if session.process is not None else 0


def _exporter(name: str, folder: str) -> str:
    """The exporter spec of a ``child-...`` candidate."""
    fmt = name.removeprefix("child-").removesuffix("-sdk")
    return "otlp" if fmt in ("wire", "sdk") else f"{fmt}:{folder}/{name}.out"


def _session(name: str, endpoint: str | None, folder: str) -> Any:
    from resettrace.tracing.session import Tracing

    if name.startswith("timing"):
        return Tracing(Config(mode="timing"))
    if name == "in-process":
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from resettrace.tracing.export.exporters import make_otlp_exporter

        cfg = Config(mode="trace", otlp_endpoint=endpoint)
        provider = TracerProvider(resource=Resource.create({"service.name": "resettrace"}))
        provider.add_span_processor(BatchSpanProcessor(make_otlp_exporter(cfg)))
        session = Tracing(Config(mode="trace", queue_size=100_000), tracer_provider=provider)
        session._bench_provider = provider  # type: ignore[attr-defined]  # ours to shut down
        return session
    return Tracing(Config(mode="trace", exporters=(_exporter(name, folder),),
                          otlp_endpoint=endpoint,
                          span_encoder="sdk" if name.endswith("sdk") else "records"))


def run_export_bench(cfg: ExportBenchConfig, progress: Callable[[str], None] | None = None
                     ) -> dict[str, Any]:
    import resettrace

    say = progress or (lambda _m: None)
    run = cfg.run
    exporting = [c for c in run if not c.startswith("timing")]
    receivers = {c: ReceiverProcess(count_only=True) for c in exporting
                 if c == "in-process" or _exporter(c, "") == "otlp"}
    folder = tempfile.TemporaryDirectory(prefix="resettrace-bench-export-")
    try:
        sessions = {c: _session(c, receivers[c].endpoint if c in receivers else None,
                                folder.name) for c in run}
        options: dict[str, Any] = {} if cfg.nthread is None else {"nthread": cfg.nthread}
        env = resettrace.make_env(cfg.task, backend=cfg.backend, num_envs=cfg.num_envs,
                                  model=cfg.model, seed=cfg.seed, tracing=sessions["timing"],
                                  **options)
        recorders = {c: sessions[c].recorder(backend=cfg.backend, task=cfg.task,
                                             env_count=cfg.num_envs) for c in run}
        rng = np.random.default_rng(cfg.seed)
        shape = (cfg.num_envs, env.action_dim)
        for c in run:
            env.use_recorder(recorders[c])
            for _ in range(cfg.warmup):
                env.step(rng.normal(0.0, 1.0, shape))
        # the children's CPU after start-up and warm-up: what follows is the steady state
        cpu0: dict[str, tuple[float | None, int]] = {}
        for c in run:
            sessions[c].force_flush(30.0)
            cpu0[c] = (_child_cpu(sessions[c]), _sent(sessions[c]))
        rx0 = {c: _cpu_s(rx.pid) for c, rx in receivers.items()}
        spent: dict[str, list[float]] = {c: [] for c in run}
        flushed: dict[str, list[float]] = {c: [] for c in run}
        own_cpu: dict[str, list[float]] = {c: [] for c in run}  # this process's, all threads
        for r in range(cfg.rounds):
            for c in rng.permutation(run):
                env.use_recorder(recorders[str(c)])
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(cfg.steps):
                    env.step(rng.normal(0.0, 1.0, shape))
                t1 = time.perf_counter()
                sessions[str(c)].force_flush(30.0)  # its spans' export work is its own
                t2, c2 = time.perf_counter(), time.process_time()
                spent[str(c)].append(t2 - t0)
                flushed[str(c)].append(t2 - t1)
                own_cpu[str(c)].append(c2 - c0)
            if (r + 1) % max(1, cfg.rounds // 5) == 0 or r + 1 == cfg.rounds:
                say(f"round {r + 1}/{cfg.rounds}")
        env.close()
        out: dict[str, Any] = {}
        for c in run:
            s = sessions[c]
            s.force_flush(30.0)
            cpu = _child_cpu(s)
            start_cpu, start_sent = cpu0[c]
            steady = None if cpu is None or start_cpu is None else (
                cpu - start_cpu, _sent(s) - start_sent)
            provider = getattr(s, "_bench_provider", None)
            if provider is not None:
                s.force_flush(30.0)
                provider.force_flush(30_000)
            s.shutdown(30.0)
            if provider is not None:
                provider.shutdown()
            report = s.export_report()
            produced = (report.get("spans_sent", 0) + report["spans_dropped"]
                        + report.get("spans_built", 0)) if c in exporting else 0
            out[c] = {"report": report, "steady": steady, "produced": produced}
        for c, rx in receivers.items():
            cpu, start = _cpu_s(rx.pid), rx0[c]
            sent = out[c]["steady"][1] if out[c]["steady"] else 0
            out[c]["receiver_cpu_us_per_span"] = (
                None if cpu is None or start is None or not sent else 1e6 * (cpu - start) / sent)
            out[c]["received"] = rx.stop()
    finally:
        for rx in receivers.values():
            rx.__exit__()
        folder.cleanup()
    base = spent["timing"]
    steps = cfg.rounds * cfg.steps
    rows = {}
    for c in run:
        ratios = [t / b for t, b in zip(spent[c], base, strict=True)]
        info = out[c]
        delivered = timed_out = None  # in-process: the SDK's BatchSpanProcessor counts nothing
        dropped = info["report"].get("spans_dropped") if c in exporting else None
        if c in exporting and c != "in-process":
            (sink,) = info["report"]["exporters"].values()
            delivered = sink["delivered"]
            timed_out = sink["timed_out"]
        produced = info["produced"]
        steady = info["steady"]
        rows[c] = {
            "env_per_s": cfg.num_envs * steps / sum(spent[c]),
            # timing's env/s over this candidate's: total time over timing's total
            "slowdown": sum(spent[c]) / sum(base),
            "slowdown_ci95": _total_ci(spent[c], base),
            "round_median": statistics.median(ratios),
            "round_median_ci95": _median_ci(ratios),
            "slowdown_min": min(ratios), "slowdown_max": max(ratios),
            "round_s": list(spent[c]), "flush_s": list(flushed[c]),
            # the training process's own CPU (all its threads) over timing's: what export
            # adds inside it, apart from the export and receiver processes (host steal,
            # which inflates wall time, is not CPU time)
            "train_cpu_s": list(own_cpu[c]),
            "train_cpu_ratio": sum(own_cpu[c]) / sum(own_cpu["timing"]),
            "train_cpu_ratio_ci95": _total_ci(own_cpu[c], own_cpu["timing"]),
            # the round-end flush, timed with the round: the share of a round it takes
            "flush_ms": 1e3 * statistics.median(flushed[c]),
            "flush_share": statistics.median(f / t for f, t in zip(flushed[c], spent[c],
                                                                    strict=True)),
            "spans_produced": produced, "spans_dropped": dropped,
            "spans_delivered": delivered, "spans_timed_out": timed_out,
            "spans_received": info.get("received"),
            "child_cpu_us_per_span": None if steady is None or not steady[1]
            else 1e6 * steady[0] / steady[1],
            # the counting receiver's, on these same cores (a collector elsewhere costs none)
            "receiver_cpu_us_per_span": info.get("receiver_cpu_us_per_span"),
        }
    return {"config": asdict(cfg), "candidates": rows}


def _total_ci(spent: list[float], base: list[float]) -> list[float] | None:
    """95% paired bootstrap interval (percentile; rounds resampled with both candidates'
    times of each) of ``sum(spent) / sum(base)``. None below 3 rounds."""
    if spent == base:
        return [1.0, 1.0]
    return paired_ratio_ci(spent, base, np.sum)


def _median_ci(ratios: list[float]) -> list[float] | None:
    """95% bootstrap interval (percentile) of the median per-round ratio (``round p50``;
    ``timing_aa``'s shows the A/A spread).
    None below 3 rounds."""
    if len(set(ratios)) == 1:
        return [ratios[0], ratios[0]]
    if len(ratios) < 3:
        return None
    from scipy import stats

    res = stats.bootstrap((np.asarray(ratios),), np.median, confidence_level=0.95,
                          method="percentile", n_resamples=2000, random_state=0)
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def render_export_bench(result: dict[str, Any]) -> str:
    cfg = result["config"]

    def num(v: Any) -> Any:
        return float("nan") if v is None else v

    def ci(v: list[float] | None) -> str:
        return "-" if v is None else "{:.3f}-{:.3f}".format(*v)

    rows = [[c, r["env_per_s"], r["slowdown"], ci(r["slowdown_ci95"]), r["round_median"],
             ci(r["round_median_ci95"]), r["slowdown_min"], r["slowdown_max"],
             r["train_cpu_ratio"], ci(r["train_cpu_ratio_ci95"]), r["flush_ms"],
             100 * r["flush_share"],
             num(r["spans_produced"]), num(r["spans_dropped"]), num(r["spans_delivered"]),
             num(r["spans_timed_out"]), num(r["spans_received"]),
             num(r["child_cpu_us_per_span"]), num(r["receiver_cpu_us_per_span"])]
            for c, r in result["candidates"].items()]
    return format_table(
        f"span export: {cfg['num_envs']} envs, {cfg['rounds']} rounds x {cfg['steps']} steps "
        f"per candidate, interleaved; slowdown = timing's env/s / the candidate's (95% CI: "
        f"paired bootstrap over rounds); round p50 = median per-round time ratio; train CPU = "
        f"this process's CPU time over timing's",
        ["candidate", "env/s", "slowdown", "95% CI", "round p50", "95% CI", "min", "max",
         "train CPU", "95% CI",
         "flush ms", "flush %", "produced", "dropped",
         "delivered", "timed out", "received", "child us/span", "receiver us/span"], rows)
