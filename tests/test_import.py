"""``import resettrace`` stays light: no simulator, no OpenTelemetry SDK."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _modules_after(code: str) -> set[str]:
    script = textwrap.dedent(code) + textwrap.dedent("""
        import sys
        print("\\n".join(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, env={"PATH": "", "RESETTRACE": "off"})
    return set(out.stdout.split())


def _heavy(mods: set[str]) -> set[str]:
    return {m for m in mods if m.split(".")[0] in ("mujoco", "motrixsim", "numba")
            or m.startswith("opentelemetry.sdk") or m.startswith("opentelemetry.exporter")}


def test_import_is_light() -> None:
    mods = _modules_after("import resettrace")
    assert "resettrace" in mods
    assert _heavy(mods) == set()


def test_tracing_off_loads_no_sdk() -> None:
    mods = _modules_after("""
        import resettrace
        t = resettrace.configure(mode="off")
        assert t.recorder(backend="mujoco").enabled is False
        assert resettrace.stats() == {}
    """)
    assert _heavy(mods) == set()


def test_timing_mode_aggregates_without_the_otel_sdk() -> None:
    """The aggregation engine imports no OpenTelemetry: ``timing`` mode records and
    aggregates without the SDK (it used to load it for its span processor)."""
    mods = _modules_after("""
        import resettrace
        t = resettrace.configure(mode="timing")
        rec = t.recorder(backend="mujoco")
        with rec.scope("env_step"):
            pass
        assert t.stats()["env_step_total_ms"].count == 1
    """)
    assert not any(m.startswith("opentelemetry") for m in mods)
    assert not any(m.split(".")[0] == "mujoco" for m in mods)
    asked = _modules_after("from resettrace import TimingSpanProcessor")
    assert "opentelemetry.sdk.trace" in asked
