"""The ``resettrace`` command line.

``resettrace bench collector``  the env step breakdown (the main job)
``resettrace bench overhead``   tracing off vs timing vs trace, side by side
``resettrace bench set-state-ab`` the shipped set_state vs the published path vs the engine floor
``resettrace bench export``     span export designs: delivery and training slowdown
``resettrace bench stacks``     env step cost of the shipped stack instrumentations
``resettrace bench snapshots``  what keeping each process's run record current costs
``resettrace bench compare-aa RUN`` compare's false-positive rate on A/A pairs of one run
``resettrace compare BASE NEW``  two sets of collector runs, per key, with verdicts
``resettrace fit RUN...``       the cost model a + b*k of every phase (and c*N across env counts)
``resettrace report RUN [--compare BASE] -o report.html``  one self-contained HTML report
``resettrace merge RUN... -o merged.json``  many workers' runs as one job
``resettrace run [--instrument SPEC] -- COMMAND ...``  an unmodified command, traced

Tracing settings come from ``RESETTRACE`` / ``RESETTRACE_*`` / ``OTEL_*`` (see
``resettrace.config``). The CLI owns the tracing session it creates and shuts it
down with a bounded timeout before it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resettrace.config import Config

log = logging.getLogger("resettrace")


def _collector(args: argparse.Namespace) -> int:
    from resettrace.bench import collector
    from resettrace.bench.collector import CollectorConfig, StopRequest, progress_printer
    from resettrace.tracing.exits import holding_signals
    from resettrace.tracing.session import Tracing

    try:
        if args.config is not None:  # a worker of --workers: its job's config, as it is
            cfg = CollectorConfig(**json.loads(args.config))
            for f in dataclasses.fields(cfg):  # what the rest reads from the flags
                setattr(args, f.name, getattr(cfg, f.name))
        else:
            cfg = CollectorConfig(task=args.task, backend=args.backend,
                                  num_envs=args.num_envs, warmup=args.warmup,
                                  steps=args.steps, out=args.out, model=args.model,
                                  seed=args.seed, action_noise=args.action_noise,
                                  nthread=args.nthread, numba_ab=args.numba_ab,
                                  randomize=args.randomize, control_dt=args.control_dt)
    except (ValueError, TypeError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    if args.workers != 1:
        if args.workers < 1 or cfg.numba_ab:
            print("resettrace: --workers must be >= 1, and not with --numba-ab",
                  file=sys.stderr)
            return 2
        return _collector_workers(args, cfg)
    if args.report and not cfg.out:
        print("resettrace: --report writes report.html next to timing.json: give --out",
              file=sys.stderr)
        return 2

    # SIGTERM and SIGINT stop the run after the step under way; set before the session,
    # whose own SIGTERM hook then stays out of the way
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop.handler)
    signal.signal(signal.SIGINT, stop.handler)
    try:
        env_cfg = Config.from_env()
        if _refused_endpoint(env_cfg):
            print(f"resettrace: {env_cfg.otlp_refused}", file=sys.stderr)
            return 2
        run_cfg = collector.session_config(cfg, env_cfg)
    except ValueError as e:  # contradictory settings
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    if _refused(collector.planned_outputs(cfg, run_cfg, report=args.report)):
        return 2  # said now, not after the run
    tracing = Tracing(run_cfg)
    try:
        result = collector.run_collector(cfg, tracing, progress=progress_printer(), stop=stop)
    except (ValueError, FileNotFoundError) as e:
        tracing.shutdown()
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    # the flush and the files: a signal now (the first of each kind) waits until they are
    # written, and a second one ends the process at once
    stopped = result.get("interrupted")
    asked = (int(signal.Signals[stopped["signal"]]),) if stopped else ()
    with holding_signals(already=asked) as held:
        code = _finish_collector(args, cfg, tracing, result)
    late = held.first
    if stopped or late:
        name = stopped["signal"] if stopped else signal.Signals(late).name  # type: ignore[arg-type]
        done = stopped["steps_done"] if stopped else cfg.steps
        print(f"resettrace: interrupted by {name} after {done} of {cfg.steps} timed steps"
              + ("" if stopped else " (during the final flush: the files are complete)"),
              file=sys.stderr)
        if code == 0:
            code = 128 + int(signal.Signals[name])
    return code


def _finish_collector(args: argparse.Namespace, cfg: Any, tracing: Any,
                      result: dict[str, Any]) -> int:
    """Shut the session down (its spans flushed), print the tables, write the files."""
    from resettrace.bench.collector import render_report, write_outputs

    tracing.shutdown()
    result["export"] = tracing.export_report()
    print(render_report(result))
    try:
        paths = write_outputs(result, Path(args.out)) if args.out else []
    except OSError as e:  # the run is done and printed: say why its files are not written
        print(f"resettrace: {_write_error(f'the outputs to {args.out}', e)}", file=sys.stderr)
        return 2
    if args.report:
        from resettrace.analysis.report import write_report

        try:  # from the timing.json just written (paths[0]: beside a foreign file, maybe)
            paths.append(write_report(paths[0], Path(args.out) / "report.html"))
        except (ValueError, OSError) as e:
            print(f"resettrace: the report was not written: {e}", file=sys.stderr)
            return 2
    # the span files written (a name beside the path, maybe); none for a refused path
    paths += [Path(e["path"]) for e in (result["export"].get("exporters") or {}).values()
              if e.get("path")]
    if paths:
        print("\noutputs:\n" + "\n".join(f"  {p}" for p in paths))
    return 0


def _refused_endpoint(config: Config) -> bool:
    """Whether an OTLP sink in use has an endpoint the environment named unusably: at the
    command line that stops before anything runs (in a user's process the sink sends
    nothing and counts its spans as failed)."""
    uses_otlp = (config.mode == "trace" and "otlp" in config.exporters) or (
        config.enabled and "otlp" in config.metrics)
    return bool(config.otlp_refused) and uses_otlp


def _refused(paths: list[tuple[str | Path, Any]]) -> bool:
    """Check output paths before the work that fills them (a symbolic link or anything but
    a regular file is refused: :mod:`resettrace.outputs`); True, with one line, if one is.
    Files written whole are claimed for this command: a job that overlaps it and writes one
    of them first keeps its file, and this one writes beside it."""
    from resettrace import outputs

    spans = set(outputs.SPAN_KINDS.values())  # locked by the session that writes them
    for path, kind in paths:
        try:
            if kind in spans:
                outputs.output_path(path, kind)
            else:
                outputs.claim_output(path, kind)
        except OSError as e:  # refused, or unreadable
            print(f"resettrace: {_write_error(path, e)}", file=sys.stderr)
            return True
    return False


def _write_error(path: str | Path, e: OSError) -> str:
    from resettrace.outputs import OutputRefused

    return str(e) if isinstance(e, OutputRefused) else f"cannot write {path}: {e.strerror or e}"


def _save_json(path: str | None, result: Any) -> int:
    """Write a benchmark's ``--json`` file (if asked): 0, or 2 with one line on failure."""
    if not path:
        return 0
    from resettrace.tables import write_json

    try:
        written = write_json(Path(path), result)
    except OSError as e:
        print(f"resettrace: {_write_error(path, e)}", file=sys.stderr)
        return 2
    print(f"\nwrote {written}")
    return 0


