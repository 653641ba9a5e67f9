"""Run records from real processes and real files.

``resettrace run`` on a small batched stack of the test's own (not the bundled env),
instrumented by a spec alone; its records read by ``compare``, ``merge``, ``fit`` and
``report``. Workers started every way (``multiprocessing`` fork, forkserver and spawn,
``concurrent.futures``, a ``Pool`` whose ``with`` exit terminates them) each leave exactly
one record with a rank of its own, and the job's counts are the sum of theirs; a helper
subprocess that records nothing leaves nothing. A collector ``timing.json`` of the format
before records is still read; a corrupt or foreign file is one line naming it, exit 2.
(Gymnasium's ``AsyncVectorEnv`` is not installed here: its workers are ``multiprocessing``
processes, covered by the same path.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# -- helpers -----------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without any resettrace or OpenTelemetry setting."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESETTRACE", "OTEL_")) and k not in ("PYTHONPATH", "RANK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def _cli(args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], cwd=cwd,
                          env=_env(**extra), capture_output=True, text=True, timeout=180)


def _write(folder: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))


def _records(folder: Path, stem: str = "job") -> dict[int, dict[str, Any]]:
    """The per-process records beside ``folder/STEM.json``, by pid (each file once)."""
    out: dict[int, dict[str, Any]] = {}
    for f in folder.glob(f"{stem}.*.json"):
        data = json.loads(f.read_text())
        assert data["kind"] == "process", f
        assert f.name == f"{stem}.{data['pid']}.json"
        assert data["pid"] not in out
        out[data["pid"]] = data
    return out


def _count(data: Mapping[str, Any], key: str = "env_step_total_ms") -> int:
    return int((data["stats"].get(key) or {}).get("count", 0))


def test_a_jobs_title_counts_its_processes() -> None:
    from resettrace.record import RunRecord

    one = RunRecord(kind="job", command=["python", "train.py"], members=[{}])
    two = RunRecord(kind="job", command=["python", "train.py"], members=[{}, {}])
    assert one.title == "python train.py, 1 process"
    assert two.title == "python train.py, 2 processes"
