"""``resettrace bench collector``: where the time of a batched env step goes.

Steps ``num_envs`` envs of a task with noisy actions (realistic terminations, a
few % of envs per step), discards ``warmup`` steps, then times ``steps`` steps
with every phase recorded. Prints env/s and the breakdown tables; writes
``timing.json``, ``timing.csv`` and, when spans are exported, ``spans.jsonl``.

With ``numba_ab`` (``--numba-ab``) it steps two envs built alike (same seed, same task
options but ``use_numba``) with the same actions, one step each in turn, the order swapped
every step so that neither variant always runs on the caches the other left; each env has
its own timing session. The breakdown tables are then the numpy variant's, followed by the
A/B table (env/s, env step and update_state p50/mean, numba's speedup) and
``result["numba_ab"]``. The kernel is compiled when the numba env is built, before any
timed step, and tracing is ``timing`` only: exporting spans would load the variants
differently.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from resettrace import catalog as C
from resettrace.config import Config
from resettrace.record import record_of_session
from resettrace.sim.contract import MAX_ENVS
from resettrace.tables import exporter_outcome, format_table, write_csv, write_json

log = logging.getLogger(__name__)

__all__ = ["CollectorConfig", "run_collector", "run_numba_ab", "render_report",
           "render_numba_ab"]


@dataclass(frozen=True, kw_only=True)
class CollectorConfig:
    task: str = "g1_walk_flat"
    backend: str = "mujoco"
    num_envs: int = 1024
    warmup: int = 20
    steps: int = 200
    #: output folder for timing.json / timing.csv (None: write nothing)
    out: str | None = None
    #: MJCF path instead of the bundled G1
    model: str | None = None
    seed: int = 0
    #: standard deviation of the random policy's actions
    action_noise: float = 1.0
    #: engine threads (None: all CPUs)
    nthread: int | None = None
    #: run the numpy and the numba update_state side by side (see the module docstring)
    numba_ab: bool = False
    #: per-env domain randomization (friction, mass, kp/kd, geom sizes) drawn at each reset
    randomize: bool = False
    #: control period (s); None: the task's (0.02 s). Substeps = control_dt / the model's
    #: timestep, which must be a whole number
    control_dt: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.num_envs <= MAX_ENVS:
            raise ValueError(f"--num-envs must be between 1 and {MAX_ENVS}, got {self.num_envs}")
        if self.warmup < 0 or self.steps < 1:
            raise ValueError("--warmup must be >= 0 and --steps >= 1")
        if not (self.action_noise >= 0 and math.isfinite(self.action_noise)):
            raise ValueError(f"--action-noise must be a finite number >= 0, got "
                             f"{self.action_noise}")
        if self.control_dt is not None and not (self.control_dt > 0
                                                and math.isfinite(self.control_dt)):
            raise ValueError(f"--control-dt must be a finite number of seconds > 0, got "
                             f"{self.control_dt}")
        if self.out is not None and os.path.exists(self.out) and not os.path.isdir(self.out):
            raise ValueError(f"--out {self.out} is a file, not a folder")

    def task_options(self, **extra: Any) -> dict[str, Any]:
        options = dict(extra)
        if self.control_dt is not None:
            options["control_dt"] = self.control_dt
        return options


def session_config(cfg: CollectorConfig, env_cfg: Config,
                   environ: Mapping[str, str] | None = None) -> Config:
    """The tracing config of a collector run: the environment's (``env_cfg``, read once so
    its warnings are said once), with the run's policy on top. The breakdown needs
    timings, so ``off`` runs as ``timing``; ``--numba-ab`` runs in ``timing`` (exporting
    spans would load the numpy and numba variants differently); ``trace`` with no
    ``RESETTRACE_EXPORTER`` writes the spans beside the run's other outputs; the spans
    carry the run's task, backend and env count. Contradictory settings raise
    ``ValueError``."""
    import dataclasses

    from resettrace.config import ENV_EXPORTER

    env = os.environ if environ is None else environ
    overrides: dict[str, Any] = {}
    if env_cfg.mode == "off":
        overrides["mode"] = "timing"
    if cfg.numba_ab and env_cfg.mode == "trace":
        log.warning("--numba-ab runs in mode 'timing': exporting spans would load the "
                    "numpy and numba variants differently")
        overrides["mode"] = "timing"
    elif env_cfg.mode == "trace" and not env.get(ENV_EXPORTER) and cfg.out:
        overrides["exporters"] = (f"file:{Path(cfg.out) / 'spans.jsonl'}",)
    return dataclasses.replace(env_cfg, **overrides, resource_attributes={
        C.ATTR_TASK: cfg.task, C.ATTR_BACKEND: cfg.backend, C.ATTR_ENV_COUNT: cfg.num_envs})


def planned_outputs(cfg: CollectorConfig, run_cfg: Config, *, report: bool = False
                    ) -> list[tuple[str | Path, Any]]:
    """The files a collector run will write, each with its output kind
    (:mod:`resettrace.outputs`): checked before the work that fills them."""
    from resettrace import outputs
    from resettrace.config import DEFAULT_EXPORTERS
    from resettrace.outputs import expand_path

    files: list[tuple[str | Path, Any]] = []
    if cfg.out:
        out = Path(cfg.out)
        files += [(out / "timing.json", outputs.JSON), (out / "timing.csv", outputs.CSV)]
        files += [(out / "report.html", outputs.REPORT_HTML)] if report else []
    if run_cfg.mode == "trace":  # span files, {pid} and {rank} filled as the export does
        for spec in run_cfg.exporters or DEFAULT_EXPORTERS:
            kind, _, path = spec.partition(":")
            if kind in outputs.SPAN_KINDS:
                files.append((expand_path(path, pid=os.getpid(), rank=run_cfg.worker_rank),
                              outputs.SPAN_KINDS[kind]))
    return files


def simulated_time(env: Any) -> dict[str, Any]:
    """The physics behind one env step: substeps, the engine's timestep, simulated seconds."""
    task = env.task
    dt = float(env.backend.info.physics_dt)
    return {"substeps": int(task.substeps), "physics_dt_s": dt,
            "control_dt_s": float(getattr(task, "control_dt", task.substeps * dt)),
            "sim_s_per_step": task.substeps * dt}


