"""Shared fixtures: fresh tracing sessions per test and small real MuJoCo backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers import FakeClock
from resettrace.config import Config
from resettrace.tracing.recorder import use_clock
from resettrace.tracing.session import Tracing


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """The recorder's clock replaced by a :class:`~helpers.FakeClock` for the test."""
    c = FakeClock()
    use_clock(c)
    yield c
    use_clock(None)


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