def _bench(args: argparse.Namespace, make_config: Callable[[], Any],
           run: Callable[..., dict[str, Any]], render: Callable[[dict[str, Any]], str]) -> int:
    """A benchmark command: its config (a bad value is one line, exit 2), the run (a model
    or task that cannot be used likewise), the table, and ``--json``."""
    return _command(args.json, lambda: run(make_config(), progress=lambda m: print(
        m, file=sys.stderr, flush=True)), render)


def _command(json_path: str | None, compute: Callable[[], dict[str, Any]],
             render: Callable[[dict[str, Any]], str]) -> int:
    """Compute a result (bad input: one line, exit 2), print it, and write ``--json``."""
    from resettrace import outputs

    if json_path and _refused([(json_path, outputs.JSON)]):
        return 2
    try:
        result = compute()
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    print(render(result))
    return _save_json(json_path, result)


def _overhead(args: argparse.Namespace) -> int:
    from resettrace.bench.overhead import OverheadConfig, render_overhead, run_overhead

    return _bench(args, lambda: OverheadConfig(
        task=args.task, backend=args.backend, num_envs=args.num_envs, ratio=args.ratio,
        rounds=args.rounds, calls=args.calls, warmup=args.warmup, repeats=args.repeats,
        model=args.model, nthread=args.nthread), run_overhead, render_overhead)


def _snapshots_bench(args: argparse.Namespace) -> int:
    from resettrace.bench.snapshots import SnapshotConfig, render_snapshots, run_snapshots

    return _bench(args, lambda: SnapshotConfig(
        task=args.task, backend=args.backend, num_envs=args.num_envs, ratio=args.ratio,
        rounds=args.rounds, steps=args.steps, period=args.period), run_snapshots,
        render_snapshots)


def _export_bench(args: argparse.Namespace) -> int:
    from resettrace.bench.export import ExportBenchConfig, render_export_bench, run_export_bench

    return _bench(args, lambda: ExportBenchConfig(
        task=args.task, backend=args.backend, num_envs=args.num_envs, rounds=args.rounds,
        steps=args.steps, warmup=args.warmup, model=args.model, nthread=args.nthread,
        candidates=tuple(args.candidates)), run_export_bench, render_export_bench)


