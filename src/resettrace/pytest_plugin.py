"""pytest plugin (entry point ``pytest11``): per-test resettrace statistics.

Installed with resettrace and loaded by pytest in every session of every project that
installs resettrace, so importing this module loads nothing but pytest and the standard
library: the tracing session, the OpenTelemetry SDK and the simulators load inside the
fixture, in the tests that ask for it.

Fixture ``resettrace``
    For one test, a fresh ``Tracing(Config(mode="timing"))`` session is the default
    (:func:`resettrace.use_tracing`), whatever ``RESETTRACE`` says; the test receives a
    :class:`ResettraceCapture`. Backends and envs bind their recorder when they are
    created, so create them inside the test (or pass ``tracing=capture.session``): one
    built earlier, e.g. by a module-scoped fixture, records into the session that was the
    default then. After the test the previous default is restored and the session shut
    down.

Option ``--resettrace-json PATH``
    The run record (:mod:`resettrace.record`) of every test that used the fixture, keyed
    by node id, is written at the end of the session to ``PATH`` as ``{"resettrace":
    VERSION, "tests": {nodeid: RECORD (with "worker")}, "merged": RECORD, "workers":
    [...]}``; ``resettrace compare``, ``report``, ``merge`` and ``fit`` read the file as its
    ``merged`` record.
    Under pytest-xdist each worker hands its tests' results to the controller
    (``workeroutput``), which writes the one file: ``merged`` is every test's calls
    together, its percentiles read from the summed exponential buckets
    (:mod:`resettrace.distribution`). ``PATH`` is written by the
    rules of :mod:`resettrace.outputs`: a symbolic link or a folder there is a usage error
    at start-up, and a file that is not resettrace's is left as it is, the stats going to
    ``NAME.1.json`` beside it (the summary's line names the file written).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from resettrace.tracing.session import Tracing

__all__ = ["ResettraceCapture"]

JSON_OPTION = "--resettrace-json"
#: node id -> the test's stats, for the JSON report
_RESULTS = pytest.StashKey[dict[str, dict[str, Any]]]()
#: resolved ``--resettrace-json`` path (relative paths: to the invocation directory)
_JSON_PATH = pytest.StashKey[Path]()
#: the file written (beside ``_JSON_PATH`` when that is not resettrace's), or why none was
_WRITTEN = pytest.StashKey[Path | str]()


class ResettraceCapture:
    """What the ``resettrace`` fixture yields: one test's tracing session and its stats."""

    def __init__(self, session: Tracing) -> None:
        #: the test's ``Tracing`` session (default for the test's duration)
        self.session = session

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per timing key: ``count``, ``mean_ms``, ``p50_ms``, ``p90_ms``, ``p99_ms``,
        ``max_ms``, ``total_ms``, ``share_of_parent`` (as in ``timing.json``)."""
        return {key: s.as_dict() for key, s in self.session.stats().items()}

    def stat(self, key: str) -> dict[str, Any]:
        """The stats of one timing key; ``KeyError`` naming the keys seen if it has none."""
        stats = self.stats()
        try:
            return stats[key]
        except KeyError:
            if stats:
                seen = ", ".join(stats)
            else:
                seen = ("none (create envs/backends inside the test, "
                        "or pass tracing=capture.session)")
            raise KeyError(f"no resettrace stats for {key!r}; keys seen: {seen}") from None

    def samples(self) -> dict[str, list[float]]:
        """The kept samples per timing key, in arrival order."""
        return self.session.samples()

    def clear(self) -> None:
        """Forget everything recorded so far (e.g. after a warm-up)."""
        if self.session.aggregator is not None:
            self.session.aggregator.clear()

    def __repr__(self) -> str:
        return f"ResettraceCapture(keys={list(self.session.stats())})"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("resettrace", "resettrace timing statistics")
    group.addoption(JSON_OPTION, metavar="PATH", default=None,
                    help="write the resettrace stats of every test that used the "
                         "'resettrace' fixture to PATH (JSON, keyed by node id)")


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption(JSON_OPTION)
    if value:
        from resettrace import outputs

        # resolved now: tests may change the working directory
        path = Path(config.invocation_params.dir, value)
        if getattr(config, "workerinput", None) is None:  # the process that writes it
            try:  # a link or a folder there is said now, not after the tests; claimed:
                # a job that overlaps this session and writes it first keeps its file
                outputs.claim_output(path, outputs.JSON)
            except outputs.OutputRefused as e:
                raise pytest.UsageError(f"{JSON_OPTION}: {e}") from None
        config.stash[_JSON_PATH] = path
        config.stash[_RESULTS] = {}


@pytest.fixture
def resettrace(request: pytest.FixtureRequest) -> Iterator[ResettraceCapture]:
    """A fresh timing session as the default for this test; see the module docstring."""
    from resettrace import use_tracing
    from resettrace.config import Config
    from resettrace.tracing.session import Tracing

    session = Tracing(Config(mode="timing"))
    capture = ResettraceCapture(session)
    try:
        with use_tracing(session):
            yield capture
        results = request.config.stash.get(_RESULTS, None)
        if results is not None:
            import os

            from resettrace.record import record_of_session

            record = record_of_session(session, command=[request.node.nodeid],
                                       worker=os.environ.get("PYTEST_XDIST_WORKER", "main"))
            results[request.node.nodeid] = record.to_json()
    finally:
        session.shutdown()
        if session.aggregator is not None:
            # Tracing.shutdown leaves the timing processor's aggregation thread running
            session.aggregator.shutdown()


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    path = config.stash.get(_JSON_PATH, None)
    if path is None:
        return
    import json

    results = config.stash[_RESULTS]
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes the file
        workeroutput["resettrace"] = json.dumps(results)
        return
    from resettrace.merging import merge_records
    from resettrace.record import RunRecord
    from resettrace.tables import write_json

    merged: dict[str, Any] = {}
    if results:
        # tests, not a job's processes: xdist workers are each "rank 0"
        merged = merge_records([RunRecord.from_json(r, nodeid) for nodeid, r in results.items()],
                               allow_mixed=True, allow_duplicates=True,
                               command=["pytest"]).to_json()
    try:
        written: Path | str = write_json(path, {
            "tests": results, "merged": merged,
            "workers": sorted({r["worker"] for r in results.values()})})
    except OSError as e:  # said in the summary, in one line: not an internal error
        written = str(e)
    config.stash[_WRITTEN] = written


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist, on the controller: a worker finished; keep its tests' results."""
    import json

    raw = getattr(node, "workeroutput", {}).get("resettrace")
    results = node.config.stash.get(_RESULTS, None)
    if raw and results is not None:
        results.update(json.loads(raw))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    path = config.stash.get(_JSON_PATH, None)
    if path is None:
        return
    n = len(config.stash[_RESULTS])
    written = config.stash.get(_WRITTEN, path)
    if isinstance(written, str):
        terminalreporter.write_line(f"resettrace: stats not written: {written}")
        return
    beside = f" ({path} is not resettrace's: left as it is)" if written != path else ""
    terminalreporter.write_line(
        f"resettrace: stats of {n} test{'' if n == 1 else 's'} written to {written}{beside}")
