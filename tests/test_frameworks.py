"""Real Ray and real Stable-Baselines3 under ``resettrace run`` (no mocks).

- Ray, a local cluster the driver starts, and a cluster started beforehand with ``ray
  start`` (its processes know nothing of resettrace but where its source is): two actors,
  each a Gymnasium ``SyncVectorEnv`` of 4 MuJoCo envs, traced through the ``runtime_env``
  hook alone. Ray force-kills actors (``ray.kill``, ``ray.shutdown()``: no ``atexit``), so
  each one's record is its last snapshot: the driver waits until both snapshots hold every
  reset and step the actors counted, then kills them. The job has exactly the actors'
  counts, says which members are incomplete, and an actor ended gracefully
  (``__ray_terminate__``) has its complete record.
- Stable-Baselines3 PPO with ``--instrument sb3``: ``DummyVecEnv`` and ``SubprocVecEnv``
  (fork, forkserver, spawn): the job's resets and env steps are the ones a callback counted.

Each Ray run uses a temporary folder of its own under ``/tmp`` (Ray's Unix socket paths
must stay short) and its own ports; the processes it started are found by a marker in their
environment and killed by pid (``ray stop`` would stop every Ray cluster of the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import clean_env

#: the resettrace under test (children import it, not the venv's editable install)
SRC = Path(__file__).resolve().parents[1] / "src"
#: set in every process of a test's Ray cluster: :func:`_kill_marked` finds them by it
MARKER = "RT_TEST_RAY_CLUSTER"

# -- the jobs ---------------------------------------------------------------------------------
#: argv: local|auto, Ray temp folder, records folder, steps, kill|graceful. Two actors, each a
#: SyncVectorEnv of 4 InvertedPendulum envs, count their resets exactly (Gymnasium's NextStep
#: autoreset resets an env in the step after the one it ended in: the first reset of each
#: env, then the dones of every step but the last); the driver waits until each actor's
#: record on disk holds them, then ends the actors: ``kill`` force-kills the first
#: (ray.kill) and ray.shutdown() the second; ``graceful`` ends the first with
#: __ray_terminate__ (and waits for its exit record) and the second with ray.shutdown().
RAY_DRIVER = """
import json, os, sys, time
from pathlib import Path

import numpy as np
import ray

N_ENVS = 4


@ray.remote
class Worker:
    def __init__(self, seed):
        import gymnasium as gym

        self.env = gym.make_vec("InvertedPendulum-v5", num_envs=N_ENVS,
                                vectorization_mode="sync")
        self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        self.resets = N_ENVS

    def run(self, steps):
        done = np.zeros(N_ENVS, bool)
        for _ in range(steps):
            self.resets += int(done.sum())
            _, _, term, trunc, _ = self.env.step(self.env.action_space.sample())
            done = term | trunc
        return self.resets

    def who(self):
        return os.getpid(), ray.get_runtime_context().get_actor_id()


mode, temp, out, steps, end = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), \\
    sys.argv[5]
if mode == "local":  # (never an existing cluster of the machine: address "local")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=temp)
else:
    ray.init(address="auto", _temp_dir=temp)
actors = [Worker.remote(seed) for seed in (0, 1)]  # (counts of their own)
resets = ray.get([a.run.remote(steps) for a in actors])
who = ray.get([a.who.remote() for a in actors])
truth = [{"pid": pid, "actor_id": aid, "resets": n} for (pid, aid), n in zip(who, resets)]
(out / "truth.json").write_text(json.dumps({"actors": truth, "steps": steps}))


def record(pid):
    try:
        return json.loads((out / f"job.{pid}.json").read_text())
    except (OSError, ValueError):
        return None


def seen(rec):
    s = (rec or {}).get("stats") or {}
    return ((s.get("reset_done_count") or {}).get("total_ms"),
            (s.get("env_step_total_ms") or {}).get("count"))


def wait_for(pid, ok, what):
    deadline = time.monotonic() + 60  # a hang guard, not a timing assert
    while not ok(record(pid)):
        if time.monotonic() > deadline:
            sys.exit(f"driver: actor pid {pid}'s record never showed {what}: "
                     f"{seen(record(pid))} in {sorted(p.name for p in out.iterdir())}")
        time.sleep(0.05)


for t in truth:
    want = (float(t["resets"]), steps)
    wait_for(t["pid"], lambda r, want=want: seen(r) == want, f"(resets, steps) {want}")
first, second = actors
if end == "kill":
    ray.kill(first)
else:
    first.__ray_terminate__.remote()
    wait_for(truth[0]["pid"], lambda r: bool(r and r.get("complete")), "complete")
ray.shutdown()
"""

#: argv: dummy|fork|forkserver|spawn, env count, truth file. PPO on InvertedPendulum,
#: two rollouts of 32 vector steps; a callback counts the steps and dones (SB3 resets a
#: done env in its step: the truth is each env's first reset plus every done)
SB3_TRAIN = """
import json, sys

from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

