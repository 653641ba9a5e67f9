"""The shipped ``motrixlab`` instrumentation on a ``ManagerEnv`` of our own
(:mod:`resettrace.bench.stack_envs.motrixlab_arm`): the reset path on the catalog with counts
equal to the resets that happened, closed accounts, set_state's timing dict, valid span
files; and MotrixLab's own profiler bridged, never switched on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import resettrace
from helpers import assert_closed, clean_env
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.instrumentation import instrument
from resettrace.record import read_record
from resettrace.stacks import get, version_problem
from resettrace.tracing.session import Tracing


@pytest.fixture
def installed() -> Iterator[None]:
    undo = instrument("motrixlab")
    yield
    undo()


def test_the_shipped_mapping_matches_the_installed_motrixlab() -> None:
    assert version_problem(get("motrixlab")) == (True, None)


def test_the_profiler_bridge_records_scopes_under_the_open_phase(installed: None) -> None:
    """MotrixLab's ``perf.scope`` and ``active_perf_scope`` reach resettrace as phases
    under the innermost open one (``reset_envs`` inside reset_done is its reset call, with
    its count); an exception is recorded; MotrixLab's profiler stays off."""
    from motrix_env_core.numba.manager import sim_reset
    from motrix_env_core.perf import Perf

    session = Tracing(Config(mode="trace", exporters=("memory",)))
    perf = Perf()
    try:
        with resettrace.use_tracing(session):
            rec = session.recorder()
            with perf.scope("done_mask"):
                pass  # no phase open: not on a traced path
            with pytest.raises(ValueError):
                with rec.scope("reset_done", 3):
                    with perf.scope("done_mask"):
                        pass
                    with perf.scope("reset_envs"):
                        with rec.scope("dr_reset", 3):
                            with sim_reset.active_perf_scope("ti_failing"):
                                raise ValueError("a reset term failed")
        session.force_flush()
        spans = {s.name: s for s in session.exporters[0].get_finished_spans()}
        stats = session.stats()
    finally:
        session.shutdown()
    assert set(spans) == {"reset_done", "reset_done.done_mask", "reset_done.reset_call",
                          "dr_reset", "dr_reset.ti_failing"}
    assert spans["reset_done.done_mask"].parent.span_id == \
        spans["reset_done"].context.span_id
    assert spans["reset_done.reset_call"].attributes["resettrace.reset.count"] == 3
    assert spans["reset_done.done_mask"].status.status_code.name == "UNSET"
    assert spans["dr_reset.ti_failing"].status.status_code.name == "ERROR"
    assert stats["reset_done_done_mask_ms"].count == 1
    assert perf.enabled is False and perf.snapshot() == ()


def test_the_bridge_feeds_motrixlabs_own_profiler_too(installed: None) -> None:
    from motrix_env_core.perf import Perf

    session = Tracing(Config(mode="timing"))
    perf = Perf(enabled=True)
    try:
        with resettrace.use_tracing(session):
            with session.recorder().scope("reset_done", 2):
                with perf.scope("done_mask"):
                    pass
        stats = session.stats()
    finally:
        session.shutdown()
    assert stats["reset_done_done_mask_ms"].count == 1
    (root,) = perf.snapshot()
    assert root.name == "done_mask" and root.count == 1


def test_undo_puts_motrixlab_back() -> None:
    from motrix_env_core import perf
    from motrix_env_core.numba.manager import sim_reset

    before = (perf.Perf.scope, perf.active_perf_scope, sim_reset.active_perf_scope)
    undo = instrument("motrixlab")
    assert getattr(sim_reset.active_perf_scope, "__resettrace_bridge__", False)
    undo()
    assert (perf.Perf.scope, perf.active_perf_scope, sim_reset.active_perf_scope) == before


def test_a_manager_env_in_process(installed: None) -> None:
    """Counts equal the env ids ``ManagerEnv.reset`` received; the write program and
    ``ReadPlan.read`` are counted on the reset path only; every account closes; the
    timing dict has the contract's keys and the write program's."""
    from resettrace.bench.stack_envs import motrixlab_arm

    with resettrace.use_tracing(Tracing(Config(mode="off"))):
        env = motrixlab_arm.make_env(16)  # its first reset (every row) is not recorded
    session = Tracing(Config(mode="timing"))
    try:
        with resettrace.use_tracing(session):
            resets = motrixlab_arm.run(env, 120)
        stats = session.stats()
    finally:
        session.shutdown()
    assert resets > 16
    assert stats["env_step_total_ms"].count == 120
    assert stats["reset_done_ms"].count == 120  # every step looks for done envs
    assert stats[C.RESET_DONE_COUNT].total_ms == resets
    calls = stats["dr_reset_total_ms"].count  # the steps that reset something
    assert 0 < calls < 120
    for key in ("reset_done_reset_call_ms", "dr_reset_set_state_ms",
                "set_state_write_program_ms", "dr_reset_build_observation_ms",
                "set_state_reset_kernel_ms", "dr_reset_command_reset_ms"):
        assert stats[key].count == calls, key
    for key in ("apply_action_ms", "physics_ms", "update_state_ms", "reset_done_done_mask_ms"):
        assert stats[key].count == 120, key
    for key in C.CATALOG.timing_keys(C.SET_STATE):
        assert key in stats, key
    for phase in (C.SET_STATE, C.DR_RESET, C.RESET_DONE, C.ENV_STEP):  # (those with a gap)
        assert_closed(stats, phase)


