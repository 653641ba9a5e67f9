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
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from helpers import OVERLAPPING_JOB, clean_env

# -- helpers -----------------------------------------------------------------------------------




def _cli(args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resettrace.cli", *args], cwd=cwd,
                          env=clean_env(**extra), capture_output=True, text=True, timeout=180)


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


# -- a stack of the test's own ----------------------------------------------------------------
#: a batched numpy "env" with a DR-like reset (plan -> terrain), no resettrace in it
STACK = """
    import numpy as np


    class TerrainDR:
        def __init__(self, num_envs, seed):
            self.rng = np.random.default_rng(seed)
            self.qpos = np.zeros((num_envs, 7))

        def reset(self, env_ids):
            self.qpos[env_ids] = self.plan(env_ids)

        def plan(self, env_ids):
            out = self.rng.normal(size=(len(env_ids), 7))
            out[:, 2] += self.terrain(env_ids)
            return out

        def terrain(self, env_ids):
            return self.rng.uniform(0.0, 0.1, size=len(env_ids))


    class BatchEnv:
        def __init__(self, num_envs, seed):
            self.num_envs = num_envs
            self.rng = np.random.default_rng(seed)
            self.dr = TerrainDR(num_envs, seed)
            self.age = np.zeros(num_envs)
            self.resets = 0

        def step(self, action):
            self.age += 1 + self.rng.integers(0, 3, size=self.num_envs) + 0 * action
            done = self.age > 12
            if done.any():
                self.reset_done(done)
            return self.age.copy()

        def reset_done(self, done):
            self.resets += 1
            self.reinit(np.flatnonzero(done))

        def reinit(self, ids):
            self.age[ids] = 0
            self.dr.reset(ids)
"""

TRAIN = """
    import sys

    import numpy as np

    from rr_stack import BatchEnv

    env = BatchEnv(16, seed=int(sys.argv[1]))
    for _ in range(150):
        env.step(np.zeros(16))
    print(f"resets {env.resets}")
"""

#: the env count in [attributes]; ``SPEC_ENV_COUNT_ARG`` reads it from the env instead
SPEC = """
    [attributes]
    backend = "rr-numpy"
    env_count = 16

    [[phases]]
    span = "dr_reset.plan.terrain"
    parent = "dr_reset.plan"

    [instrument]
    "rr_stack:BatchEnv.step" = "env_step"
    "rr_stack:BatchEnv.reset_done" = { phase = "reset_done", count = "done" }
    "rr_stack:BatchEnv.reinit" = { phase = "reset_done.reset_call", count = "ids" }
    "rr_stack:TerrainDR.reset" = { phase = "dr_reset", count = "env_ids" }
    "rr_stack:TerrainDR.plan" = "dr_reset.plan"
    "rr_stack:TerrainDR.terrain" = "dr_reset.plan.terrain"
"""

SPEC_ENV_COUNT_ARG = SPEC.replace("    env_count = 16\n", "").replace(
    '"rr_stack:BatchEnv.step" = "env_step"',
    '"rr_stack:BatchEnv.step" = { phase = "env_step", env_count = "self.num_envs" }')

