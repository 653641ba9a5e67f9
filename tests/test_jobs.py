"""One job, not one process: records that survive kills, members waited for, identities.

Real processes under ``resettrace run``: a worker killed with SIGKILL leaves its last
snapshot and the job says what it may miss; a member still running when the command
ends is waited for (and, past ``RESETTRACE_JOB_WAIT``, merged as of its snapshot and
said); ranks come from the launcher's variables, and ranks a launcher's world size names
but no process wrote are said; targets one process never imported are not reported when
another did.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers import clean_env
from resettrace.launcher import identity

WORK = "def work(i):\n    return i * 2\n"
SPEC = '[instrument]\n"rr_work:work" = "env_step"\n"never_imported_mod:f" = "env_step"\n'

#: helpers every script below uses: wait for a condition on the run's record files
WAITING = """
import glob, json, os, time

def record(pid):
    try:
        with open(f"out/job.{pid}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def wait_for(cond, what):
    deadline = time.monotonic() + 120
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)

def calls(data):
    return (data or {}).get("stats", {}).get("env_step_total_ms", {}).get("count", 0)
"""


def _run(folder: Path, script: str, *args: str, **extra: str
         ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    (folder / "rr_work.py").write_text(WORK)
    (folder / "spec.toml").write_text(SPEC)
    (folder / "waiting.py").write_text(WAITING)
    (folder / "never_imported_mod.py").write_text("def f():\n    pass\n")
    (folder / "main.py").write_text(textwrap.dedent(script))
    env = {"RESETTRACE_RECORD_PERIOD": "0.2", **extra}
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "run", "--instrument",
                        "spec.toml", "--stats-json", "out/job.json", "--", sys.executable,
                        "main.py", *args], cwd=folder, env=clean_env(**env),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def _job(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "out" / "job.json").read_text())


def _calls(data: dict[str, Any]) -> int:
    return int((data["stats"].get("env_step_total_ms") or {}).get("count", 0))


KILLED = """
    import json, multiprocessing as mp, os, signal, sys, time
    import rr_work
    from waiting import record, wait_for, calls

    def worker():
        for i in range(7):
            rr_work.work(i)
        while True:  # still training when the OOM killer (or a scheduler) strikes
            time.sleep(0.05)

    if __name__ == "__main__":
        rr_work.work(0)
        p = mp.get_context(sys.argv[1]).Process(target=worker)
        p.start()
        wait_for(lambda: calls(record(p.pid)) == 7, "the worker's snapshot")
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        print(json.dumps({"main": os.getpid(), "worker": p.pid, "code": p.exitcode}))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_killed_worker_leaves_its_last_snapshot_and_the_job_says_so(tmp_path: Path,
                                                                      method: str) -> None:
    r, out = _run(tmp_path, KILLED, method)
    assert out["code"] == -9
    snap = json.loads((tmp_path / "out" / f"job.{out['worker']}.json").read_text())
    assert snap["complete"] is False and snap["snapshot_at"] and snap["period_s"] == 0.2
    assert _calls(snap) == 7 and snap["samples"] == {}  # a snapshot: buckets, no samples
    assert snap["identity"] == "rank 1" and snap["launcher"] == "multiprocessing"
    main = json.loads((tmp_path / "out" / f"job.{out['main']}.json").read_text())
    assert main["complete"] is True and len(main["samples"]["env_step_total_ms"]) == 1
    job = _job(tmp_path)
    assert _calls(job) == 8 and len(job["members"]) == 2
    assert [m["identity"] for m in job["incomplete"]] == ["rank 1"]
    line = re.search(r"^resettrace run: 1 member incomplete: rank 1 \(pid (\d+)\) ended "
                     r"without writing its record.*may miss up to 0.2 s", r.stderr, re.M)
    assert line and int(line.group(1)) == out["worker"], r.stderr
    # read again later: the folder is the job, and the snapshot is said as one
    m = subprocess.run([sys.executable, "-m", "resettrace.cli", "merge", "out"], cwd=tmp_path,
                       env=clean_env(), capture_output=True, text=True, timeout=300)
    assert m.returncode == 0, m.stderr
    assert f"INCOMPLETE: rank 1 (pid {out['worker']}): a snapshot taken while it ran (it " \
           "may miss up to 0.2 s, if it was killed then)" in m.stdout, m.stdout
    assert re.search(r"^job\s+2\s+8\s", m.stdout, re.M), m.stdout