def _spans(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(folder.glob("spans.*.jsonl"))
            for line in f.read_text().splitlines()]


SPAWNED = """
import json, multiprocessing as mp

def work(steps, q):
    from resettrace.bench.stack_envs import motrixlab_arm
    env = motrixlab_arm.make_env(16, seed=1)
    q.put(motrixlab_arm.run(env, steps, seed=1) + 16)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=work, args=(60, q))
    p.start()
    resets = q.get()
    p.join()
    print("HAPPENED", json.dumps({"resets": resets, "steps": 60}))
"""


@pytest.mark.parametrize("where", ["main", "spawned"])
def test_a_manager_env_under_resettrace_run(tmp_path: Path, where: str) -> None:
    """Zero code: the spans form the catalog's tree (the first reset of every row at make
    a root, the others under env_step), counts equal the resets, the job's record adds
    them up, in the main process or in a spawned worker."""
    if where == "main":
        command = [sys.executable, "-c",
                   "import json; from resettrace.bench.stack_envs import motrixlab_arm as m; "
                   "env = m.make_env(16, seed=1); "
                   "print('HAPPENED', json.dumps({'resets': m.run(env, 60, seed=1) + 16, "
                   "'steps': 60}))"]
    else:
        (tmp_path / "job.py").write_text(SPAWNED)
        command = [sys.executable, "job.py"]
    r = subprocess.run(
        [sys.executable, "-m", "resettrace.cli", "run", "--instrument", "motrixlab",
         "--stats-json", "job.json", "--", *command],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=clean_env(RUST_LOG="error", RESETTRACE="trace",
                      RESETTRACE_EXPORTER=f"file:{tmp_path}/spans.{{pid}}.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("HAPPENED "))
    resets = json.loads(line.split(" ", 1)[1])["resets"]
    job = json.loads((tmp_path / "job.json").read_text())
    stats = job["stats"]
    assert stats[C.RESET_DONE_COUNT]["total_ms"] == resets
    assert stats["env_step_total_ms"]["count"] == 60
    catalog = read_record(tmp_path / "job.json").catalog()  # the run's phases, its bridge's too
    for phase in (C.SET_STATE, C.DR_RESET, C.RESET_DONE):
        assert_closed(stats, phase, catalog)
    assert "MIXED" not in r.stderr

    spans = _spans(tmp_path)
    by_id = {s["span_id"]: s for s in spans}
    assert len(by_id) == len(spans)
    names = Counter(s["name"] for s in spans)
    assert names["env_step"] == 60 and names["reset_done"] == 61  # + the one at make
    sets = [s for s in spans if s["name"] == "set_state"]
    assert sum(s["attributes"]["resettrace.reset.count"] for s in sets) == resets
    assert names["set_state.write_program"] == len(sets)  # the reset path's only
    assert names["dr_reset.build_observation"] == names["dr_reset"] == len(sets)
    roots = [s for s in spans if not s.get("parent_id")]
    assert sorted(s["name"] for s in roots) == ["env_step"] * 60 + ["reset_done"]
    for s in spans:
        if s.get("parent_id"):
            parent = by_id[s["parent_id"]]
            assert parent["trace_id"] == s["trace_id"]
            assert parent["start_ns"] <= s["start_ns"] <= s["end_ns"] <= parent["end_ns"]
            want = C.CATALOG.get(s["name"])
            if want is not None:  # a built-in phase, or one of the mapping's
                assert parent["name"] == want.parent, s["name"]
            else:  # a MotrixLab perf scope: named after the phase it ran in
                assert s["name"].startswith(parent["name"] + "."), s["name"]
    pids = {s["resource"]["process.pid"] for s in spans}
    assert len(pids) == 1
    if where == "spawned":
        assert job["members"] and len(job["members"]) >= 1