def _stacks_bench(args: argparse.Namespace) -> int:
    from resettrace.bench.stacks import StacksBenchConfig, render_stacks_bench, run_stacks_bench

    return _bench(args, lambda: StacksBenchConfig(
        stacks=tuple(args.stack), motrixlab_envs=args.motrixlab_envs,
        gymnasium_envs=args.gymnasium_envs,
        rounds=args.rounds, block=args.block, block_ms=args.block_ms, warmup=args.warmup,
        settle=args.settle, seed=args.seed),
        run_stacks_bench, render_stacks_bench)


def _set_state_ab(args: argparse.Namespace) -> int:
    from resettrace.bench.set_state_ab import (
        SetStateABConfig,
        render_set_state_ab,
        run_set_state_ab,
    )

    return _bench(args, lambda: SetStateABConfig(
        backends=tuple(args.backends), num_envs=tuple(args.num_envs), ratios=tuple(args.ratios),
        calls=args.calls, min_seconds=args.min_seconds, warmup=args.warmup,
        fixed_k=args.fixed_k, model=args.model, nthread=args.nthread, seed=args.seed,
        idle_us=args.idle_us), run_set_state_ab,
        lambda result: render_set_state_ab(result, per_key=not args.no_per_key))


def _run(args: argparse.Namespace) -> int:
    """Run COMMAND with resettrace's ``sitecustomize`` first on ``PYTHONPATH``; then merge
    the run records its processes wrote into the job's record, and print it."""
    from resettrace import _run as run_dir
    from resettrace.config import (
        ENV_INSTRUMENT,
        ENV_MODE,
        ENV_PARENT_RANK,
        ENV_RUN_ID,
        ENV_RUN_JSON,
        ENV_RUN_OWNER,
        ENV_RUN_SUMMARY,
    )
    from resettrace.instrumentation import InstrumentError, check_spec

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("resettrace run: no command given (resettrace run [--instrument SPEC] -- "
              "python train.py ...)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if not env.get(ENV_MODE, "").strip():
        env[ENV_MODE] = "timing"  # running under resettrace means: record
    quiet = logging.getLogger("resettrace.config")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the command's processes say each bad value once
    try:
        run_cfg = Config.from_env(env)
    except ValueError as e:  # contradictory settings
        print(f"resettrace run: {e}", file=sys.stderr)
        return 2
    finally:
        quiet.setLevel(level)
    if _refused_endpoint(run_cfg):
        print(f"resettrace run: {run_cfg.otlp_refused}", file=sys.stderr)
        return 2
    spec = args.instrument or env.get(ENV_INSTRUMENT, "").strip() or None
    if spec:
        try:
            check_spec(spec)
        except InstrumentError as e:
            print(f"resettrace run: {e}", file=sys.stderr)
            return 2
        env[ENV_INSTRUMENT] = ",".join(  # files absolute (the command may change folder)
            str(Path(x).resolve()) if os.path.exists(x) else x
            for x in (y.strip() for y in spec.split(",")) if x)
    here = str(Path(run_dir.__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in
                                                  env.get("PYTHONPATH", "").split(os.pathsep)
                                                  if p])
    env[ENV_RUN_SUMMARY] = "0" if args.no_summary else "1"
    # Ray: every ray.init() of the command gives the job's workers resettrace too, on a
    # cluster it starts or one started beforehand (resettrace.ray)
    from resettrace.ray import ENV_NEXT_HOOK

    hook = "resettrace.ray.runtime_env_hook"
    if env.get("RAY_RUNTIME_ENV_HOOK", hook) != hook:
        env[ENV_NEXT_HOOK] = env["RAY_RUNTIME_ENV_HOOK"]
    env["RAY_RUNTIME_ENV_HOOK"] = hook
    env.pop(ENV_RUN_OWNER, None)  # a run inside a run: its command is a main process again
    env.pop(ENV_PARENT_RANK, None)
    import secrets
    import tempfile

    run_id = secrets.token_hex(8)
    env[ENV_RUN_ID] = run_id
    job_path: Path | None = None
    scratch: str | None = None
    if args.stats_json:
        from resettrace import outputs

        stats_json = Path(args.stats_json)
        own = "{pid}" in args.stats_json or "{rank}" in args.stats_json
        if not own and _refused([(stats_json, outputs.JSON)]):
            return 2  # said before the command runs, not at its exit
        # absolute (the command may change folder); the last component is never resolved:
        # a link there is refused above, or when written
        folder = stats_json.parent.resolve()
        if own:  # every process its own file, as named; no job file
            template = folder / stats_json.name
        else:  # the job's record at PATH, each process's beside it
            job_path = folder / stats_json.name
            template = folder / f"{stats_json.stem}.{{pid}}{stats_json.suffix or '.json'}"
    else:
        scratch = tempfile.mkdtemp(prefix="resettrace-run-")
        template = Path(scratch) / "{pid}.json"
    env[ENV_RUN_JSON] = str(template)
    sys.stdout.flush()
    sys.stderr.flush()
    code = _supervise(command, env)
    try:
        return _finish_run(args, command, code, run_id, template, job_path)
    finally:
        if scratch is not None:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)


