"""Output paths (resettrace.outputs): a symbolic link is never followed, and a file that is not
resettrace's is never destroyed, for span files, the JSON / CSV / HTML writers and the CLI.

Real files and real processes: the export child process writes the span files, and the CLI
runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import OVERLAPPING_JOB, record_traces
from resettrace import __version__
from resettrace.config import Config
from resettrace.tables import CSV_COLUMNS, write_json
from resettrace.tracing.session import Tracing

pytest_plugins = ["pytester"]

#: exporter kind -> a file suffix
FORMATS = {"file": ".jsonl", "perfetto": ".json", "otlp-json": ".otlp.jsonl",
           "jaeger-json": ".jaeger.json"}
VICTIM = b"root's file, 31 bytes long....\n"
FOREIGN = b"".join(b"line %d of unrelated data\n" % i for i in range(1000))
RESETTRACE = str(Path(sys.executable).parent / "resettrace")


def _export(specs: list[str], traces: int) -> dict[str, Any]:
    """A trace session through the export process; its export report after shutdown."""
    session = Tracing(Config(mode="trace", exporters=tuple(specs)))
    record_traces(session, traces, plan=False)
    session.shutdown(timeout_s=60)  # returns once delivered: room for a loaded machine
    return session.export_report()


def _span_count(path: Path, kind: str) -> int:
    """Spans in a span file of ``kind``, read as its viewer would."""
    text = path.read_text()
    if kind == "file":
        return len([json.loads(line) for line in text.splitlines()])
    if kind == "perfetto":
        return sum(e["ph"] == "X" for e in json.loads(text)["traceEvents"])
    if kind == "otlp-json":
        return sum(len(ss["spans"]) for line in text.splitlines()
                   for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"])
    return sum(len(t["spans"]) for t in json.loads(text)["data"])


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESETTRACE", "OTEL_")) and k != "PYTHONPATH"}
    env.update(extra)
    return env


def _cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RESETTRACE, *args], cwd=cwd, env=_clean_env(**env),
                          capture_output=True, text=True, timeout=120)


def _one_line_refusal(r: subprocess.CompletedProcess[str], path: Path, what: str) -> None:
    """Exit 2 and exactly one stderr line, naming the path and what is there; no traceback."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(path) in lines[0] and what in lines[0], lines[0]