class StopRequest:
    """Set by a signal handler of the caller's: the run stops after the step under way,
    so the steps counted and the steps recorded are the same."""

    def __init__(self) -> None:
        #: the name of the signal that asked, or None
        self.signal: str | None = None

    def handler(self, signum: int, frame: Any) -> None:
        """A signal handler: the first signal asks for the stop, a second one ends the
        process at once (its default action)."""
        signal.signal(signum, signal.SIG_DFL)
        self.signal = signal.Signals(signum).name


def run_collector(cfg: CollectorConfig, tracing: Any,
                  progress: Callable[[str], None] | None = None,
                  stop: StopRequest | None = None) -> dict[str, Any]:
    """Run the benchmark under ``tracing`` (mode ``timing`` or ``trace``); return the result.

    Stopped (``stop`` set by a signal handler, or ``KeyboardInterrupt``), it returns the
    result of the steps done, with ``result["interrupted"] = {"signal", "steps_done"}``.
    """
    import resettrace

    if tracing.processor is None:
        raise ValueError("the collector benchmark needs tracing mode 'timing' or 'trace'")
    if cfg.numba_ab:
        return run_numba_ab(cfg, tracing, progress)
    options: dict[str, Any] = {}
    if cfg.nthread is not None:
        options["nthread"] = cfg.nthread
    env = resettrace.make_env(cfg.task, backend=cfg.backend, num_envs=cfg.num_envs,
                              model=cfg.model, seed=cfg.seed, tracing=tracing,
                              randomization=cfg.randomize, task_options=cfg.task_options(),
                              **options)
    sim = simulated_time(env)
    rng = np.random.default_rng(cfg.seed + 1)
    shape = (cfg.num_envs, env.action_dim)
    actions = np.empty(shape)
    say = progress or (lambda _msg: None)
    interrupted: dict[str, Any] | None = None
    done_steps = resets = 0
    t0 = time.perf_counter()
    try:
        for _ in range(cfg.warmup):
            if stop is not None and stop.signal:
                break
            env.step(rng.normal(0.0, cfg.action_noise, shape))
        tracing.processor.clear()  # statistics of the timed steps only
        last_report = t0 = time.perf_counter()
        for i in range(cfg.steps):
            if stop is not None and stop.signal:
                break
            rng.standard_normal(out=actions)
            actions *= cfg.action_noise
            _, _, done, _ = env.step(actions)
            resets += int(done.sum())
            done_steps = i + 1
            now = time.perf_counter()
            if now - last_report >= 2.0 or i + 1 == cfg.steps:
                last_report = now
                rate = (i + 1) * cfg.num_envs / (now - t0)
                say(f"step {i + 1}/{cfg.steps} ({100 * (i + 1) / cfg.steps:.0f}%), "
                    f"{rate:,.0f} env/s, resets {100 * resets / ((i + 1) * cfg.num_envs):.2f}%"
                    " of envs per step")
    except KeyboardInterrupt:  # Ctrl-C with Python's own handler
        interrupted = {"signal": "SIGINT", "steps_done": done_steps}
    finally:
        wall = time.perf_counter() - t0
        env.close()
    # statistics are complete now; span export finishes when the session shuts down
    steps = max(done_steps, 1)
    result = record_of_session(
        tracing, kind="collector", config={**asdict(cfg), "mode": tracing.mode},
        wall_s=wall, env_per_s=cfg.num_envs * done_steps / wall if done_steps else 0.0,
        reset_fraction=resets / (steps * cfg.num_envs),
        export=tracing.export_report()).to_json()
    result["sim"] = sim
    if stop is not None and stop.signal and interrupted is None:
        interrupted = {"signal": stop.signal, "steps_done": done_steps}
    if interrupted is not None:
        say(f"interrupted by {interrupted['signal']} after {done_steps} of {cfg.steps} "
            "timed steps")
        result["interrupted"] = interrupted
    return result