TERRAIN_KEY = "dr_reset_plan_terrain_ms"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two ``resettrace run``s of the stack (seeds 0 and 1; the env count from the spec's
    ``[attributes]``, then from a target's ``env_count``): their job records and output."""
    folder = tmp_path_factory.mktemp("stack")
    _write(folder, {"rr_stack.py": STACK, "train.py": TRAIN, "spec.toml": SPEC,
                    "spec_arg.toml": SPEC_ENV_COUNT_ARG})
    runs = {}
    for name, spec, seed in (("job", "spec.toml", "0"), ("job2", "spec_arg.toml", "1")):
        r = _cli(["run", "--instrument", spec, "--stats-json", f"out/{name}.json", "--",
                  sys.executable, "train.py", seed], folder)
        assert r.returncode == 0, r.stderr
        m = re.fullmatch(r"resets (\d+)\n", r.stdout)
        assert m, r.stdout
        runs[name] = {"result": r, "resets": int(m.group(1)),
                      "path": folder / "out" / f"{name}.json"}
    return {"folder": folder, **runs}


@pytest.mark.parametrize("name", ["job", "job2"])
def test_zero_code_run_of_an_own_stack_writes_the_job_record(stack: dict[str, Any],
                                                             name: str) -> None:
    run = stack[name]
    r, resets = run["result"], run["resets"]
    assert "Traceback" not in r.stderr and "not under its registered parent" not in r.stderr
    job = json.loads(run["path"].read_text())
    assert job["kind"] == "job" and job["format"] == 2
    # one process, one record beside the job's, and the job holds exactly it
    per = _records(run["path"].parent, name)
    assert len(per) == 1 and len(job["members"]) == 1
    (pid, own), = per.items()
    assert job["members"][0]["pid"] == pid and own["rank"] == 0
    # counts: the steps and the resets that happened (the script printed them)
    counts = {k: s["count"] for k, s in job["stats"].items()}
    assert counts["env_step_total_ms"] == 150
    for key in ("reset_done_ms", "reset_done_reset_call_ms", "dr_reset_total_ms",
                "dr_reset_plan_ms", TERRAIN_KEY, "reset_done_count"):
        assert counts[key] == resets, key
    assert counts == {k: s["count"] for k, s in own["stats"].items()}
    # the registered phase, with its parent: a reader rebuilds the tree without the stack
    phases = {p["span"]: p for p in job["phases"]}
    assert phases["dr_reset.plan.terrain"]["parent"] == "dr_reset.plan"
    assert phases["dr_reset.plan.terrain"]["key"] == TERRAIN_KEY
    assert job["stats"][TERRAIN_KEY]["share_of_parent"] > 0
    # throughput is known: the env count came from the spec
    assert job["config"]["num_envs"] == 16 and own["config"]["num_envs"] == 16
    assert job["env_steps"] == 150
    step_s = job["stats"]["env_step_total_ms"]["total_ms"] / 1e3
    assert job["env_per_s"] == pytest.approx(16 * 150 / step_s, rel=1e-6)
    envs_reset = job["stats"]["reset_done_count"]["total_ms"]
    assert job["reset_fraction"] == pytest.approx(envs_reset / (150 * 16))
    # the summary: a line per rank, then the job's line
    assert re.search(rf"^0\s+{pid}\s+150\s+\d", r.stderr, re.M), r.stderr
    assert re.search(r"^job\s+1\s+150\s+\d", r.stderr, re.M), r.stderr
    assert re.search(rf"^{TERRAIN_KEY}\s+{resets}\s", r.stderr, re.M)
    assert "1 process (" in r.stderr and ", 1 process;" in r.stderr


def test_compare_of_two_stack_runs(stack: dict[str, Any]) -> None:
    folder = stack["folder"]
    r = _cli(["compare", "out/job.json", "out/job2.json", "--json", "cmp.json"], folder)
    assert r.returncode == 0, r.stderr
    result = json.loads((folder / "cmp.json").read_text())
    assert result["not_comparable"] == []  # same env count and mode, similar reset ratio
    verdicts = {k["key"]: k["verdict"] for k in result["keys"]}
    for key in ("env_step_total_ms", "reset_done_ms", "dr_reset_plan_ms", TERRAIN_KEY):
        assert verdicts[key] in ("slower", "faster", "within noise"), key
    assert re.search(rf"^{TERRAIN_KEY}\s.*(slower|faster|within noise)$", r.stdout, re.M)
    assert result["env_per_s"]["base"] > 0 and result["env_per_s"]["new"] > 0
    assert re.search(r"^env/s: [\d,]+ -> [\d,]+ \([+-]\d", r.stdout, re.M), r.stdout
    assert TERRAIN_KEY in {m["key"] for m in result["model"]}


def test_merge_of_two_stack_jobs(stack: dict[str, Any]) -> None:
    folder = stack["folder"]
    r = _cli(["merge", "out/job.json", "out/job2.json", "-o", "merged.json"], folder)
    assert r.returncode == 0, r.stderr
    merged = json.loads((folder / "merged.json").read_text())
    assert merged["kind"] == "job" and len(merged["members"]) == 2
    resets = stack["job"]["resets"] + stack["job2"]["resets"]
    assert merged["stats"][TERRAIN_KEY]["count"] == resets
    assert merged["stats"]["env_step_total_ms"]["count"] == 300
    assert merged["env_steps"] == 300
    assert "dr_reset.plan.terrain" in {p["span"] for p in merged["phases"]}
    assert re.search(rf"^{TERRAIN_KEY}\s+{resets}\s", r.stdout, re.M)


def test_fit_of_a_stack_job(stack: dict[str, Any]) -> None:
    folder = stack["folder"]
    r = _cli(["fit", "out/job.json", "--json", "fit.json"], folder)
    assert r.returncode == 0, r.stderr
    fit = json.loads((folder / "fit.json").read_text())
    assert fit["env_counts"] == [16]
    terrain = fit["keys"][TERRAIN_KEY]["per_env_count"]["16"]
    assert terrain["n"] == stack["job"]["resets"] and terrain["a_ms"] is not None
    assert "env_step_total_ms" not in fit["keys"]  # not reset work
    assert re.search(rf"^{TERRAIN_KEY}\s+16\s+{stack['job']['resets']}\s", r.stdout, re.M)


def test_report_of_a_stack_job(stack: dict[str, Any]) -> None:
    folder = stack["folder"]
    r = _cli(["report", "out/job.json", "--compare", "out/job2.json", "-o", "r.html"], folder)
    assert r.returncode == 0, r.stderr
    page = (folder / "r.html").read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and TERRAIN_KEY in page


# -- workers, every way they start ------------------------------------------------------------
WORK = "def work(i):\n    return i * 2\n"
WORK_SPEC = '[instrument]\n"rr_work:work" = "env_step"\n'
CALLS = 4  # calls each worker (or task) records

WORKERS = f"""
    import collections
    import concurrent.futures as cf
    import json
    import multiprocessing as mp
    import os
    import subprocess
    import sys
    import time

    import rr_work


    def child():
        for i in range({CALLS}):
            rr_work.work(i)


    def task(i):
        for j in range({CALLS}):
            rr_work.work(j)
        time.sleep(0.02)  # both workers get tasks
        return os.getpid()


    if __name__ == "__main__":
        how = sys.argv[1]
        rr_work.work(0)
        rr_work.work(1)
        helper = subprocess.Popen([sys.executable, "-c", "pass"])  # records nothing
        helper.wait()
        tasks = collections.Counter()
        if how in ("fork", "forkserver", "spawn"):
            ctx = mp.get_context(how)
            procs = [ctx.Process(target=child) for _ in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            assert [p.exitcode for p in procs] == [0, 0]
            workers = [p.pid for p in procs]  # in start order: ranks 1, 2
            tasks.update(workers)
        elif how == "futures":
            with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as ex:
                tasks.update(ex.map(task, range(6)))
            workers = sorted(tasks)
        elif how == "pool":  # the with block's exit terminates the idle workers
            with mp.get_context("fork").Pool(2) as pool:
                tasks.update(pool.map(task, range(6), chunksize=1))
            workers = sorted(tasks)
        print(json.dumps({{"main": os.getpid(), "helper": helper.pid, "workers": workers,
                           "tasks": {{str(k): v for k, v in tasks.items()}}}}))
"""


def _run_workers(folder: Path, script: str, *args: str, **extra: str
                 ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    _write(folder, {"rr_work.py": WORK, "spec.toml": WORK_SPEC, "main.py": script})
    r = _cli(["run", "--instrument", "spec.toml", "--stats-json", "out/job.json", "--",
              sys.executable, "main.py", *args], folder, **extra)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def _check_job(folder: Path, per: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The job's record: one member per process record, counts the sum of theirs."""
    job = json.loads((folder / "out" / "job.json").read_text())
    assert job["kind"] == "job"
    assert sorted(m["pid"] for m in job["members"]) == sorted(per)
    for key in {k for d in per.values() for k in d["stats"]}:
        assert job["stats"][key]["count"] == sum(_count(d, key) for d in per.values()), key
    assert job["env_steps"] == sum(d["env_steps"] for d in per.values())
    return job


@pytest.mark.parametrize("how", ["fork", "forkserver", "spawn", "futures", "pool"])
def test_every_worker_leaves_one_record_with_a_rank_of_its_own(tmp_path: Path,
                                                               how: str) -> None:
    r, out = _run_workers(tmp_path, WORKERS, how)
    main, workers = out["main"], out["workers"]
    per = _records(tmp_path / "out")
    # exactly the main process and the workers that recorded: not the helper, not a
    # fork server or a pool's manager thread
    assert sorted(per) == sorted([main, *workers]) and out["helper"] not in per
    assert len(workers) == 2
    assert per[main]["rank"] == 0 and _count(per[main]) == 2
    ranks = {pid: per[pid]["rank"] for pid in workers}
    if how in ("fork", "forkserver", "spawn"):  # in the order the parent started them
        assert [ranks[pid] for pid in workers] == [1, 2]
    else:
        assert sorted(ranks.values()) == [1, 2]
    for pid in workers:
        assert per[pid]["parent_pid"] == main
        assert _count(per[pid]) == CALLS * out["tasks"][str(pid)]
        assert per[pid]["run_id"] == per[main]["run_id"]
    job = _check_job(tmp_path, per)
    calls = 2 + CALLS * (2 if how in ("fork", "forkserver", "spawn") else 6)
    assert job["stats"]["env_step_total_ms"]["count"] == calls
    for pid, rank in [(main, 0), *ranks.items()]:  # the summary's line per rank
        assert re.search(rf"^{rank}\s+{pid}\s+{_count(per[pid])}\s", r.stderr, re.M), r.stderr
    assert re.search(rf"^job\s+3\s+{calls}\s", r.stderr, re.M)


BUSY = """
    import json
    import multiprocessing as mp
    import os
    import sys
    import time

    import rr_work


    def busy(i):
        rr_work.work(i)
        open(f"started.{os.getpid()}", "w").close()
        while True:  # recording until the pool terminates it
            rr_work.work(i)
            time.sleep(0.001)


    if __name__ == "__main__":
        pool = mp.get_context(sys.argv[1]).Pool(2)
        pool.map_async(busy, range(2), chunksize=1)
        deadline = time.monotonic() + 60
        while sum(f.startswith("started.") for f in os.listdir()) < 2:  # both recording
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)
        pool.terminate()
        pool.join()
        print(json.dumps({"main": os.getpid()}))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_terminated_while_recording_leave_their_records(tmp_path: Path,
                                                                method: str) -> None:
    """``terminate()`` sends SIGTERM mid-loop: each worker still writes what it recorded."""
    _, out = _run_workers(tmp_path, BUSY, method)
    per = _records(tmp_path / "out")
    assert out["main"] not in per  # the main process recorded nothing
    assert len(per) == 2 and sorted(d["rank"] for d in per.values()) == [1, 2]
    assert all(d["parent_pid"] == out["main"] and _count(d) > 0 for d in per.values())
    _check_job(tmp_path, per)


LEAVING = """
    import json
    import multiprocessing as mp
    import os
    import signal
    import sys
    from multiprocessing import util

    import rr_work


    def child():
        rr_work.work(0)
        # a pool's terminate() landing as the worker leaves: SIGTERM during its exit
        # finalizers, before the one that writes the record
        util.Finalize(None, os.kill, args=(os.getpid(), signal.SIGTERM), exitpriority=60)


    if __name__ == "__main__":
        p = mp.get_context(sys.argv[1]).Process(target=child)
        p.start()
        p.join()
        print(json.dumps({"main": os.getpid(), "worker": p.pid, "exitcode": p.exitcode}))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_sigterm_while_a_worker_leaves_does_not_skip_its_record(tmp_path: Path,
                                                                  method: str) -> None:
    """``with Pool(...)``'s exit terminates workers that may be running their exit
    finalizers already (they read their sentinel): the SIGTERM must not end them before
    the record is written (a SystemExit there skipped every later finalizer, and one
    worker record in two was lost)."""
    _, out = _run_workers(tmp_path, LEAVING, method)
    per = _records(tmp_path / "out")
    assert sorted(per) == [out["worker"]]
    assert _count(per[out["worker"]]) == 1 and per[out["worker"]]["rank"] == 1
    assert out["exitcode"] == 0  # it was leaving anyway, and left as it would have


UNSEEN = """
    import json
    import multiprocessing as mp
    import os
    import signal
    import sys
    import threading
    import time

    import rr_work


    def child():
        rr_work.work(0)
        lock = mp.Lock()
        lock.acquire()

        def signal_me():  # once the main thread waits: a SIGTERM it is not woken by
            time.sleep(0.3)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        threading.Thread(target=signal_me).start()
        lock.acquire()  # blocks: the lock is held (by this very thread)


    if __name__ == "__main__":
        p = mp.get_context(sys.argv[1]).Process(target=child)
        p.start()
        p.join(30)
        if p.exitcode is None:
            p.kill()
            p.join()
        print(json.dumps({"main": os.getpid(), "worker": p.pid, "exitcode": p.exitcode}))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_sigterm_the_blocked_main_thread_does_not_see_still_ends_the_worker(
        tmp_path: Path, method: str) -> None:
    """The signal's handler left pending while the main thread sleeps in a lock's wait
    (a SIGTERM that lands just before the wait: one ``with Pool(...)`` exit in about a
    hundred hung for ever on a worker waiting for its task queue's lock): the worker is
    woken, leaves through its exit hooks (143) and writes its record."""
    _, out = _run_workers(tmp_path, UNSEEN, method)
    assert out["exitcode"] == 143  # not -9: it was not killed after the 30 s
    per = _records(tmp_path / "out")
    assert sorted(per) == [out["worker"]] and _count(per[out["worker"]]) == 1


RANKED = """
    import json
    import multiprocessing as mp
    import os
    import sys

    import rr_work


    def given(rank):
        os.environ["RESETTRACE_WORKER_RANK"] = str(rank)  # before it records
        rr_work.work(rank)


    def plain():
        rr_work.work(0)


    def nested():
        rr_work.work(0)
        p = mp.get_context("fork").Process(target=plain)
        p.start()
        p.join()


    if __name__ == "__main__":
        how, method = sys.argv[1], sys.argv[2]
        rr_work.work(0)  # the main process recorded before it forked
        ctx = mp.get_context(method)
        procs = ([ctx.Process(target=given, args=(r,)) for r in (7, 9)] if how == "given"
                 else [ctx.Process(target=nested) for _ in range(2)])
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print(json.dumps({"main": os.getpid(), "workers": [p.pid for p in procs]}))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_rank_set_in_the_worker_is_kept(tmp_path: Path, method: str) -> None:
    _, out = _run_workers(tmp_path, RANKED, "given", method)
    per = _records(tmp_path / "out")
    assert {pid: d["rank"] for pid, d in per.items()} == {
        out["main"]: 0, out["workers"][0]: 7, out["workers"][1]: 9}
    assert all(per[pid]["parent_pid"] == out["main"] for pid in out["workers"])
    _check_job(tmp_path, per)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_of_a_ranked_parent(tmp_path: Path, method: str) -> None:
    """RANK=3 (a launcher's): its workers are 3001, 3002, and their own workers 3001001
    and 3002001 (parent rank x 1000 + worker number, at every level)."""
    _, out = _run_workers(tmp_path, RANKED, "nested", method, RANK="3")
    per = _records(tmp_path / "out")
    first, second = out["workers"]
    ranks = {pid: d["rank"] for pid, d in per.items()}
    assert ranks[out["main"]] == 3 and ranks[first] == 3001 and ranks[second] == 3002
    grandchildren = {d["parent_pid"]: d["rank"] for pid, d in per.items()
                     if pid not in (out["main"], first, second)}
    assert grandchildren == {first: 3001001, second: 3002001}
    assert len(set(ranks.values())) == len(ranks) == 5
    job = _check_job(tmp_path, per)
    assert job["stats"]["env_step_total_ms"]["count"] == 5


# -- resettrace.write_run ------------------------------------------------------------------------
def test_write_run_expands_pid_and_rank(tmp_path: Path) -> None:
    script = """
        import os

        import resettrace

        resettrace.configure(mode="timing", worker_rank=4)
        rec = resettrace.recorder(env_count=8)
        for _ in range(3):
            with rec.scope("env_step"):
                with rec.scope("reset_done", 2):
                    pass
        print(resettrace.write_run("runs/r-{pid}-{rank}.json"), os.getpid())
    """
    _write(tmp_path, {"w.py": script})
    (tmp_path / "runs").mkdir()
    r = subprocess.run([sys.executable, "w.py"], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    written, pid = r.stdout.split()
    assert written == f"runs/r-{pid}-4.json"
    import resettrace

    rec = resettrace.read_record(tmp_path / written)
    assert rec.kind == "process" and rec.pid == int(pid) and rec.rank == 4
    assert rec.stats["env_step_total_ms"]["count"] == 3 and rec.num_envs == 8
    assert rec.env_steps == 3 and rec.env_per_s and rec.env_per_s > 0
    # and the analysis commands read it
    c = _cli(["fit", written], tmp_path)
    assert c.returncode == 0 and "reset_done_ms" in c.stdout, c.stderr


def test_compare_of_runs_without_an_env_count_says_env_per_s_is_not_known(
        tmp_path: Path) -> None:
    script = """
        import resettrace

        resettrace.configure(mode="timing")
        rec = resettrace.recorder()  # no env count
        for _ in range(30):
            with rec.scope("env_step"):
                pass
        resettrace.write_run("a.json")
        resettrace.write_run("b.json")
    """
    _write(tmp_path, {"w.py": script})
    r = subprocess.run([sys.executable, "w.py"], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    c = _cli(["compare", "a.json", "b.json"], tmp_path)
    assert c.returncode == 0, c.stderr
    assert "env/s: not known (base and new: the run's env count was not given" in c.stdout
    assert "nan" not in c.stdout.splitlines()[0]


# -- two jobs on one RESETTRACE_RUN_JSON path ---------------------------------------------------


def test_two_jobs_on_one_run_json_path_keep_both_records(tmp_path: Path) -> None:
    """``RESETTRACE_RUN_JSON=stats.json`` (no ``{pid}``) in two jobs at once: the one that
    ends last keeps the other's record, writes its own beside it and says so in one line."""
    _write(tmp_path, {"job.py": OVERLAPPING_JOB})
    env = clean_env(RESETTRACE_RUN_JSON="stats.json", RESETTRACE="timing")
    if "PYTHONPATH" in os.environ:  # the resettrace under test
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]

    def job(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "job.py", *args], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = job("first-started", "second-done")
    while not (tmp_path / "first-started").exists():  # it has started and recorded
        assert first.poll() is None, first.communicate()
        time.sleep(0.01)
    second = job("second-started", "-")
    out2, err2 = second.communicate(timeout=120)  # ends (writes stats.json) while first runs
    assert second.returncode == 0 and err2 == "", err2
    (tmp_path / "second-done").touch()
    out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1
    path, beside = tmp_path / "stats.json", tmp_path / f"stats.p{first.pid}.json"
    assert json.loads(path.read_text())["pid"] == int(out2)
    assert json.loads(beside.read_text())["pid"] == int(out1)
    warned = err1.strip().splitlines()
    assert len(warned) == 1 and "stats.json " in warned[0] and beside.name in warned[0], warned


# -- a collector timing.json of the format before records ---------------------------------------
#: what a collector timing.json held before records (format 1: no "format", kind, phases,
#: env_steps, pid, host, ...); the oldest lacked the buckets and the cost model too
OLD_KEYS = ("resettrace", "config", "sim", "rank", "env_per_s", "wall_s", "reset_fraction",
            "stats", "samples", "dist", "model", "export")
OLDEST_KEYS = ("resettrace", "config", "sim", "rank", "env_per_s", "wall_s",
               "reset_fraction", "stats", "samples", "export")


@pytest.fixture(scope="module")
def collector_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("collector")
    r = _cli(["bench", "collector", "--num-envs", "8", "--steps", "20", "--warmup", "2",
              "--action-noise", "5", "--nthread", "1", "--out", str(folder / "new")], folder)
    assert r.returncode == 0, r.stderr
    data = json.loads((folder / "new" / "timing.json").read_text())
    assert data["format"] == 2 and data["kind"] == "collector"
    assert data["stats"]["reset_done_count"]["total_ms"] > 0  # envs fell: a cost model
    for name, keys in (("old", OLD_KEYS), ("oldest", OLDEST_KEYS)):
        (folder / name).mkdir()
        (folder / name / "timing.json").write_text(json.dumps({k: data[k] for k in keys}))
    return folder


@pytest.mark.parametrize("old", ["old", "oldest"])
def test_an_old_collector_timing_json_is_still_read(collector_run: Path, old: str) -> None:
    folder = collector_run
    r = _cli(["compare", f"{old}/timing.json", "new/timing.json", "--json", f"{old}-c.json"],
             folder)
    assert r.returncode == 0, r.stderr
    result = json.loads((folder / f"{old}-c.json").read_text())
    assert result["not_comparable"] == []  # the same run, read in two formats
    assert all(k["verdict"] == "within noise" for k in result["keys"]), result["keys"]
    r = _cli(["report", old, "-o", f"{old}.html"], folder)  # its folder
    assert r.returncode == 0 and (folder / f"{old}.html").is_file(), r.stderr
    # (two rank-0 runs: one job only when told so)
    r = _cli(["merge", f"{old}/timing.json", "new/timing.json", "--allow-duplicates", "-o",
              f"{old}-m.json"], folder)
    r_fit = _cli(["fit", f"{old}/timing.json"], folder)
    if old == "old":
        assert r.returncode == 0, r.stderr
        merged = json.loads((folder / f"{old}-m.json").read_text())
        new = json.loads((folder / "new" / "timing.json").read_text())
        assert merged["stats"]["env_step_total_ms"]["count"] == 2 * _count(new)
        assert merged["env_steps"] == 2 * new["env_steps"] == 40  # implied by its stats
        assert r_fit.returncode == 0 and "reset_done_ms" in r_fit.stdout, r_fit.stderr
    else:  # nothing to merge or fit in it: said in one line naming it
        for res, what in ((r, "no buckets ('dist') to merge"), (r_fit, "no cost model")):
            assert res.returncode == 2
            assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
            assert f"{old}/timing.json: {what}" in res.stderr, res.stderr


# -- files that are not run records -----------------------------------------------------------
NOT_RECORDS: dict[str, tuple[bytes, str]] = {
    "truncated": (b'{"format": 2, "kind": "job", "stats": {"env_step_total_ms": {"cou',
                  "not JSON"),
    "foreign object": (b'{"a": 1}', "no 'stats' section"),
    "list": (b"[1, 2, 3]", "a JSON array, not an object"),
    "null": (b"null", "a JSON null, not an object"),
    "not UTF-8": ('{"stats": "r\u00e9glage"}'.encode("latin-1"), "not UTF-8 text"),
    "old run stats": (json.dumps({"pid": 12, "mode": "timing", "stats": {
        "env_step_total_ms": {"count": 3, "mean_ms": 1.0, "total_ms": 3.0}}}).encode(),
                      "the stats file of an older resettrace run"),
    "newer format": (b'{"format": 9, "stats": {}, "dist": {}, "samples": {}}',
                     "written by a newer resettrace"),
}

#: a record whose sections have the wrong types (damaged, or edited by hand)
_SHAPE = {"format": 2, "kind": "process", "stats": {"env_step_total_ms": {
    "count": 1, "total_ms": 1.0}}, "samples": {"env_step_total_ms": [1.0]}, "dist": {},
    "model": {}}
DAMAGED: dict[str, tuple[dict[str, Any], str]] = {
    "config a list": ({"config": [1]}, "'config' is not an object"),
    "phases a string": ({"phases": "abc"}, "'phases' is not a list of objects"),
    "dist entry a number": ({"dist": {"env_step_total_ms": 3}},
                            "the buckets ('dist') of 'env_step_total_ms'"),
    "samples of text": ({"samples": {"env_step_total_ms": "abc"}},
                        "the samples of 'env_step_total_ms' are not a list of numbers"),
    "count of text": ({"stats": {"env_step_total_ms": {"count": "x", "total_ms": 1.0}}},
                      "the stats of 'env_step_total_ms': count or total_ms is not a number"),
    "cost model sums a number": ({"model": {"keys": {"reset_done_ms": {"sums": 3}}}},
                                 "the cost model of 'reset_done_ms'"),
    "env steps of text": ({"env_steps": "many"}, "'env_steps' is not an integer"),
}


def _tools(path: str) -> dict[str, list[str]]:
    return {"compare": ["compare", "good.json", path],
            "report": ["report", path, "-o", "r.html"],
            "merge": ["merge", path, "good.json", "-o", "m.json"],
            "fit": ["fit", path]}


@pytest.fixture(scope="module")
def good_record(stack: dict[str, Any]) -> bytes:
    return stack["job"]["path"].read_bytes()


def _check_refused(folder: Path, name: str, expected: str) -> None:
    for tool, args in _tools(name).items():
        r = _cli(args, folder)
        assert r.returncode == 2, (tool, r.stdout, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1, (tool, r.stderr)
        assert lines[0].startswith(f"resettrace: {name}: "), (tool, lines[0])
        assert expected in lines[0], (tool, lines[0])
        assert "Traceback" not in r.stderr and r.stdout == "", tool
    assert not (folder / "r.html").exists() and not (folder / "m.json").exists()


@pytest.mark.parametrize("case", list(NOT_RECORDS))
def test_a_file_that_is_not_a_run_record_is_one_line_and_exit_2(
        tmp_path: Path, good_record: bytes, case: str) -> None:
    content, expected = NOT_RECORDS[case]
    (tmp_path / "good.json").write_bytes(good_record)
    (tmp_path / "bad.json").write_bytes(content)
    _check_refused(tmp_path, "bad.json", expected)


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_run_record_is_one_line_and_exit_2(tmp_path: Path, good_record: bytes,
                                                     case: str) -> None:
    change, expected = DAMAGED[case]
    (tmp_path / "good.json").write_bytes(good_record)
    (tmp_path / "bad.json").write_text(json.dumps({**_SHAPE, **change}))
    _check_refused(tmp_path, "bad.json", f"a damaged run record ({expected}")