# -- span files -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(FORMATS))
def test_a_symlink_at_a_span_file_path_is_refused_and_its_target_untouched(
        tmp_path: Path, kind: str, capfd: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.conf"
    victim.write_bytes(VICTIM)
    link = tmp_path / f"spans{FORMATS[kind]}"
    link.symlink_to(victim)
    spec = f"{kind}:{link}"
    report = _export([spec], traces=50)
    assert victim.read_bytes() == VICTIM  # bytes and size unchanged
    assert link.is_symlink() and os.readlink(link) == str(victim)
    e = report["exporters"][spec]
    assert report["spans_sent"] == 100
    assert e["delivered"] == 0 and e["undelivered"] == 100  # counted as not delivered
    assert "path" not in e  # no file was written
    assert str(link) in e["error"] and "symbolic link" in e["error"]
    said = [line for line in capfd.readouterr().err.splitlines() if "symbolic link" in line]
    assert len(said) == 1 and str(link) in said[0]  # one line, from the export process


@pytest.mark.parametrize("kind", list(FORMATS))
def test_a_foreign_file_is_kept_and_spans_go_beside_it_while_resettraces_own_is_rewritten(
        tmp_path: Path, kind: str, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    suffix = FORMATS[kind]
    own, foreign = tmp_path / f"own{suffix}", tmp_path / f"data{suffix}"
    foreign.write_bytes(FOREIGN)
    beside = foreign.with_name(f"{foreign.stem}.1{foreign.suffix}")
    specs = [f"{kind}:{own}", f"{kind}:{foreign}"]
    for traces in (30, 7):  # a second run over the first one's files (make demo, again)
        report = _export(specs, traces)
        assert foreign.read_bytes() == FOREIGN  # byte for byte
        assert report["exporters"][specs[0]]["path"] == str(own)
        assert report["exporters"][specs[1]]["path"] == str(beside)  # the file written
        for spec in specs:
            assert report["exporters"][spec]["undelivered"] == 0
        assert _span_count(own, kind) == _span_count(beside, kind) == 2 * traces  # in place
        # a warning naming both, from the training process (which opens the file at set-up)
        lines = capfd.readouterr().err.splitlines() + [r.getMessage() for r in caplog.records]
        caplog.clear()
        said = [line for line in lines if str(foreign) in line]
        assert len(said) == 1 and str(beside) in said[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([own.name, foreign.name,
                                                                 beside.name])


def test_a_fifo_at_a_span_file_path_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "spans.jsonl"
    os.mkfifo(fifo)
    spec = f"file:{fifo}"
    report = _export([spec], traces=10)  # opening a FIFO for writing would wait for a reader
    e = report["exporters"][spec]
    assert e["delivered"] == 0 and e["undelivered"] == 20
    assert "FIFO" in e["error"] and str(fifo) in e["error"]


# -- files written whole --------------------------------------------------------------------------

def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.conf"
    victim.write_bytes(VICTIM)
    target = tmp_path / "timing.json"
    planted = tmp_path / "timing.json.tmp"  # the atomic writer's first temporary name
    planted.symlink_to(victim)
    written = write_json(target, {"config": {"num_envs": 4}})
    assert victim.read_bytes() == VICTIM
    assert planted.is_symlink() and os.readlink(planted) == str(victim)  # left as it was
    assert not target.is_symlink() and written == target
    assert json.loads(target.read_text())["config"] == {"num_envs": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timing.json", "timing.json.tmp",
                                                          "victim.conf"]


def test_write_json_keeps_a_foreign_file_and_rewrites_its_own_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    path.write_bytes(FOREIGN)
    beside = tmp_path / "stats.1.json"
    first = write_json(path, {"stats": {"a": 1}})
    assert path.read_bytes() == FOREIGN
    assert first == beside
    assert write_json(path, {"stats": {"a": 2}}) == beside  # its own: rewritten in place
    assert json.loads(beside.read_text()) == {"resettrace": __version__, "stats": {"a": 2}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.1.json", "stats.json"]


def test_write_csv_rewrites_its_own_file_in_place_and_keeps_a_foreign_one(
        tmp_path: Path) -> None:
    from resettrace.tables import write_csv

    stats = {"env_step_total_ms": {"count": 3, "mean_ms": 1.0, "p50_ms": 1.0, "p90_ms": 1.0,
                                   "p99_ms": 1.0, "max_ms": 1.0, "total_ms": 3.0}}
    own, foreign = tmp_path / "timing.csv", tmp_path / "data.csv"
    foreign.write_bytes(FOREIGN)
    for _ in range(2):
        write_csv(own, stats)
        write_csv(foreign, stats)
    assert foreign.read_bytes() == FOREIGN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.1.csv", "data.csv",
                                                          "timing.csv"]
    assert own.read_text().splitlines()[1].startswith("env_step_total_ms,3,")


# -- the CLI --------------------------------------------------------------------------------------

COLLECTOR = ["bench", "collector", "--num-envs", "4", "--warmup", "0", "--steps", "3",
             "--nthread", "1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small collector run: its folder holds timing.json."""
    out = tmp_path_factory.mktemp("run")
    r = _cli(*COLLECTOR, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_collector_refuses_a_symlink_at_timing_json_before_its_run(tmp_path: Path) -> None:
    victim = tmp_path / "victim.conf"
    victim.write_bytes(VICTIM)
    out = tmp_path / "run"
    out.mkdir()
    (out / "timing.json").symlink_to(victim)
    r = _cli(*COLLECTOR, "--out", str(out))
    _one_line_refusal(r, out / "timing.json", "symbolic link")
    assert "env/s" not in r.stdout  # said before the run, not after it
    assert victim.read_bytes() == VICTIM


def test_collector_rerun_rewrites_its_own_outputs_and_writes_beside_foreign_ones(
        tmp_path: Path) -> None:
    out = tmp_path / "demo"
    first = _cli(*COLLECTOR, "--out", str(out), "--report", RESETTRACE="trace")
    assert first.returncode == 0, first.stderr
    (out / "timing.json").write_bytes(FOREIGN)  # someone's files, where resettrace wrote
    (out / "spans.jsonl").write_bytes(FOREIGN)
    before = {name: (out / name).stat().st_ino for name in ("timing.csv", "report.html")}
    r = _cli(*COLLECTOR, "--out", str(out), "--report", "--seed", "1", RESETTRACE="trace")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert (out / "timing.json").read_bytes() == FOREIGN
    assert (out / "spans.jsonl").read_bytes() == FOREIGN
    assert json.loads((out / "timing.1.json").read_text())["config"]["seed"] == 1
    assert json.loads((out / "spans.1.jsonl").read_text().splitlines()[0])["name"]
    # the list of outputs names the files written
    listed = r.stdout.split("outputs:")[1].split()
    assert listed == [str(out / n) for n in ("timing.1.json", "timing.csv", "report.html",
                                             "spans.1.jsonl")]
    # its own outputs of the first run: replaced in place, no NAME.1 of theirs
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["timing.json", "timing.1.json", "timing.csv", "report.html", "spans.jsonl",
         "spans.1.jsonl"])
    assert all((out / n).stat().st_ino != ino for n, ino in before.items())  # rewritten
    assert str(out / "timing.1.json") in (out / "report.html").read_text()  # its source
    warned = [line for line in r.stderr.splitlines() if "beside" in line]
    assert len(warned) == 2


def _plant(tmp_path: Path, name: str, how: str) -> tuple[Path, Path, bytes]:
    """A symbolic link to a victim file, a FIFO, or a foreign file at ``name``: the path,
    the file whose bytes must survive, and those bytes."""
    path = tmp_path / name
    if how == "symlink":
        victim = tmp_path / "victim.conf"
        victim.write_bytes(VICTIM)
        path.symlink_to(victim)
        return path, victim, VICTIM
    if how == "fifo":
        os.mkfifo(path)
        return path, path, b""
    path.write_bytes(FOREIGN)
    return path, path, FOREIGN


#: command, output file name, and the arguments that write it (RUN: the collector run)
COMMANDS = {
    "merge -o": ("merged.json", ["merge", "RUN", "-o", "OUT"]),
    "fit --json": ("fit.json", ["fit", "RUN", "--json", "OUT"]),
    "report -o": ("report.html", ["report", "RUN", "-o", "OUT"]),
}


@pytest.mark.parametrize("how", ["symlink", "fifo"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_refuses_a_symlink_or_a_fifo_at_its_output(tmp_path: Path, run_dir: Path,
                                                       command: str, how: str) -> None:
    name, args = COMMANDS[command]
    path, keep, data = _plant(tmp_path, name, how)
    r = _cli(*[str(run_dir) if a == "RUN" else str(path) if a == "OUT" else a for a in args])
    _one_line_refusal(r, path, "symbolic link" if how == "symlink" else "FIFO")
    if how == "symlink":
        assert keep.read_bytes() == data and path.is_symlink()
    else:
        assert path.is_fifo()  # not replaced by a file


@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_writes_beside_a_foreign_file_and_names_it(tmp_path: Path, run_dir: Path,
                                                       command: str) -> None:
    name, args = COMMANDS[command]
    path, _, _ = _plant(tmp_path, name, "foreign")
    beside = path.with_name(f"{path.stem}.1{path.suffix}")
    r = _cli(*[str(run_dir) if a == "RUN" else str(path) if a == "OUT" else a for a in args])
    assert r.returncode == 0, r.stderr
    assert path.read_bytes() == FOREIGN
    assert beside.stat().st_size > 0
    said = "report: " if command == "report -o" else "wrote "
    assert f"{said}{beside}" in r.stdout and f"{said}{path}\n" not in r.stdout
    warned = [line for line in r.stderr.splitlines() if "beside" in line]
    assert len(warned) == 1 and str(path) in warned[0] and str(beside) in warned[0]


def test_run_stats_json_refuses_a_symlink_before_the_command_runs(tmp_path: Path) -> None:
    path, victim, _ = _plant(tmp_path, "stats.json", "symlink")
    r = _cli("run", "--stats-json", str(path), "--", sys.executable, "-c",
             "open('ran', 'w').close()", cwd=tmp_path)
    _one_line_refusal(r, path, "symbolic link")
    assert not (tmp_path / "ran").exists()
    assert victim.read_bytes() == VICTIM


def test_run_stats_json_beside_a_foreign_file(tmp_path: Path) -> None:
    path, _, _ = _plant(tmp_path, "stats.json", "foreign")
    script = ("import resettrace\nwith resettrace.current_recorder().scope('dr_reset', 1):\n"
              "    open('ran', 'w').close()\n")
    r = _cli("run", "--no-summary", "--stats-json", str(path), "--", sys.executable, "-c",
             script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ran").exists() and path.read_bytes() == FOREIGN
    stats = json.loads((tmp_path / "stats.1.json").read_text())  # the job's record
    assert stats["mode"] == "timing" and stats["members"][0]["pid"] > 0
    warned = r.stderr.strip().splitlines()
    assert len(warned) == 1 and str(tmp_path / "stats.1.json") in warned[0]


# -- two jobs on one path -------------------------------------------------------------------------

JOB = OVERLAPPING_JOB


def _job_env() -> dict[str, str]:
    """A child's environment that imports the resettrace under test (PYTHONPATH kept)."""
    env = _clean_env()
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _run_job(tmp_path: Path, started: str, wait: str) -> subprocess.Popen[str]:
    """``resettrace run --stats-json stats.json`` of :data:`JOB`, started."""
    return subprocess.Popen(
        [sys.executable, "-m", "resettrace.cli", "run", "--no-summary", "--stats-json",
         "stats.json", "--", sys.executable, "job.py", started, wait], cwd=tmp_path,
        env=_job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    """Wait until ``path`` exists (the job got there) or ``proc`` ended."""
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)


def _job_pids(path: Path) -> list[int]:
    """The pids of the processes in the job record at ``path``."""
    return [m["pid"] for m in json.loads(path.read_text())["members"]]


@pytest.mark.parametrize("first_done", ["second", "first"])
def test_two_overlapping_runs_on_one_stats_json_keep_both_records(tmp_path: Path,
                                                                  first_done: str) -> None:
    """Two ``resettrace run --stats-json stats.json`` jobs at once: the one that writes last
    keeps the other's record and writes its own beside it, in one line naming both."""
    (tmp_path / "job.py").write_text(JOB)
    stats = tmp_path / "stats.json"
    # job 1 starts and records, then waits; job 2 starts while job 1 runs
    one = _run_job(tmp_path, "one-started", "two-done" if first_done == "second" else "go-one")
    _wait_for(tmp_path / "one-started", one)
    two = _run_job(tmp_path, "two-started", "-" if first_done == "second" else "one-done")
    _wait_for(tmp_path / "two-started", two)
    if first_done == "second":  # job 2 ends (writes stats.json) while job 1 still runs
        early, late = two, one
        out_early, err_early = two.communicate(timeout=120)
        (tmp_path / "two-done").touch()
    else:  # job 1 ends first, job 2 still runs
        early, late = one, two
        (tmp_path / "go-one").touch()
        out_early, err_early = one.communicate(timeout=120)
        (tmp_path / "one-done").touch()
    out_late, err_late = late.communicate(timeout=120)
    assert early.returncode == 0 and late.returncode == 0, (err_early, err_late)
    assert err_early == ""  # the path was its own: replaced quietly
    beside = tmp_path / f"stats.p{late.pid}.json"
    # both records survive: the one written first at the path, the later one beside it
    assert _job_pids(stats) == [int(out_early)]
    assert _job_pids(beside) == [int(out_late)]
    warned = err_late.strip().splitlines()
    assert len(warned) == 1 and str(stats) in warned[0] and str(beside) in warned[0], warned
    assert "another job" in warned[0] and "Traceback" not in err_late


def test_a_rerun_after_the_first_job_ended_rewrites_stats_json_in_place(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    stats = tmp_path / "stats.json"
    pids = []
    for n in range(2):
        job = _run_job(tmp_path, f"started-{n}", "-")
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0 and err == "", err
        assert _job_pids(stats) == [int(out)]  # this run's record, at the path
        pids.append(int(out))
    assert pids[0] != pids[1]
    assert not list(tmp_path.glob("stats.p*.json"))


#: output kind (its name in resettrace.outputs), a file name, and its contents, numbered
WHOLE_FILES = {
    "JSON": ("timing.json", b'{\n "resettrace": "0", "n": %d}\n'),
    "CSV": ("timing.csv", (",".join(CSV_COLUMNS) + "\n%d\n").encode()),
    "REPORT_HTML": ("report.html", b'<!DOCTYPE html>\n<html lang="en"><head><meta '
                                   b'charset="utf-8"><title>resettrace report: %d</title>'),
}


@pytest.mark.parametrize("kind", list(WHOLE_FILES))
def test_a_file_another_process_wrote_since_the_claim_is_kept(
        tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """The writers of ``--json``, ``timing.json``, ``timing.csv`` and ``report.html``: a
    job that claimed its path at its start keeps a file another job wrote there since."""
    from resettrace import outputs

    what = getattr(outputs, kind)
    name, head = WHOLE_FILES[kind]
    path = tmp_path / name
    outputs.write_output(path, what, head % 0)  # an earlier run's: this job's to replace
    try:
        assert outputs.claim_output(path, what) == path  # this job starts
        other = subprocess.run(  # another job writes the path meanwhile
            [sys.executable, "-c", "import sys; from resettrace import outputs; "
             f"outputs.write_output(sys.argv[1], outputs.{kind}, sys.argv[2].encode())",
             str(path), (head % 1).decode()],
            env=_job_env(), capture_output=True, text=True, timeout=120)
        assert other.returncode == 0 and other.stderr == "", other.stderr
        with caplog.at_level("WARNING", logger="resettrace.outputs"):
            first = outputs.write_output(path, what, head % 2)
            again = outputs.write_output(path, what, head % 3)  # this job's own now
    finally:
        outputs.release_claims()
    beside = path.with_name(f"{path.stem}.p{os.getpid()}{path.suffix}")
    assert first == again == beside
    assert path.read_bytes() == head % 1 and beside.read_bytes() == head % 3
    assert len(caplog.records) == 1
    assert str(path) in caplog.messages[0] and str(beside) in caplog.messages[0]
    # the next job (claims released) replaces the path in place, as a rerun does
    assert outputs.write_output(path, what, head % 4) == path
    assert path.read_bytes() == head % 4


#: a job that claims argv[1] at its start, touches argv[2], waits for argv[3], then writes
#: argv[1] (its pid in it) and prints the path it wrote
CLAIMED_WRITER = """import os, sys, time
from pathlib import Path
from resettrace import outputs
outputs.claim_output(sys.argv[1], outputs.JSON)
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.01)
data = b'{\\n "resettrace": "0", "pid": %d}\\n' % os.getpid()
print(outputs.write_output(sys.argv[1], outputs.JSON, data), flush=True)
"""


def _lock_waiters(inode: int) -> int:
    """Processes waiting for a lock of the file ``inode`` (Linux's /proc/locks)."""
    return sum("->" in line and line.split()[-3].endswith(f":{inode}")
               for line in Path("/proc/locks").read_text().splitlines())


def test_two_jobs_writing_one_path_at_the_same_moment_keep_both_files(tmp_path: Path) -> None:
    """The check and the replace of two jobs' writes never interleave: both are let go at
    once (waiting on the folder's lock), and the second to get it writes beside."""
    import fcntl

    folder = tmp_path / "out"
    folder.mkdir()
    path = folder / "stats.json"
    (tmp_path / "w.py").write_text(CLAIMED_WRITER)
    jobs = [subprocess.Popen([sys.executable, "w.py", str(path), f"ready-{n}", "go"],
                             cwd=tmp_path, env=_job_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for n in range(2)]
    for n, job in enumerate(jobs):
        _wait_for(tmp_path / f"ready-{n}", job)  # both claimed the path (absent)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (tmp_path / "go").touch()
        while _lock_waiters(folder.stat().st_ino) < 2:  # both at the check, waiting
            assert all(job.poll() is None for job in jobs), [j.communicate() for j in jobs]
            time.sleep(0.01)
    finally:
        os.close(fd)  # both go on at once
    results = [job.communicate(timeout=120) for job in jobs]
    assert all(job.returncode == 0 for job in jobs), results
    written = {Path(out.strip()): job.pid for job, (out, _) in zip(jobs, results, strict=True)}
    second = next(pid for p, pid in written.items() if p != path)
    beside = folder / f"stats.p{second}.json"
    assert set(written) == {path, beside}
    for p, pid in written.items():  # each file holds its own job's data
        assert json.loads(p.read_text())["pid"] == pid
    warned = [err for _, err in results if err]
    assert len(warned) == 1 and len(warned[0].strip().splitlines()) == 1
    assert str(path) in warned[0] and str(beside) in warned[0]


def test_collector_workers_refuse_a_symlink_at_a_log_file(tmp_path: Path) -> None:
    out = tmp_path / "job"
    (out / "rank0").mkdir(parents=True)
    path, victim, _ = _plant(out / "rank0", "log.txt", "symlink")
    r = _cli(*COLLECTOR, "--workers", "2", "--out", str(out))
    _one_line_refusal(r, path, "symbolic link")
    assert victim.read_bytes() == VICTIM
    assert not (out / "rank1").exists()  # no worker started


def test_worker_logs_are_rewritten_in_place_and_foreign_ones_kept(tmp_path: Path) -> None:
    from resettrace import outputs

    folder = tmp_path / "rank0"
    header = outputs.worker_log_header(0, "bench collector")
    for _ in range(2):
        path, f = outputs.open_output(folder / "log.txt", outputs.WORKER_LOG)
        with f:
            f.write(header + b"step 1/1\n")
        assert path == folder / "log.txt"
    (folder / "log.txt").write_bytes(FOREIGN)
    path, f = outputs.open_output(folder / "log.txt", outputs.WORKER_LOG)
    f.close()
    assert path == folder / "log.1.txt" and (folder / "log.txt").read_bytes() == FOREIGN


# -- the pytest plugin ----------------------------------------------------------------------------

INNER = """
    def test_uses_the_fixture(resettrace):
        assert resettrace.stats() == {}
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("RESETTRACE", "off")
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile(test_inner=INNER)
    return pytester


def test_resettrace_json_at_a_symlink_is_a_usage_error(inner: pytest.Pytester) -> None:
    path, victim, _ = _plant(inner.path, "stats.json", "symlink")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "--resettrace-json",
                                        "stats.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*cannot write {path}: it is a symbolic link*"])
    assert "Traceback" not in result.stderr.str()
    assert victim.read_bytes() == VICTIM


def test_resettrace_json_beside_a_foreign_file(inner: pytest.Pytester) -> None:
    path, _, _ = _plant(inner.path, "stats.json", "foreign")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "--resettrace-json",
                                        "stats.json")
    result.assert_outcomes(passed=1)
    beside = inner.path / "stats.1.json"
    result.stdout.fnmatch_lines([f"resettrace: stats of 1 test written to {beside} *"])
    assert path.read_bytes() == FOREIGN
    assert list(json.loads(beside.read_text())["tests"]) == ["test_inner.py::"
                                                             "test_uses_the_fixture"]
