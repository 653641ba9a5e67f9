"""The pytest plugin: the ``resettrace`` fixture and ``--resettrace-json``.

Inner test files run in a pytest subprocess, where the ``pytest11`` entry point loads the
plugin exactly as in a user's project. ``RESETTRACE=off`` there: whatever the fixture's
tests record comes from the fixture's own timing session, not from the environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import resettrace as rt
from resettrace.catalog import RESET_DONE_COUNT, SET_STATE, SET_STATE_KEYS
from resettrace.tables import STAT_FIELDS

pytest_plugins = ["pytester"]

FIELDS = set(STAT_FIELDS) | {"share_of_parent"}

INNER = textwrap.dedent("""
    import numpy as np

    import resettrace as rt
    from resettrace.catalog import SET_STATE_KEYS


    def _set_state(n):
        b = rt.make_backend("mujoco", num_envs=8)
        q = np.tile(b.keyframe_qpos, (2, 1))
        v = np.zeros((2, b.nv))
        for _ in range(n):
            b.set_state(np.arange(2), q, v)


    def test_three_set_states(resettrace):
        _set_state(3)
        capture = resettrace
        assert capture.stat("dr_reset_set_state_ms")["count"] == 3
        stats = capture.stats()
        missing = [k for k in SET_STATE_KEYS if k not in stats]
        assert missing == []
        assert all(stats[k]["count"] == 3 for k in SET_STATE_KEYS)


    def test_one_set_state(resettrace):
        _set_state(1)
        assert resettrace.stat("dr_reset_set_state_ms")["count"] == 1


    def test_without_the_fixture():
        _set_state(2)
        assert rt.stats() == {}  # RESETTRACE=off: the default session records nothing
""")


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("RESETTRACE", "off")
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    return pytester


def test_json_report_per_test_and_summary(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_inner=INNER)
    out = inner.path / "reports" / "nested" / "stats.json"  # parent dirs do not exist yet
    result = inner.runpytest_subprocess("-p", "no:cacheprovider",
                                        "--resettrace-json", "reports/nested/stats.json")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"resettrace: stats of 2 tests written to {out}"])

    tests = json.loads(out.read_text())["tests"]
    three, one = "test_inner.py::test_three_set_states", "test_inner.py::test_one_set_state"
    assert set(tests) == {three, one}  # test_without_the_fixture is absent
    # counts reset per test: neither test sees the other's spans
    assert tests[three]["stats"][SET_STATE.key]["count"] == 3
    assert tests[one]["stats"][SET_STATE.key]["count"] == 1
    for key in SET_STATE_KEYS:
        assert set(tests[three]["stats"][key]) == FIELDS
        assert tests[three]["stats"][key]["count"] == 3


def test_entry_point_loads_the_plugin_and_no_option_writes_nothing(
        inner: pytest.Pytester) -> None:
    inner.makepyfile(test_small="""
        import resettrace as rt
        from resettrace.tracing.recorder import NOOP_RECORDER

        BEFORE = rt.get_tracing()
        SEEN = []


        def test_capture_is_the_default(resettrace):
            assert type(resettrace).__name__ == "ResettraceCapture"
            assert rt.get_tracing() is resettrace.session is not BEFORE
            assert resettrace.session.mode == "timing" and resettrace.stats() == {}
            SEEN.append(resettrace.session)


        def test_previous_default_is_restored_and_the_session_shut_down():
            assert rt.get_tracing() is BEFORE
            assert SEEN[0].recorder() is NOOP_RECORDER
    """)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "resettrace: stats" not in result.stdout.str()
    assert list(inner.path.glob("*.json")) == []

    # the fixture comes from the entry point named "resettrace"
    blocked = inner.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:resettrace",
                                         "-k", "test_capture_is_the_default")
    blocked.assert_outcomes(errors=1)
    blocked.stdout.fnmatch_lines(["*fixture 'resettrace' not found*"])


def test_importing_the_plugin_is_light() -> None:
    code = textwrap.dedent("""
        import sys
        import resettrace.pytest_plugin
        print("\\n".join(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env={"PATH": "", "RESETTRACE": "off"})
    mods = set(out.stdout.split())
    assert "resettrace.pytest_plugin" in mods
    heavy = {m for m in mods if m.split(".")[0] in ("mujoco", "motrixsim", "numba", "numpy")
             or m.startswith("opentelemetry")}
    assert heavy == set()


def test_fixture_records_an_env_step_with_a_reset(resettrace) -> None:
    assert rt.get_tracing() is resettrace.session
    env = rt.make_env("g1_walk_flat", num_envs=8)
    q = np.array(env.backend.get_qpos_rows(np.array([0])))
    q[:, 2] = 0.2  # below the termination height: env 0 resets in the next step
    env.backend.set_state([0], q, np.zeros((1, env.backend.nv)))
    env.step(np.zeros((8, env.action_dim)))

    assert resettrace.stat(RESET_DONE_COUNT)["total_ms"] >= 1
    stats = resettrace.stats()
    assert all(set(s) == FIELDS for s in stats.values())
    # the explicit set_state above and the reset's own call
    assert stats[SET_STATE.key]["count"] == 2
    samples = resettrace.samples()[SET_STATE.key]
    assert len(samples) == 2 and max(samples) == stats[SET_STATE.key]["max_ms"]

    with pytest.raises(KeyError, match=r"'no_such_key'; keys seen: .*reset_done_count"):
        resettrace.stat("no_such_key")
    resettrace.clear()
    assert resettrace.stats() == {}
    with pytest.raises(KeyError, match="create envs/backends inside the test"):
        resettrace.stat(SET_STATE.key)



def test_json_report_merges_across_xdist_workers(inner: pytest.Pytester) -> None:
    """Two xdist workers: the controller writes one file with every test of both, each
    tagged with its worker, and the merged view counts every call of every test."""
    inner.makepyfile(test_a=INNER, test_b=INNER)  # one file per worker (--dist loadfile)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                        "--dist", "loadfile", "--resettrace-json", "stats.json")
    result.assert_outcomes(passed=6)
    data = json.loads((inner.path / "stats.json").read_text())
    tests = data["tests"]
    assert set(tests) == {f"test_{f}.py::test_{t}_set_state{'s' if t == 'three' else ''}"
                          for f in "ab" for t in ("three", "one")}
    assert data["workers"] == ["gw0", "gw1"]
    assert {tests["test_a.py::test_one_set_state"]["worker"],
            tests["test_b.py::test_one_set_state"]["worker"]} == {"gw0", "gw1"}
    merged = data["merged"]["stats"]
    assert merged[SET_STATE.key]["count"] == 8  # 3 + 1 calls per file, from both workers
    assert merged[SET_STATE.key]["p50_ms"] > 0
