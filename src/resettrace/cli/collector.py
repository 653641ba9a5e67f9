"""``resettrace bench collector``: one run, or ``--workers`` spawned workers merged into
one job."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from resettrace.cli.common import (
    refused,
    refused_endpoint,
    run_command,
    write_error,
)
from resettrace.config import Config

log = logging.getLogger("resettrace")


def cmd_collector(args: argparse.Namespace) -> int:
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
        return collector_workers(args, cfg)
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
        if refused_endpoint(env_cfg):
            print(f"resettrace: {env_cfg.otlp_refused}", file=sys.stderr)
            return 2
        run_cfg = collector.session_config(cfg, env_cfg)
    except ValueError as e:  # contradictory settings
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    if refused(collector.planned_outputs(cfg, run_cfg, report=args.report)):
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
        print(f"resettrace: {write_error(f'the outputs to {args.out}', e)}", file=sys.stderr)
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


def collector_workers(args: argparse.Namespace, cfg: Any) -> int:
    """``bench collector --workers W``: W spawned CLI processes, one rank each, then merged.
    Each worker gets ``cfg`` itself (its own seed, engine threads and folder), so every
    setting reaches it."""
    import subprocess

    from resettrace.analysis.job_lines import render_merge
    from resettrace.merging import load_runs, merge_runs

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
    if refused(files):
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
                print(f"resettrace: {write_error(ranks[r] / 'log.txt', e)}", file=sys.stderr)
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
    code = run_command(str(out / "merged.json"), lambda: merge_runs(load_runs(done)).to_json(),
                    render_merge) if done else 2
    if stopped:
        name = "SIGINT" if stopped[0] == signal.SIGINT else "SIGTERM"
        print(f"resettrace: interrupted by {name}: merged the {len(done)} of {args.workers} "
              "workers' runs written", file=sys.stderr)
        return 128 + int(stopped[0])
    return code
