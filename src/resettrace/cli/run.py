"""``resettrace run [--instrument SPEC] -- COMMAND ...``: the command supervised with
resettrace installed in each of its Python processes, its job's record merged at the end."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from resettrace.cli.common import (
    refused,
    refused_endpoint,
    write_error,
)
from resettrace.config import Config

log = logging.getLogger("resettrace")


def cmd_run(args: argparse.Namespace) -> int:
    """Run COMMAND with resettrace's ``sitecustomize`` first on ``PYTHONPATH``; then merge
    the run records its processes wrote into the job's record, and print it."""
    from resettrace import _run as run_dir
    from resettrace.config import (
        ENV_INSTRUMENT,
        ENV_MODE,
        ENV_RUN_ID,
        ENV_RUN_JSON,
        ENV_RUN_OWNER,
        ENV_RUN_SUMMARY,
    )
    from resettrace.instrumentation import InstrumentError, check_spec
    from resettrace.launcher import ENV_PARENT_RANK

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
    if refused_endpoint(run_cfg):
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
        if not own and refused([(stats_json, outputs.JSON)]):
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
    from resettrace.merging import merge_records

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
    if job.extra.get("devices"):
        print("resettrace run: env counts lived on " + ", ".join(job.extra["devices"])
              + ": the spans time the host, so a phase that launches device work shows its "
              "launch, and the work shows where the host next waits for it "
              "(docs/instrument.md, \"On a GPU\")", file=sys.stderr)
    lost = (job.extra.get("device_counts") or {}).get("lost")
    if lost:
        print(f"resettrace run: {lost} env counts on a device never arrived (the device "
              "was still busy at shutdown, or too many traces waited): those calls have no"
              " count", file=sys.stderr)
    job.extra["incomplete"] = notes["incomplete"]
    job.extra["missing"] = notes["missing"]
    written: Path | None = None
    if job_path is not None:
        from resettrace.tables import write_json

        try:
            written = write_json(job_path, job.to_json())
        except OSError as e:
            print(f"resettrace run: {write_error(job_path, e)}", file=sys.stderr)
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
