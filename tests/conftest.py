"""Shared fixtures: fresh tracing sessions per test and small real MuJoCo backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from resettrace.config import Config
from resettrace.tracing.session import Tracing


@pytest.fixture
def timing_session() -> Iterator[Tracing]:
    t = Tracing(Config(mode="timing"))
    yield t
    t.shutdown()


@pytest.fixture
def trace_session() -> Iterator[Tracing]:
    """``trace`` mode into an in-memory exporter: ``session.exporters[0].get_finished_spans()``."""
    t = Tracing(Config(mode="trace", exporters=("memory",)))
    yield t
    t.shutdown()