VARIANTS = ("numpy", "numba")


def run_numba_ab(cfg: CollectorConfig, tracing: Any,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The collector with numpy (under ``tracing``) and numba (under a second session of the
    same config) update_state interleaved; the result of :func:`run_collector` for the numpy
    variant plus ``"numba_ab"``."""
    import resettrace
    from resettrace.tracing.session import Tracing

    if tracing.processor is None or tracing.config.exports_spans:
        raise ValueError("--numba-ab needs tracing mode 'timing' (span export would load the "
                         "two variants differently)")
    options: dict[str, Any] = {}
    if cfg.nthread is not None:
        options["nthread"] = cfg.nthread
    sessions = {"numpy": tracing, "numba": Tracing(tracing.config)}
    envs: dict[str, Any] = {}
    say = progress or (lambda _msg: None)
    try:
        for name in VARIANTS:
            try:
                envs[name] = resettrace.make_env(
                    cfg.task, backend=cfg.backend, num_envs=cfg.num_envs, model=cfg.model,
                    seed=cfg.seed, tracing=sessions[name], randomization=cfg.randomize,
                    task_options=cfg.task_options(use_numba=name == "numba"), **options)
            except TypeError as e:  # the task's config has no use_numba field
                raise ValueError(f"task {cfg.task!r} has no numba variant ({e})") from None
        sim = simulated_time(envs["numpy"])
        rng = np.random.default_rng(cfg.seed + 1)
        shape = (cfg.num_envs, envs["numpy"].action_dim)
        actions = np.empty(shape)
        for i in range(cfg.warmup):
            rng.standard_normal(out=actions)
            actions *= cfg.action_noise
            for name in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
                envs[name].step(actions)
        for session in sessions.values():
            session.aggregator.clear()  # statistics of the timed steps only
        wall = dict.fromkeys(VARIANTS, 0.0)
        resets = dict.fromkeys(VARIANTS, 0)
        done_mismatch_steps = 0
        obs_max_abs_diff = 0.0
        last_report = t0 = time.perf_counter()
        for i in range(cfg.steps):
            rng.standard_normal(out=actions)
            actions *= cfg.action_noise
            for name in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
                start = time.perf_counter()
                _, _, done, _ = envs[name].step(actions)
                wall[name] += time.perf_counter() - start
                resets[name] += int(done.sum())
            # same seed, same actions: the variants must stay in lockstep (checked untimed)
            a, b = envs["numpy"], envs["numba"]
            done_mismatch_steps += int(not np.array_equal(a.done, b.done))
            obs_max_abs_diff = max(obs_max_abs_diff, float(np.max(np.abs(a.obs - b.obs))))
            now = time.perf_counter()
            if now - last_report >= 2.0 or i + 1 == cfg.steps:
                last_report = now
                rates = ", ".join(f"{n} {(i + 1) * cfg.num_envs / wall[n]:,.0f}"
                                  for n in VARIANTS)
                say(f"step {i + 1}/{cfg.steps} ({100 * (i + 1) / cfg.steps:.0f}%), env/s: "
                    f"{rates}")
        total_wall = time.perf_counter() - t0
    finally:
        for env in envs.values():
            env.close()
    for session in sessions.values():
        session.aggregator.force_flush()
    per_variant: dict[str, dict[str, Any]] = {}
    for name in VARIANTS:
        st = sessions[name].stats()
        per_variant[name] = {
            "env_per_s": cfg.num_envs * cfg.steps / wall[name],
            "wall_s": wall[name],
            "reset_fraction": resets[name] / (cfg.steps * cfg.num_envs),
            "env_step_ms": _p50_mean(st.get(C.ENV_STEP.key)),
            "update_state_ms": _p50_mean(st.get(C.UPDATE_STATE.key)),
        }
    sessions["numba"].shutdown()
    a, b = per_variant["numpy"], per_variant["numba"]
    speedup = {"env_per_s": _ratio(b["env_per_s"], a["env_per_s"])}
    for key in ("env_step_ms", "update_state_ms"):
        for stat in ("p50", "mean"):
            speedup[f"{key.removesuffix('_ms')}_{stat}"] = _ratio(a[key][stat], b[key][stat])
    result = record_of_session(
        tracing, kind="collector", config={**asdict(cfg), "mode": tracing.mode},
        wall_s=total_wall, env_per_s=a["env_per_s"], reset_fraction=a["reset_fraction"],
        export=tracing.export_report()).to_json()
    result["sim"] = sim
    result["numba_ab"] = {
        "num_envs": cfg.num_envs,
        "steps": cfg.steps,
        "order": "same actions; one step per variant in turn, order swapped every step",
        **per_variant,
        "speedup": speedup,
        "done_mismatch_steps": done_mismatch_steps,
        "obs_max_abs_diff": obs_max_abs_diff,
    }
    return result


def _p50_mean(stats: Any) -> dict[str, float]:
    if stats is None:
        return {"p50": 0.0, "mean": 0.0}
    return {"p50": float(stats.p50_ms), "mean": float(stats.mean_ms)}


def _ratio(num: float, den: float) -> float | None:
    """``num / den``; ``None`` (JSON null) when undefined."""
    return num / den if den > 0 and math.isfinite(num / den) else None


def render_numba_ab(ab: Mapping[str, Any]) -> str:
    """The A/B table: numpy vs numba update_state, numba's speedup (>1: numba faster)."""
    a, b, speed = ab["numpy"], ab["numba"], ab["speedup"]

    def x(v: float | None) -> float:
        return float("nan") if v is None else v

    rows = [["env/s", a["env_per_s"], b["env_per_s"], x(speed["env_per_s"])]]
    for key, label in (("env_step", "env step ms"), ("update_state", "update_state ms")):
        for stat in ("p50", "mean"):
            rows.append([f"{label} {stat}", a[f"{key}_ms"][stat], b[f"{key}_ms"][stat],
                         x(speed[f"{key}_{stat}"])])
    title = (f"numba A/B: update_state numpy vs numba, {ab['num_envs']} envs, {ab['steps']} "
             "steps interleaved")
    table = format_table(title, ["metric", "numpy", "numba", "speedup"], rows)
    check = (f"outputs: done masks differ on {ab['done_mismatch_steps']} of {ab['steps']} "
             f"steps, obs max |numba - numpy| {ab['obs_max_abs_diff']:.3g}")
    return f"{table}\n{check}"


def write_outputs(result: Mapping[str, Any], out: Path) -> list[Path]:
    """Write ``OUT/timing.json`` and ``OUT/timing.csv``; the paths written (a name beside
    either, when a file there is not resettrace's: :mod:`resettrace.outputs`)."""
    return [write_json(out / "timing.json", result), write_csv(out / "timing.csv",
                                                               result["stats"])]


def _stat(stats: Mapping[str, Any], key: str, field: str = "total_ms") -> float:
    s = stats.get(key)
    return 0.0 if s is None else float(s[field])


def render_report(result: Mapping[str, Any]) -> str:
    """The env/s line and the four breakdown tables (then the A/B table, if run)."""
    stats = result["stats"]
    cfg = result["config"]
    steps = max(1, int(_stat(stats, C.ENV_STEP.key, "count")))
    step_total = _stat(stats, C.ENV_STEP.key)
    stopped = result.get("interrupted")
    if stopped:
        cfg = dict(cfg, steps=f"{stopped['steps_done']} of {cfg['steps']} (interrupted by "
                              f"{stopped['signal']})")
    parts = [f"{cfg['task']} on {cfg['backend']}: {cfg['num_envs']} envs, {cfg['steps']} steps, "
             f"mode {cfg['mode']}: {result['env_per_s']:,.0f} env/s, "
             f"{100 * result['reset_fraction']:.2f}% of envs reset per step"]
    sim = result.get("sim")
    if sim:
        parts.append(f"simulated time: {sim['sim_s_per_step']:.6g} s per env step "
                     f"({sim['substeps']} substeps of the model's {sim['physics_dt_s']:.6g} s "
                     f"timestep), {result['env_per_s'] * sim['sim_s_per_step']:,.1f} "
                     "simulated s per wall s over all envs")

    def share(total: float, of: float) -> float:
        return 100.0 * total / of if of > 0 else float("nan")

    cat = C.CATALOG  # built-in and registered phases alike
    env_keys = (C.ENV_STEP.key,) + cat.timing_keys(C.ENV_STEP)
    dr_kids = cat.children(C.DR_RESET)
    tables: list[tuple[str, tuple[str, ...], str | None]] = [
        ("reset_done stages", (C.RESET_DONE_COUNT,) + cat.timing_keys(C.RESET_DONE),
         C.RESET_DONE.key),
        ("DR reset stages", (C.DR_RESET.key,) + cat.timing_keys(C.DR_RESET) + tuple(
            p.key for p in cat.descendants(C.DR_RESET, skip=(C.SET_STATE,))
            if p not in dr_kids), C.DR_RESET.key),
        ("set_state phases (% of dr_reset_set_state_ms)", cat.timing_keys(C.SET_STATE),
         C.SET_STATE.key),
    ]
    shown = set(env_keys).union(*(keys for _, keys, _ in tables))
    other = tuple(k for k in stats if k not in shown)
    if other:  # phases registered elsewhere in the tree (or SDK spans outside the catalog)
        tables.append(("other phases (% of their parent)", other, None))
    rows = []
    for key in env_keys:
        t = _stat(stats, key)
        rows.append([key, t / steps, share(t, step_total)])
    parts.append(format_table("env step breakdown (ms per env step)", ["key", "ms", "%"], rows))

    for title, keys, parent in tables:
        rows = []
        for key in keys:
            s = stats.get(key)
            if s is None:
                rows.append([key, 0, float("nan"), float("nan"), float("nan"), float("nan")])
                continue
            of = parent if parent is not None else cat.parent_key(key)
            pct = float("nan") if key == C.RESET_DONE_COUNT or of is None else share(
                s["total_ms"], _stat(stats, of))
            rows.append([key, s["count"], s["mean_ms"], s["p50_ms"], s["p90_ms"], pct])
        parts.append(format_table(title, ["key", "count", "mean", "p50", "p90", "%"], rows))
    exp = result.get("export") or {}
    if cfg["mode"] == "trace":
        parts.append(render_export(exp))
    metrics = exp.get("metrics")
    if metrics:
        line = f"metrics ({', '.join(metrics['metrics'])}):"
        if any(m == "otlp" for m in metrics["metrics"]):
            line += (f" {metrics['otlp_exports']} OTLP pushes, {metrics['otlp_failed']} "
                     "failed")
        if metrics.get("prometheus_port"):
            line += f"; served for scraping on port {metrics['prometheus_port']}"
        parts.append(line)
    if "numba_ab" in result:
        parts.append(render_numba_ab(result["numba_ab"]))
    return "\n\n".join(parts)


def render_export(exp: Mapping[str, Any]) -> str:
    """One line per exporter: delivered and not delivered spans."""
    lines = [f"spans: {exp.get('spans_sent', 0) + exp.get('spans_built', 0)} exported or sent, "
             f"{exp.get('spans_dropped', 0)} dropped (queue full), "
             f"{exp.get('spans_sampled_out', 0)} sampled out, "
             f"{exp.get('spans_pending', 0)} pending"]
    if exp.get("export_cpu_us_per_span") is not None:
        lines.append(f"export process CPU: {exp['export_cpu_s']:.2f} s "
                     f"({exp['export_setup_cpu_s']:.2f} s start-up, then "
                     f"{exp['export_cpu_us_per_span']:.1f} us per span)")
    for name, e in (exp.get("exporters") or {}).items():
        lines.append(f"  {name}: " + exporter_outcome(e, exp.get("spans_dropped", 0)))
    return "\n".join(lines)


def progress_printer(stream: TextIO = sys.stderr) -> Callable[[str], None]:
    def say(msg: str) -> None:
        print(msg, file=stream, flush=True)

    return say