def _supervise(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` and wait for it: SIGTERM (and SIGHUP) sent to this process go on to
    it, SIGINT is left to the terminal (which sends it to the whole foreground group).
    Its exit code (128 + N when signal N ended it; 127 when it cannot start)."""
    import subprocess

    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as e:
        print(f"resettrace run: cannot run {command[0]!r}: {e.strerror or e}", file=sys.stderr)
        return 127

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
                signal.SIGHUP: signal.signal(signal.SIGHUP, forward),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    try:
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def _finish_run(args: argparse.Namespace, command: list[str], code: int, run_id: str,
                template: Path, job_path: Path | None) -> int:
    """Merge the records this run's processes wrote (waiting for members still running),
    write the job's, print the summary."""
    from resettrace.job import gather_members, members_line, untraced_in_job
    from resettrace.record import merge_records

    found, notes = gather_members(template, job_path, run_id)
    untraced = untraced_in_job(found)
    records = [r for r in found if r.stats]  # (a main process that recorded nothing
    summary = not args.no_summary            # wrote only the targets it never imported)
    if untraced:
        print("resettrace run: instrument target(s) never imported, so never traced: "
              + ", ".join(untraced) + " (no process of the job imported them)",
              file=sys.stderr)
    if not records:
        if summary and code == 0:  # (a command that failed said why itself)
            mode = os.environ.get("RESETTRACE", "").strip().lower() or "timing"
            print("resettrace run: tracing is off (RESETTRACE=off): nothing recorded"
                  if mode in ("off", "0", "false", "no") else
                  "resettrace run: no instrumented call ran", file=sys.stderr)
        return code
    job = merge_records(records, allow_mixed=True, allow_duplicates=True, command=command)
    job.extra["incomplete"] = notes["incomplete"]
    job.extra["missing"] = notes["missing"]
    written: Path | None = None
    if job_path is not None:
        from resettrace.tables import write_json

        try:
            written = write_json(job_path, job.to_json())
        except OSError as e:
            print(f"resettrace run: {_write_error(job_path, e)}", file=sys.stderr)
            code = code or 2
    if summary:
        from resettrace.analysis.job_lines import render_job

        print("\n" + render_job(job), file=sys.stderr)
        if written is not None:
            print(f"resettrace run: the job's record: {written} (each process's: "
                  f"{template.name.replace('{pid}', 'PID')} beside it)", file=sys.stderr)
    twice = job.extra.get("duplicates")
    if twice and not summary:  # (the summary says it in its table)
        print("resettrace run: two processes claim one identity, merged anyway: "
              + "; ".join(map(str, twice)), file=sys.stderr)
    line = members_line(notes)
    if line:
        print(f"resettrace run: {line}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    from resettrace.bench.export import DEFAULT_CANDIDATES, EXPORTING
    from resettrace.settings import help_text

    p = argparse.ArgumentParser(prog="resettrace", description=__doc__.split("\n\n")[0],
                                epilog=help_text(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench",
                                                                       required=True)

    def common(b: argparse.ArgumentParser, num_envs: int) -> None:
        b.add_argument("--task", default="g1_walk_flat")
        b.add_argument("--backend", default="mujoco")
        b.add_argument("--num-envs", type=int, default=num_envs)
        b.add_argument("--model", default=None, help="MJCF file instead of the bundled G1")
        b.add_argument("--nthread", type=int, default=None, help="engine threads (all CPUs)")

    c = bench.add_parser("collector", help="env step breakdown of a noisy-action rollout")
    common(c, 1024)
    c.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    c.add_argument("--steps", type=int, default=200, help="timed steps")
    c.add_argument("--out", default=None, help="folder for timing.json, timing.csv, spans")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--action-noise", type=float, default=1.0,
                   help="std of the random actions (sets how often envs fall)")
    c.add_argument("--control-dt", type=float, default=None, metavar="SECONDS",
                   help="control period (default 0.02); physics substeps per env step = this "
                        "/ the model's timestep, which must be a whole number")
    c.add_argument("--randomize", action="store_true",
                   help="per-env friction, mass, kp/kd and geom sizes, drawn at every reset")
    c.add_argument("--numba-ab", action="store_true",
                   help="step a numpy and a numba update_state env side by side (same seed and"
                        " actions, interleaved) and print their A/B table")
    c.add_argument("--config", default=None, help=argparse.SUPPRESS)  # a --workers worker's
    c.add_argument("--workers", type=int, default=1, metavar="W",
                   help="run W worker processes (spawned), each its own env and rank "
                        "(RESETTRACE_WORKER_RANK), into OUT/rank<r>/, and merge them into "
                        "OUT/merged.json")
    c.add_argument("--report", action="store_true",
                   help="also write OUT/report.html (resettrace report of this run)")
    c.set_defaults(func=_collector, needs=("sim",))

    o = bench.add_parser("overhead", help="reset_done with tracing off / timing / trace")
    common(o, 1024)
    o.add_argument("--ratio", type=float, default=0.05, help="share of envs reset per call")
    o.add_argument("--rounds", type=int, default=100, help="interleaved rounds")
    o.add_argument("--calls", type=int, default=3, help="reset_done calls per mode per round")
    o.add_argument("--warmup", type=int, default=5, help="untimed calls per mode first")
    o.add_argument("--repeats", type=int, default=5,
                   help="groups of rounds; each ratio is the median over the groups")
    o.add_argument("--json", default=None, help="write the result as JSON")
    o.set_defaults(func=_overhead, needs=("sim",))

    sn = bench.add_parser("snapshots", help="what keeping each process's run record "
                                            "current costs its training (interleaved, A/A)")
    common(sn, 1024)
    sn.add_argument("--ratio", type=float, default=0.05, help="share of envs reset per step")
    sn.add_argument("--rounds", type=int, default=12, help="interleaved rounds")
    sn.add_argument("--steps", type=int, default=60, help="steps per mode per round")
    sn.add_argument("--period", type=float, default=0.25,
                    help="seconds between snapshots while measuring (0.25: 20x the default)")
    sn.add_argument("--json", default=None, help="write the result as JSON")
    sn.set_defaults(func=_snapshots_bench, needs=("sim",))

    x = bench.add_parser("export", help="span export designs: throughput, delivery and the "
                                        "training slowdown, interleaved")
    common(x, 64)
    x.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    x.add_argument("--steps", type=int, default=1000,
                   help="env steps per candidate per round (each round ends with a timed "
                        "flush: keep rounds long)")
    x.add_argument("--warmup", type=int, default=20, help="untimed steps per candidate first")
    x.add_argument("--candidates", nargs="+", default=list(DEFAULT_CANDIDATES), metavar="NAME",
                   help=f"exporting candidates to run ({', '.join(EXPORTING)}; timing and "
                        "timing_aa always run)")
    x.add_argument("--json", default=None, help="write the result as JSON")
    x.set_defaults(func=_export_bench, needs=("sim",))

    st = bench.add_parser("stacks", help="env step cost of each shipped instrumentation "
                                         "(MotrixLab, Gymnasium): timing vs off vs bare")
    st.add_argument("--stack", nargs="+", default=["motrixlab", "gymnasium"],
                    metavar="NAME", help="stacks to measure (motrixlab, gymnasium)")
    st.add_argument("--motrixlab-envs", type=int, default=1024,
                    help="envs of the MotrixLab env")
    st.add_argument("--gymnasium-envs", type=int, default=16,
                    help="sub-envs of the Gymnasium sync vector env")
    st.add_argument("--rounds", type=int, default=40, help="interleaved rounds")
    st.add_argument("--block", type=int, default=None,
                    help="env steps per timed block (default: as many as --block-ms takes)")
    st.add_argument("--block-ms", type=float, default=100.0,
                    help="length of a timed block in ms, its steps sized from the off "
                         "mode's warm-up steps (default 100)")
    st.add_argument("--warmup", type=int, default=10, help="untimed steps per mode first")
    st.add_argument("--settle", type=int, default=2,
                    help="untimed steps before each timed block, in its mode")
    st.add_argument("--seed", type=int, default=0)
    st.add_argument("--json", default=None, help="write the result as JSON")
    st.set_defaults(func=_stacks_bench, needs=("sim",))

    a = bench.add_parser("set-state-ab",
                         help="set_state: published path vs shipped path vs engine floor")
    a.add_argument("--backends", nargs="+", default=["mujoco", "motrix"])
    a.add_argument("--num-envs", type=int, nargs="+", default=[1024, 2048, 4096])
    a.add_argument("--ratios", type=float, nargs="+", default=[0.02, 0.05, 0.25, 0.5],
                   help="shares of envs reset per call")
    a.add_argument("--calls", type=int, default=30,
                   help="timed calls per variant and cell, at least")
    a.add_argument("--min-seconds", type=float, default=3.0, metavar="S",
                   help="timed seconds per cell, at least: cells of short calls (small k) run "
                        "more than --calls rounds, as many as their warmup says fill S "
                        "(default 3; 0: --calls)")
    a.add_argument("--warmup", type=int, default=5, help="untimed calls per variant first")
    a.add_argument("--fixed-k", type=int, default=82,
                   help="rows reset on every --num-envs to check N-independence (0: skip)")
    a.add_argument("--model", default=None, help="MJCF file instead of the bundled G1")
    a.add_argument("--nthread", type=int, default=None, help="engine threads (all CPUs)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--idle-us", type=float, default=1000.0, metavar="US",
                   help="busy microseconds before every call, as the env's own Python between "
                        "a step and its resets (default 1000; 0: calls back to back)")
    a.add_argument("--no-per-key", action="store_true", help="print the summary tables only")
    a.add_argument("--json", default=None, help="write the result as JSON")
    a.set_defaults(func=_set_state_ab, needs=("sim",))

    def compare_flags(q: argparse.ArgumentParser) -> None:
        q.add_argument("--noise", type=float, default=3.0, metavar="PCT",
                       help="noise floor: a change within +-PCT%% is 'within noise' (3)")
        q.add_argument("--confidence", type=float, default=0.99,
                       help="confidence level of the bootstrap interval (0.99: dozens of "
                            "keys are judged at once)")
        q.add_argument("--reference", default="physics_ms", metavar="KEY",
                       help="a key the change leaves alone: its shift between the sides "
                            "(the machine's drift) widens the noise floor (physics_ms; "
                            "'none': the fixed floor only)")
        q.add_argument("--blocks", type=int, default=10,
                       help="blocks per run whose medians are the statistical units (10)")
        q.add_argument("--json", default=None, help="write the result as JSON")

    cmp_ = sub.add_parser("compare", help="two sets of collector runs side by side, per key")
    cmp_.add_argument("base", metavar="BASE", help="timing.json, or a folder of runs")
    cmp_.add_argument("new", metavar="NEW", help="timing.json, or a folder of runs")
    cmp_.add_argument("--fail-on-regression", type=float, default=None, metavar="PCT",
                      help="exit 1 when a key is slower beyond noise by more than PCT%%")
    compare_flags(cmp_)
    cmp_.set_defaults(func=_compare, needs=("report",))

    fit = sub.add_parser("fit", help="cost model of every phase: ms = a + b*k per call, and "
                                     "the dependence on N across env counts")
    fit.add_argument("runs", nargs="+", metavar="RUN",
                     help="timing.json files or folders (any env counts), or one bench "
                          "set-state-ab JSON")
    fit.add_argument("--json", default=None, help="write the result as JSON")
    fit.set_defaults(func=_fit, needs=("report",))

    mg = sub.add_parser("merge", help="many workers' collector runs as one job: per-rank "
                                      "table and merged statistics")
    mg.add_argument("runs", nargs="+", metavar="RUN",
                    help="run records (timing.json, resettrace run's job.PID.json, ...) or "
                         "folders of them (a job record beside its processes' is left out)")
    mg.add_argument("-o", "--output", default=None, help="write the merged JSON here")
    mg.add_argument("--allow-mixed", action="store_true",
                    help="merge runs of different configurations anyway")
    mg.add_argument("--allow-duplicates", action="store_true",
                    help="merge processes that claim one identity (two rank 0s: records of "
                         "different jobs?) anyway; the job lists them")
    mg.set_defaults(func=_merge)

    rep = sub.add_parser("report", help="one self-contained HTML report of a run record")
    rep.add_argument("run", metavar="RUN",
                     help="a run record (timing.json, a resettrace run --stats-json file), "
                          "or the folder of a timing.json")
    rep.add_argument("--compare", default=None, metavar="BASE",
                     help="also compare against BASE (timing.json or a folder of runs)")
    rep.add_argument("-o", "--output", default="report.html", help="the HTML file (report.html)")
    rep.set_defaults(func=_report, needs=("report",))

    aa = bench.add_parser("compare-aa", help="compare's false-positive rate on A/A pairs "
                                             "cut from one long run")
    aa.add_argument("run", metavar="RUN", help="timing.json, or a folder of runs")
    aa.add_argument("--pairs", type=int, default=10, help="A/A pairs per run (10)")
    compare_flags(aa)
    aa.set_defaults(func=_compare_aa, needs=("report",))

    r = sub.add_parser(
        "run", help="run an unmodified command with tracing installed",
        description="Run COMMAND with resettrace installed in each of its Python processes "
                    "(a sitecustomize on PYTHONPATH): the spec's functions are recorded, "
                    "RESETTRACE defaults to 'timing', every process that recorded something "
                    "writes its run record at exit, and at the end the records of the whole "
                    "process tree are merged into the job's, printed to stderr with a line "
                    "per rank. RESETTRACE_EXPORTER and the other variables work as usual.")
    r.add_argument("--instrument", metavar="SPEC", default=None,
                   help="TOML spec of attributes, phases and functions to record "
                        "(default: $RESETTRACE_INSTRUMENT)")
    r.add_argument("--no-summary", action="store_true", help="print no stats at exit")
    r.add_argument("--stats-json", metavar="PATH", default=None,
                   help="write the job's run record to PATH, and each process's beside it "
                        "(STEM.PID.json); with {pid} or {rank} in PATH, only each "
                        "process's, as named")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    r.set_defaults(func=_run)
    return p


def _compare_options(args: argparse.Namespace) -> dict[str, Any]:
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must be between 0 and 1, got {args.confidence}")
    if not args.noise >= 0 or args.blocks < 1:
        raise ValueError("--noise must be >= 0 and --blocks >= 1")
    return {"blocks": args.blocks, "noise_pct": args.noise, "confidence": args.confidence,
            "reference": None if args.reference == "none" else args.reference}


def _compare(args: argparse.Namespace) -> int:
    from resettrace import outputs
    from resettrace.analysis.compare import compare_runs, load_runs, regressions, render_compare

    if args.json and _refused([(args.json, outputs.JSON)]):
        return 2
    try:
        options = _compare_options(args)
        result = compare_runs(load_runs(args.base), load_runs(args.new), **options)
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    print(render_compare(result))
    if _save_json(args.json, result):
        return 2
    if args.fail_on_regression is not None:
        slower = regressions(result, args.fail_on_regression)
        if slower:
            print(f"resettrace: {len(slower)} key(s) slower beyond noise by more than "
                  f"{args.fail_on_regression:g}%: "
                  + ", ".join(f"{k['key']} " + ("(took no time before)" if k["delta_pct"]
                                                 is None else f"{k['delta_pct']:+.1f}%")
                              for k in slower),
                  file=sys.stderr)
            return 1
    return 0


def _fit(args: argparse.Namespace) -> int:
    from resettrace.analysis.fit import load_fit_inputs, render_fit

    return _command(args.json, lambda: load_fit_inputs(args.runs), render_fit)


def _merge(args: argparse.Namespace) -> int:
    from resettrace.analysis.merge import load_runs, merge_runs, render_merge

    def merged() -> dict[str, Any]:
        job = merge_runs(load_runs(args.runs), allow_mixed=args.allow_mixed,
                         allow_duplicates=args.allow_duplicates)
        for line in job.extra.get("left_out") or ():  # a job record beside its processes'
            print(f"resettrace: {line}", file=sys.stderr)
        return job.to_json()

    return _command(args.output, merged, render_merge)


def _collector_workers(args: argparse.Namespace, cfg: Any) -> int:
    """``bench collector --workers W``: W spawned CLI processes, one rank each, then merged.
    Each worker gets ``cfg`` itself (its own seed, engine threads and folder), so every
    setting reaches it."""
    import subprocess

    from resettrace.analysis.merge import load_runs, merge_runs, render_merge

    if not args.out:
        print("resettrace: --workers writes OUT/rank<r>/ and OUT/merged.json: give --out",
              file=sys.stderr)
        return 2
    from resettrace import outputs

    out = Path(args.out)
    ranks = [out / f"rank{r}" for r in range(args.workers)]
    files: list[tuple[str | Path, Any]] = [(out / "merged.json", outputs.JSON)]
    for folder in ranks:
        files += [(folder / "log.txt", outputs.WORKER_LOG), (folder / "timing.json", outputs.JSON),
                  (folder / "timing.csv", outputs.CSV)]
        files += [(folder / "report.html", outputs.REPORT_HTML)] if args.report else []
    if _refused(files):
        return 2
    # where each worker will write its timing.json (by the same rules: beside a foreign file)
    timing = [outputs.output_path(folder / "timing.json", outputs.JSON) for folder in ranks]
    # share the cores: an engine pool of every CPU per worker would oversubscribe them
    nthread = args.nthread or max(1, (os.cpu_count() or 1) // args.workers)

    def command(rank: int) -> list[str]:  # the same run; each worker its own seed and folder
        mine = dataclasses.replace(cfg, seed=cfg.seed + rank, nthread=nthread,
                                   out=str(out / f"rank{rank}"))
        cmd = ["bench", "collector", "--config", json.dumps(dataclasses.asdict(mine))]
        cmd += ["--report"] if args.report else []
        return cmd

    procs: list[tuple[int, Any, Any]] = []
    stopped: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:  # the scheduler stops the job
        signal.signal(signum, signal.SIG_DFL)  # a second one ends this process at once
        stopped.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failed = []
    try:
        for r in range(args.workers):
            try:
                _, log_file = outputs.open_output(ranks[r] / "log.txt", outputs.WORKER_LOG,
                                                  lock=True)  # held until the worker ends
            except OSError as e:  # changed since the check above
                print(f"resettrace: {_write_error(ranks[r] / 'log.txt', e)}", file=sys.stderr)
                failed.append(r)
                raise KeyboardInterrupt from None  # the started workers stop
            log_file.write(outputs.worker_log_header(r, " ".join(command(r))))
            env = dict(os.environ, RESETTRACE_WORKER_RANK=str(r))
            procs.append((r, log_file, subprocess.Popen(
                [sys.executable, "-m", "resettrace.cli", *command(r)], stdout=log_file,
                stderr=subprocess.STDOUT, env=env)))
        print(f"{args.workers} workers started (logs: {out}/rank<r>/log.txt)", file=sys.stderr)
        for r, _, proc in procs:
            code = proc.wait()
            print(f"rank {r}: exit {code}", file=sys.stderr)
            if code:
                failed.append(r)
    except KeyboardInterrupt:  # each worker flushes and writes what it did, then we merge it
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, _, proc in procs:
            proc.wait()
    finally:
        for _, log_file, _ in procs:
            log_file.close()
    for r, _, proc in procs:  # a worker that found another job's timing.json wrote beside it
        mine = timing[r].with_name(f"{timing[r].stem}.p{proc.pid}{timing[r].suffix}")
        timing[r] = mine if mine.is_file() else timing[r]
    done = [t for t in timing if t.is_file()]
    if failed and not stopped:
        print(f"resettrace: worker(s) {failed} failed: see {out}/rank<r>/log.txt",
              file=sys.stderr)
        return 2
    code = _command(str(out / "merged.json"), lambda: merge_runs(load_runs(done)).to_json(),
                    render_merge) if done else 2
    if stopped:
        name = "SIGINT" if stopped[0] == signal.SIGINT else "SIGTERM"
        print(f"resettrace: interrupted by {name}: merged the {len(done)} of {args.workers} "
              "workers' runs written", file=sys.stderr)
        return 128 + int(stopped[0])
    return code


def _report(args: argparse.Namespace) -> int:
    from resettrace import outputs
    from resettrace.analysis.report import write_report

    if _refused([(args.output, outputs.REPORT_HTML)]):
        return 2
    try:
        path = write_report(args.run, args.output, compare_base=args.compare)
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def _compare_aa(args: argparse.Namespace) -> int:
    from resettrace import outputs
    from resettrace.analysis.compare import aa_false_positive_rate, load_runs

    if args.json and _refused([(args.json, outputs.JSON)]):
        return 2
    try:
        options = _compare_options(args)
        if args.pairs < 1:
            raise ValueError(f"--pairs must be >= 1, got {args.pairs}")
        runs = load_runs(args.run)
        results = [aa_false_positive_rate(r, args.pairs, **options) for r in runs]
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    flagged = sum(r["false_positives"] for r in results)
    total = sum(r["verdicts"] for r in results)
    print(f"A/A: {args.pairs} pairs of consecutive pieces per run, {len(runs)} run(s): "
          f"{flagged} of {total} key verdicts not 'within noise' "
          f"(false-positive rate {100 * flagged / max(total, 1):.2f}%)")
    for r in results:
        for key, n in sorted(r["flagged_keys"].items()):
            print(f"  {key}: flagged in {n} of {r['pairs']} pairs")
    return _save_json(args.json, {"runs": [r.source for r in runs], "results": results})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="resettrace: %(levelname)s: %(message)s")
    from resettrace.extras import MissingExtra, require

    try:
        # a command whose extra is not installed: one line naming it, before any work
        needs = list(getattr(args, "needs", ()))
        if args.func is _collector and args.report:
            needs.append("report")
        for extra in needs:
            require(extra, " ".join(["resettrace", args.command]
                                    + ([args.bench] if args.command == "bench" else [])))
        return int(args.func(args))
    except MissingExtra as e:  # (and one a command's own call found)
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # before or after the timed part: no traceback
        print("resettrace: interrupted", file=sys.stderr)
        return 128 + int(getattr(e, "signum", signal.SIGINT))
    finally:
        from resettrace import outputs

        outputs.release_claims()  # the command is over: its output paths are free


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