LATE = """
    import json, os, subprocess, sys
    import rr_work

    if __name__ == "__main__":
        rr_work.work(0)
        env = dict(os.environ, RESETTRACE_WORKER_RANK="1")
        # a member that goes on after the command's main process ends (an actor of a
        # cluster that outlives its driver, a process of another launcher)
        child = subprocess.Popen([sys.executable, "late.py", str(os.getpid())], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open("child.pid", "w") as f:
            f.write(str(child.pid))
        from waiting import record, wait_for, calls
        wait_for(lambda: calls(record(child.pid)) == 3, "the child's first snapshot")
        print(json.dumps({"main": os.getpid(), "child": child.pid}))
"""
LATE_CHILD = """
import os, sys, time
import rr_work

for i in range(3):
    rr_work.work(i)
parent = int(sys.argv[1])
while os.path.exists(f"/proc/{parent}"):  # until the main process has ended (and was
    time.sleep(0.02)                      # reaped: resettrace run is merging now)
time.sleep(2)  # so that the run finds this process running
while not os.path.exists(sys.argv[2] if len(sys.argv) > 2 else "/"):
    time.sleep(0.02)
for i in range(4):
    rr_work.work(i)
"""


def test_a_member_still_running_when_the_command_ends_is_waited_for(tmp_path: Path) -> None:
    (tmp_path / "late.py").write_text(LATE_CHILD)
    r, out = _run(tmp_path, LATE, RESETTRACE_JOB_WAIT="300")
    assert re.search(r"^resettrace run: waiting up to 300 s for 1 member still running or "
                     r"not yet written: rank 1$", r.stderr, re.M), r.stderr
    child = json.loads((tmp_path / "out" / f"job.{out['child']}.json").read_text())
    assert child["complete"] is True and _calls(child) == 7
    job = _job(tmp_path)
    assert _calls(job) == 8 and job["incomplete"] == [] and "incomplete" not in r.stderr


def test_a_member_running_past_the_wait_is_merged_as_of_its_snapshot(tmp_path: Path) -> None:
    script = LATE.replace('"late.py", str(os.getpid())', '"late.py", str(os.getpid()), "go"')
    (tmp_path / "late.py").write_text(LATE_CHILD)
    try:
        r, out = _run(tmp_path, script, RESETTRACE_JOB_WAIT="0.5")
        job = _job(tmp_path)
        assert _calls(job) == 4  # the main process's 1 and the child's 3 of its snapshot
        assert [m["state"] for m in job["incomplete"]] == ["running"]
        assert re.search(r"^resettrace run: 1 member incomplete: rank 1 \(pid \d+\) still "
                         r"running after 0.5 s: merged as of its last snapshot", r.stderr,
                         re.M), r.stderr
    finally:
        (tmp_path / "go").touch()  # the child ends
    pid = int((tmp_path / "child.pid").read_text())
    import time

    deadline = time.monotonic() + 120
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


RANKS = """
    import json, os, subprocess, sys
    if __name__ == "__main__":  # a launcher of its own: ranks 0 and 1 of a world of 3
        procs = [subprocess.Popen([sys.executable, "-c", "import rr_work; rr_work.work(1)"],
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE="3",
                                           LOCAL_RANK=str(r)))
                 for r in range(2)]
        print(json.dumps({"codes": [p.wait() for p in procs]}))
"""


