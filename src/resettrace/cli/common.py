"""What the commands share: output paths checked before the work, ``--json`` written,
a command's bad input as one line and exit code 2."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resettrace.config import Config

log = logging.getLogger("resettrace")


def refused_endpoint(config: Config) -> bool:
    """Whether an OTLP sink in use has an endpoint the environment named unusably: at the
    command line that stops before anything runs (in a user's process the sink sends
    nothing and counts its spans as failed)."""
    uses_otlp = (config.mode == "trace" and "otlp" in config.exporters) or (
        config.enabled and "otlp" in config.metrics)
    return bool(config.otlp_refused) and uses_otlp


def refused(paths: list[tuple[str | Path, Any]]) -> bool:
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
            print(f"resettrace: {write_error(path, e)}", file=sys.stderr)
            return True
    return False


def write_error(path: str | Path, e: OSError) -> str:
    from resettrace.outputs import OutputRefused

    return str(e) if isinstance(e, OutputRefused) else f"cannot write {path}: {e.strerror or e}"


def save_json(path: str | None, result: Any) -> int:
    """Write a benchmark's ``--json`` file (if asked): 0, or 2 with one line on failure."""
    if not path:
        return 0
    from resettrace.tables import write_json

    try:
        written = write_json(Path(path), result)
    except OSError as e:
        print(f"resettrace: {write_error(path, e)}", file=sys.stderr)
        return 2
    print(f"\nwrote {written}")
    return 0


def run_bench(args: argparse.Namespace, make_config: Callable[[], Any],
           run: Callable[..., dict[str, Any]], render: Callable[[dict[str, Any]], str]) -> int:
    """A benchmark command: its config (a bad value is one line, exit 2), the run (a model
    or task that cannot be used likewise), the table, and ``--json``."""
    return run_command(args.json, lambda: run(make_config(), progress=lambda m: print(
        m, file=sys.stderr, flush=True)), render)


def run_command(json_path: str | None, compute: Callable[[], dict[str, Any]],
             render: Callable[[dict[str, Any]], str]) -> int:
    """Compute a result (bad input: one line, exit 2), print it, and write ``--json``."""
    from resettrace import outputs

    if json_path and refused([(json_path, outputs.JSON)]):
        return 2
    try:
        result = compute()
    except (ValueError, FileNotFoundError) as e:
        print(f"resettrace: {e}", file=sys.stderr)
        return 2
    print(render(result))
    return save_json(json_path, result)