method, n_envs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


class Count(BaseCallback):
    def __init__(self):
        super().__init__()
        self.dones = 0
        self.steps = 0

    def _on_step(self):
        self.dones += int(self.locals["dones"].sum())
        self.steps += 1
        return True


if __name__ == "__main__":
    cls = DummyVecEnv if method == "dummy" else SubprocVecEnv
    kw = {} if method == "dummy" else {"vec_env_kwargs": {"start_method": method}}
    env = make_vec_env("InvertedPendulum-v5", n_envs=n_envs, vec_env_cls=cls, seed=0, **kw)
    count = Count()
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=32 * n_envs * 2, callback=count)
    env.close()
    with open(out, "w") as f:
        json.dump({"resets": n_envs + count.dones, "steps": count.steps}, f)
"""


# -- helpers ----------------------------------------------------------------------------------
@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder of the test's own with a short path (Unix socket paths under it: Ray's,
    multiprocessing's forkserver)."""
    folder = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A child's environment: the resettrace under test, a home and temp folder of the
    test's own (Ray writes an auth token under the home), no Ray setting from outside."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(SRC), HOME=str(home), TMPDIR=str(home),
               RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


def _marked(value: str) -> list[int]:
    """The pids of the processes whose environment has ``MARKER=value``."""
    want = f"{MARKER}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _kill_marked(value: str) -> None:
    """Kill, by pid, every process of the test's Ray cluster (its marker) until none is left."""
    deadline = time.monotonic() + 30
    while (pids := _marked(value)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(folder: Path, script: str, args: list[str], instrument: str,
         env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``resettrace run --instrument INSTRUMENT --stats-json out/job.json -- python script``;
    its result and the job's record."""
    (folder / "job.py").write_text(script)
    out = folder / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "resettrace.cli", "run", "--instrument", instrument,
           "--stats-json", str(out / "job.json"), "--", sys.executable, str(folder / "job.py"),
           *args]
    proc = subprocess.run(cmd, cwd=folder, env=dict(env, RESETTRACE_RECORD_PERIOD="0.3",
                                                    RESETTRACE_JOB_WAIT="60"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "job.json").exists(), proc.stderr[-4000:]
    return proc, json.loads((out / "job.json").read_text())


def _process_records(out: Path) -> dict[int, dict[str, Any]]:
    """The records of the job's processes beside ``out/job.json``, by pid."""
    return {int(f.name.split(".")[1]): json.loads(f.read_text())
            for f in out.glob("job.*.json")}


def _total(stats: dict[str, Any], key: str, field: str = "total_ms") -> float:
    return (stats.get(key) or {}).get(field, 0)


def _incomplete_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if "incomplete: " in x]
    assert len(lines) == 1, stderr[-4000:]
    return lines[0]


# -- Ray --------------------------------------------------------------------------------------
def _check_ray_job(folder: Path, proc: subprocess.CompletedProcess[str], job: dict[str, Any],
                   graceful: bool) -> None:
    """The job holds the two actors exactly: members, identities, counts, what is incomplete
    (both actors when killed; the second one only when the first ended ``graceful``)."""
    truth = json.loads((folder / "out" / "truth.json").read_text())
    actors, steps = truth["actors"], truth["steps"]
    records = _process_records(folder / "out")
    # the members: the two actors (the driver recorded nothing), told apart by actor
    assert sorted(m["pid"] for m in job["members"]) == sorted(a["pid"] for a in actors)
    identities = {a["pid"]: records[a["pid"]]["identity"] for a in actors}
    assert identities == {a["pid"]: f"ray actor {a['actor_id'][:16]}" for a in actors}
    assert len(set(identities.values())) == 2
    assert all(records[a["pid"]]["launcher"] == "ray" for a in actors)
    # each actor's record holds every reset and step it made, the job their sum
    for a in actors:
        stats = records[a["pid"]]["stats"]
        assert _total(stats, "reset_done_count") == a["resets"], (a, stats["reset_done_count"])
        assert _total(stats, "env_step_total_ms", "count") == steps
    assert job["stats"]["reset_done_count"]["total_ms"] == sum(a["resets"] for a in actors)
    assert job["stats"]["env_step_total_ms"]["count"] == 2 * steps
    assert job["env_steps"] == 2 * steps
    # force-killed: the last snapshot, marked so; ended gracefully: the exit record
    ended = {a["pid"]: records[a["pid"]]["complete"] for a in actors}
    # the first actor: ray.kill, a force kill (its last snapshot, marked so), or
    # __ray_terminate__ (its exit record); the second is ended by ray.shutdown(), which
    # stops an actor with a SIGTERM (its exit record) or a force kill, whichever lands
    # first: either way its counts are exact, and the job names it iff it is a snapshot
    assert ended[actors[0]["pid"]] is graceful
    killed = [a for a in actors if not ended[a["pid"]]]
    assert sorted(m["pid"] for m in job["incomplete"]) == sorted(a["pid"] for a in killed)
    if killed:
        line = _incomplete_line(proc.stderr)
        assert line.startswith(f"resettrace run: {len(killed)} member"), line
    else:
        line = ""
        assert "incomplete: " not in proc.stderr, proc.stderr[-4000:]
    for a in actors:
        said = f"{identities[a['pid']]} (pid {a['pid']}) ended without writing its record"
        assert (said in line) == (a in killed), line
    # every target was imported by some process of the job (the driver imported none)
    assert "never imported" not in proc.stderr, proc.stderr[-4000:]
    # the job's env count: both actors' batches (not the distinct batch size, 4)
    assert job["config"]["num_envs"] == 8, job["config"]


def test_ray_local_cluster_actors_killed_leave_their_last_snapshot(short_tmp: Path) -> None:
    """``ray.init()`` starts a local cluster under ``resettrace run``; ``ray.kill`` and
    ``ray.shutdown()`` end the actors (``ray.kill`` a force kill: no exit handler runs): the
    job merges the killed actor's last snapshot, exact, and names it as incomplete."""
    folder = short_tmp / "job"
    folder.mkdir()
    mark = str(short_tmp)
    env = _env(short_tmp, **{MARKER: mark})
    try:
        proc, job = _run(folder, RAY_DRIVER,
                         ["local", str(short_tmp / "ray"), str(folder / "out"), "100", "kill"],
                         "gymnasium", env)
    finally:
        _kill_marked(mark)
    _check_ray_job(folder, proc, job, graceful=False)


@pytest.fixture
def ray_cluster(short_tmp: Path) -> Iterator[Path]:
    """A Ray cluster started beforehand with ``ray start`` (its temp folder), with no
    resettrace setting in its environment: only ``PYTHONPATH`` to the source tree, as a
    user's nodes have resettrace installed. Its processes are killed afterwards."""
    temp = short_tmp / "ray"
    mark = str(temp)
    env = _env(short_tmp, **{MARKER: mark})
    ray = str(Path(sys.executable).parent / "ray")
    try:
        started = subprocess.run(
            [ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={_free_port()}",
             f"--ray-client-server-port={_free_port()}", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
            env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stderr[-4000:]
        assert (temp / "ray_current_cluster").exists(), started.stderr[-4000:]
        yield temp
    finally:
        _kill_marked(mark)


def test_ray_cluster_started_beforehand_traced_through_the_runtime_env(
        ray_cluster: Path, short_tmp: Path) -> None:
    """``ray start`` beforehand, then the driver under ``resettrace run`` connects
    (address ``auto``): the actors are traced only through the runtime_env hook. The first
    actor ends gracefully (its record complete), the second is force-killed (its last
    snapshot): both exact."""
    folder = short_tmp / "job"
    folder.mkdir()
    # the driver is not a process of the cluster: no marker
    proc, job = _run(folder, RAY_DRIVER,
                     ["auto", str(ray_cluster), str(folder / "out"), "100", "graceful"],
                     "gymnasium", _env(short_tmp))
    _check_ray_job(folder, proc, job, graceful=True)


# -- Stable-Baselines3 ------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "n_envs"),
                         [("dummy", 3), ("fork", 3), ("forkserver", 2), ("spawn", 2)])
def test_sb3_ppo_counts_every_reset_and_step(short_tmp: Path, method: str,
                                             n_envs: int) -> None:
    """PPO under ``resettrace run --instrument sb3``: the job's resets and env steps are
    exactly the ones PPO's callback counted; ``SubprocVecEnv`` workers are members of their
    own, each complete."""
    proc, job = _run(short_tmp, SB3_TRAIN, [method, str(n_envs), str(short_tmp / "truth.json")],
                     "sb3", _env(short_tmp))
    truth = json.loads((short_tmp / "truth.json").read_text())
    assert truth["resets"] > n_envs  # some dones, not only the first resets
    assert job["stats"]["reset_done_count"]["total_ms"] == truth["resets"]
    assert job["stats"]["env_step_total_ms"]["count"] == truth["steps"]
    assert job["env_steps"] == truth["steps"]
    records = _process_records(short_tmp / "out")
    members = [records[m["pid"]] for m in job["members"]]
    assert len(members) == (1 if method == "dummy" else n_envs + 1)
    assert len({r["identity"] for r in members}) == len(members)
    assert all(r["complete"] for r in members)
    if method != "dummy":  # the main process steps, each worker resets its env
        main = [r for r in members if r["launcher"] != "multiprocessing"]
        workers = [r for r in members if r["launcher"] == "multiprocessing"]
        assert len(main) == 1 and len(workers) == n_envs
        assert _total(main[0]["stats"], "env_step_total_ms", "count") == truth["steps"]
        assert "reset_done_count" not in main[0]["stats"]
        assert all(_total(r["stats"], "reset_done_count") > 0 for r in workers)
    assert "never imported" not in proc.stderr, proc.stderr[-4000:]
    assert "incomplete" not in proc.stderr, proc.stderr[-4000:]