def test_ranks_a_launchers_world_names_but_no_process_wrote_are_said(tmp_path: Path) -> None:
    r, out = _run(tmp_path, RANKS, RESETTRACE_JOB_WAIT="0.5")
    assert out["codes"] == [0, 0]
    job = _job(tmp_path)
    assert sorted(m["identity"] for m in job["members"]) == ["rank 0", "rank 1"]
    assert job["missing"] == [2]
    assert re.search(r"^resettrace run: 1 member incomplete: rank 2: no record$", r.stderr,
                     re.M), r.stderr
    # the main process imported no target and recorded nothing; rr_work:work was imported
    # by the ranks: only the module no process imported is said, once
    untraced = [x for x in r.stderr.splitlines() if "never imported" in x]
    # the run's folder is one run to every reader: the job, not its processes again
    rep = subprocess.run([sys.executable, "-m", "resettrace.cli", "report", "out", "-o",
                          "r.html"], cwd=tmp_path, env=clean_env(), capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert "2 processes" in (tmp_path / "r.html").read_text()
    assert untraced == ["resettrace run: instrument target(s) never imported, so never "
                        "traced: never_imported_mod:f (no process of the job imported them)"
                        ], r.stderr


@pytest.mark.parametrize("env,expected", [
    ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, ("rank 2", "torchrun", 2, 4)),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "3"}, ("rank 1", "slurm", 1, 3)),
    ({"RESETTRACE_WORKER_RANK": "5", "RANK": "2"}, ("rank 5", "resettrace", 5, None)),
    ({"RANK": "2", "WORLD_SIZE": "x"}, ("rank 2", "torchrun", 2, None)),
    ({}, ("rank 0", None, 0, None)),
])
def test_identity_comes_from_the_launcher(env: dict[str, str],
                                          expected: tuple[Any, ...]) -> None:
    from resettrace.launcher import process_rank

    rank = process_rank(env, publish=False)
    who = identity(rank, env)
    assert (who.identity, who.launcher, who.rank, who.world_size) == expected


def test_a_bad_record_period_is_said_once_and_the_default_used() -> None:
    code = ("import logging, resettrace.exit_record as r\n"
            "print(r.record_period(), r.record_period())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(RESETTRACE_RECORD_PERIOD="soon"), timeout=120)
    assert p.stdout.split() == ["5.0", "5.0"]
    lines = [x for x in p.stderr.splitlines() if "RESETTRACE_RECORD_PERIOD" in x]
    assert len(lines) == 1 and "'soon'" in lines[0], p.stderr


PARENT = """
import multiprocessing as mp

def worker():
    import rr_work  # only the worker imports the traced module
    rr_work.work(1)

if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=worker)
    p.start()
    p.join()
    print("exit", p.exitcode)
"""


def test_a_parent_whose_workers_import_the_targets_is_not_told_they_were_never_imported(
        tmp_path: Path) -> None:
    """Without ``resettrace run`` (``RESETTRACE_INSTRUMENT`` alone): the main process of a
    ``SubprocVecEnv`` never imports what its workers trace; it says nothing of it."""
    (tmp_path / "rr_work.py").write_text(WORK)
    (tmp_path / "spec.toml").write_text('[instrument]\n"rr_work:work" = "env_step"\n')
    (tmp_path / "main.py").write_text(PARENT)
    env = clean_env(RESETTRACE="timing", RESETTRACE_INSTRUMENT="spec.toml",
                    PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "exit 0", r.stderr
    assert "never imported" not in r.stderr, r.stderr
    # a process that started no worker still says it
    alone = subprocess.run([sys.executable, "-c", "import resettrace"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert "never imported, so never traced: rr_work:work" in alone.stderr, alone.stderr


def test_no_snapshot_is_being_written_while_the_process_forks() -> None:
    """A snapshot holds its folder's ``flock`` while it writes; a child forked meanwhile
    would keep that lock for its life and stop every later write of the parent. The fork
    waits for the snapshot being written (here: held by a thread, let go a little after
    the fork is asked for)."""
    import os
    import threading

    from resettrace import exit_record

    lock = threading.Lock()
    saved = dict(exit_record._SNAP)
    exit_record._SNAP.update(pid=os.getpid(), lock=lock)
    holding, forking, released = threading.Event(), threading.Event(), threading.Event()

    def writer() -> None:  # a snapshot being written
        with lock:
            holding.set()
            forking.wait(60)
            released.wait(0.3)  # (nothing sets it: a pause)
            released.set()

    t = threading.Thread(target=writer)
    t.start()
    try:
        holding.wait(60)
        forking.set()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if released.is_set() else 1)
        assert released.is_set()  # the parent went on only once the write was over
        assert os.waitpid(pid, 0)[1] == 0  # and the child was made after it
        assert lock.acquire(timeout=5)  # nothing left held in the parent
        lock.release()
    finally:
        t.join()
        exit_record._SNAP.update(saved)


TORCH_DIST = """
    import json, os, sys
    import torch.distributed as dist
    import torch.multiprocessing as tmp
    import rr_work

    def rank_main(r, store):
        # torch.multiprocessing.spawn gives the rank in code: no RANK variable is set
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=r, world_size=2)
        for i in range(3 + r):
            rr_work.work(i)
        dist.barrier()
        dist.destroy_process_group()  # gone by the time the record is written at exit

    if __name__ == "__main__":
        tmp.spawn(rank_main, args=(os.path.abspath("store"),), nprocs=2)
        print(json.dumps({"ok": True}))
"""


def test_ranks_of_torch_distributed_given_in_code(tmp_path: Path) -> None:
    r, out = _run(tmp_path, TORCH_DIST, RESETTRACE_JOB_WAIT="60")
    job = _job(tmp_path)
    records = {p.name: json.loads(p.read_text()) for p in (tmp_path / "out").glob("job.*.json")}
    members = sorted((d["identity"], d["launcher"], d["rank"], d["world_size"], _calls(d))
                     for d in records.values() if d["stats"])
    assert members == [("rank 0", "torch.distributed", 0, 2, 3),
                       ("rank 1", "torch.distributed", 1, 2, 4)], members
    assert _calls(job) == 7 and job["missing"] == [] and "duplicates" not in job, job


TWINS = """
    import json, os, subprocess, sys
    if __name__ == "__main__":  # two processes given one rank (a launcher's mistake)
        procs = [subprocess.Popen([sys.executable, "-c", "import rr_work; rr_work.work(1)"],
                                  env=dict(os.environ, RESETTRACE_WORKER_RANK="1"))
                 for _ in range(2)]
        print(json.dumps({"pids": [p.pid for p in procs], "codes": [p.wait() for p in procs]}))
"""


@pytest.mark.parametrize("summary", [True, False])
def test_two_members_with_one_identity_are_said(tmp_path: Path, summary: bool) -> None:
    (tmp_path / "rr_work.py").write_text(WORK)
    (tmp_path / "spec.toml").write_text('[instrument]\n"rr_work:work" = "env_step"\n')
    (tmp_path / "main.py").write_text(textwrap.dedent(TWINS))
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "run", "--instrument",
                        "spec.toml", "--stats-json", "out/job.json",
                        *([] if summary else ["--no-summary"]), "--", sys.executable,
                        "main.py"], cwd=tmp_path, env=clean_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    pids = json.loads(r.stdout.strip().splitlines()[-1])["pids"]
    job = _job(tmp_path)
    assert _calls(job) == 2 and len(job["members"]) == 2  # both merged: they ran
    assert len(job["duplicates"]) == 1 and job["duplicates"][0].startswith("rank 1: ")
    assert all(f"pid {p}" in job["duplicates"][0] for p in pids)
    said = [x for x in r.stderr.splitlines() if "rank 1: pid" in x]
    assert len(said) == 1, r.stderr


def test_the_ray_runtime_env_copies_no_credentials_and_keeps_the_users_own() -> None:
    import resettrace.ray as rr

    environ = {"RESETTRACE": "timing", "RESETTRACE_RUN_JSON": "/r/{pid}.json",
               "RESETTRACE_PARENT_RANK": "0::", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
               "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret",
               "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x=s3cret", "HOME": "/root"}
    env = rr.runtime_env({"env_vars": {"RESETTRACE": "trace", "MINE": "1"}, "pip": ["x"]},
                         environ=environ)
    got = env["env_vars"]
    assert env["pip"] == ["x"] and got["MINE"] == "1"
    assert got["RESETTRACE"] == "trace"  # the user's own setting wins
    assert got["RESETTRACE_RUN_JSON"] == "/r/{pid}.json"
    assert got["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://c:4317"
    assert "s3cret" not in json.dumps(env)  # credentials stay where the user put them
    assert "RESETTRACE_PARENT_RANK" not in got and "HOME" not in got
    assert got["PYTHONPATH"].split(os.pathsep)[1:] == ["${PYTHONPATH}"]
    with pytest.raises(TypeError, match="env_vars"):
        rr.runtime_env({"env_vars": ["RESETTRACE=timing"]})
