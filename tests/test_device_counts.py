"""A bool mask on a device is counted there, never waited for on the traced path: its
record holds a handle, its trace waits (parked, in order) until the count arrived, and a
read of the statistics or the session's shutdown settles the rest, counting what never
came. No CUDA device runs here: the device is a stand-in with a queue of work the test
runs (its counts raise if read before the device got to them); the torch starter is the
part left to a machine with a GPU."""

from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import resettrace
from resettrace import catalog as C
from resettrace.config import Config
from resettrace.merging import merge_records
from resettrace.record import record_of_session
from resettrace.tracing import devicecounts
from resettrace.tracing import recorder as recorder_module
from resettrace.tracing.layout import NO_COUNT, R_COUNT, R_PHASE
from resettrace.tracing.recorder import Recorder, count_of
from resettrace.tracing.session import Tracing


class Device:
    """A stand-in accelerator: work queued on it runs when the test says (:meth:`run`),
    or after ``lag`` queries of a count's event (a device that gets there meanwhile)."""

    type = "cuda"
    index = 0

    def __init__(self) -> None:
        self.queued = 0  # counts launched
        self.done = 0  # counts the device got through
        self.lag: int | None = None
        self.queries = 0

    def __str__(self) -> str:
        return "cuda:0"

    def run(self) -> None:
        self.done = self.queued


class Count:
    """A count launched on the device: its value once the device got there, else None."""

    def __init__(self, device: Device, n: int) -> None:
        device.queued += 1
        self.device, self.seq, self.n = device, device.queued, n

    def value(self) -> int | None:
        d = self.device
        d.queries += 1
        if d.lag is not None and d.queries >= d.lag:
            d.run()
        return self.n if d.done >= self.seq else None


class Mask:
    """A bool mask on the stand-in device: shape and dtype on the host, values not."""

    dtype = np.dtype(bool)
    ndim = 1

    def __init__(self, device: Device, values: list[bool]) -> None:
        self.device, self._values = device, values

    def __len__(self) -> int:
        return len(self._values)

    def sum(self) -> Any:
        raise AssertionError("counted on the host: a sync")

    __bool__ = __array__ = __iter__ = sum


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Iterator[Device]:
    dev = Device()
    monkeypatch.setitem(devicecounts.STARTERS, Mask.__module__.partition(".")[0],
                        lambda m: Count(m.device, sum(m._values)))
    monkeypatch.setattr(recorder_module, "_NOTED", set())
    yield dev
    # this process parks no more traces (as one that never counted on a device)
    devicecounts.settle(0.0, final=True)
    for rec in list(recorder_module._RECORDERS):
        s = rec._sinks
        if len(s) == 1 and type(s[0]) is devicecounts._Parking:
            rec._sinks = s[0].sinks
    devicecounts._ACTIVE[0] = False
    devicecounts._HELD.clear()
    for k in devicecounts.COUNTS:
        devicecounts.COUNTS[k] = 0
    recorder_module.DEVICES.clear()


class Sink:
    def __init__(self) -> None:
        self.traces: list[list[tuple[int, ...]]] = []

    def on_trace(self, trace: Any, rec: Any) -> None:
        self.traces.append([tuple(r) for r in trace])

    def counts(self, phase: C.Phase) -> list[int]:
        return [r[R_COUNT] for t in self.traces for r in t if r[R_PHASE] == phase.index]


def test_a_device_mask_is_counted_there_and_its_trace_waits_for_the_count(
        device: Device) -> None:
    sink = Sink()
    rec = Recorder([sink])
    mask = Mask(device, [True, False, True, True])
    handle = count_of(mask)
    assert handle < NO_COUNT and isinstance(handle, devicecounts.DeferredCount)
    assert not handle.done() and device.queued == 1
    with rec.scope(C.RESET_DONE, mask):  # a count started by the scope itself
        with rec.scope(C.DR_RESET):
            pass
    assert sink.traces == [] and device.done == 0  # parked: the device is behind
    with rec.scope(C.RESET_DONE, np.array([True, True, False])):  # a host count: 2
        pass
    assert sink.traces == []  # behind the first: traces keep their order
    device.run()
    with rec.scope(C.RESET_DONE, 0):
        pass
    assert sink.counts(C.RESET_DONE) == [3, 2, 0]
    assert sink.counts(C.DR_RESET) == [NO_COUNT]  # none given: none, not the mask's
    assert handle.done() and handle.wait() == 3  # read back: arrived
    # the other ways a count is given: lap, set_count, a traced call's argument, passed
    # on (a handle given as a count again)
    reset = resettrace.traced(C.SET_STATE, count="envs")(lambda envs: None)
    with rec.scope(C.RESET_DONE) as top:  # (traced calls join the trace open here)
        top.set_count(Mask(device, [True] * 5))
        with rec.scope(C.DR_RESET) as dr:
            dr.lap(C.DR_RESET_PLAN, Mask(device, [True, False]))
            dr.lap(None)
            reset(Mask(device, [True] * 7))
            reset(Mask(device, [False] * 7))
            dr.count = handle  # passed on: the same count
        device.lag = device.queries + 1  # the device gets there while Scope.count waits
        assert top.count == 5  # asked for inside the trace: waited for, as int(sum) is
    device.run()
    with rec.scope(C.RESET_DONE, 1):
        pass
    assert sink.counts(C.RESET_DONE)[-2:] == [5, 1]
    assert sink.counts(C.DR_RESET_PLAN) == [1]
    assert sink.counts(C.SET_STATE) == [7, 0]
    assert sink.counts(C.DR_RESET)[-1] == 3
    assert device.queued == 6 and devicecounts.COUNTS == {
        "deferred": 6, "arrived": 6, "lost": 0}


def test_a_flush_waits_for_the_device_and_shutdown_counts_what_never_came(
        device: Device) -> None:
    """A read hands on what landed, never waiting (a metrics scrape, a snapshot); a flush
    waits for the device; a shutdown records what never came as no count, counted."""
    session = Tracing(Config(mode="timing", shutdown_timeout_s=0.05))
    rec = session.recorder()
    for n in (3, 5):
        with rec.scope(C.RESET_DONE, Mask(device, [True] * n + [False])):
            pass
    assert session.aggregator.pending() == 0  # parked, not aggregated yet
    assert "reset_done_ms" not in session.stats()  # nothing landed: a read does not wait
    device.lag = device.queries + 3  # the device gets there during the flush's wait
    session.force_flush()
    stats = session.stats()
    assert stats["reset_done_ms"].count == 2
    fit = session.aggregator.fit_sums()["reset_done_ms"]
    assert (fit.n, fit.sk, fit.kmax) == (2, 8.0, 5.0)
    device.lag = None
    with rec.scope(C.RESET_DONE, Mask(device, [True] * 4)):  # the device hangs on it
        pass
    with rec.scope(C.RESET_DONE, 2):
        pass
    session.shutdown()
    fit = session.aggregator.fit_sums()["reset_done_ms"]
    assert session.aggregator.stats()["reset_done_ms"].count == 4  # every call timed
    assert (fit.n, fit.sk) == (3, 10.0)  # the lost count is none, never 0 or a guess
    assert devicecounts.COUNTS == {"deferred": 3, "arrived": 2, "lost": 1}
    record = record_of_session(session)
    assert record.extra["device_counts"] == {"deferred": 3, "arrived": 2, "lost": 1,
                                             "pending": 0}
    assert record.extra["devices"] == ["cuda:0"]
    # a job's: its members' summed (one that never counted on a device adds none)
    other = copy.deepcopy(record)
    del other.extra["device_counts"], other.extra["devices"]
    record.pid, other.pid = 11, 12
    record.rank, other.rank = 0, 1
    record.identity, other.identity = "rank 0", "rank 1"
    twice = copy.deepcopy(record)
    twice.pid, twice.rank, twice.identity = 13, 2, "rank 2"
    twice.extra["device_counts"]["pending"] = "2"  # (a record edited by hand: not a count)
    job = merge_records([record, other, twice])
    assert job.extra["device_counts"] == {"deferred": 6, "arrived": 4, "lost": 2,
                                          "pending": 0}


@pytest.mark.parametrize("exporter", ["memory", "file"])
def test_a_span_carries_the_count_that_arrived(device: Device, exporter: str,
                                               tmp_path: Path) -> None:
    """In-process spans and the export process's alike: the count, never the handle."""
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", shutdown_timeout_s=120.0, exporters=(
        "memory" if exporter == "memory" else f"file:{out}",)))
    rec = session.recorder()
    for n in (6, 2):
        with rec.scope(C.RESET_DONE, Mask(device, [True] * n)):
            with rec.scope(C.DR_RESET, 1):
                pass
    device.run()
    session.force_flush()
    if exporter == "memory":
        spans = [(s.name, s.attributes.get(C.ATTR_RESET_COUNT))
                 for s in session.exporters[0].get_finished_spans()]
    session.shutdown()
    if exporter == "file":
        spans = [(d["name"], d["attributes"].get(C.ATTR_RESET_COUNT))
                 for d in map(json.loads, out.read_text().splitlines())]
    assert sorted(spans) == [("dr_reset", 1), ("dr_reset", 1), ("reset_done", 2),
                             ("reset_done", 6)]
    assert session.export_report()["spans_dropped"] == 0


def test_too_many_traces_waiting_hand_the_oldest_on_without_its_count(
        device: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devicecounts, "MAX_PARKED", 2)
    sink = Sink()
    rec = Recorder([sink])
    for n in range(1, 6):  # the device never gets there
        with rec.scope(C.RESET_DONE, Mask(device, [True] * n)):
            pass
    assert sink.counts(C.RESET_DONE) == [NO_COUNT] * 3  # memory stays bounded: counted
    assert devicecounts.COUNTS["lost"] == 3
    device.run()
    devicecounts.settle(1.0)
    assert sink.counts(C.RESET_DONE) == [NO_COUNT] * 3 + [4, 5]


def test_a_forked_child_never_hands_on_its_parents_parked_traces(device: Device) -> None:
    sink = Sink()
    rec = Recorder([sink])
    with rec.scope(C.RESET_DONE, Mask(device, [True])):
        pass
    pid = os.fork()
    if pid == 0:  # the parent hands its trace on; the child has none
        device.run()
        with rec.scope(C.RESET_DONE, 2):
            pass
        os._exit(0 if sink.counts(C.RESET_DONE) == [2] else 3)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    device.run()
    devicecounts.settle(1.0)
    assert sink.counts(C.RESET_DONE) == [1]


def test_a_run_says_how_many_device_counts_never_arrived(tmp_path: Path) -> None:
    """A process that ends with a count still on the device (its device hung): the trace
    is aggregated without it at exit, its record and the job count it, and ``resettrace
    run`` says it in one line."""
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import numpy as np
        import resettrace
        from resettrace.tracing import devicecounts

        class Device:
            type, index = "cuda", 0
            def __str__(self):
                return "cuda:0"

        class Never:  # a count the device never gets to
            def value(self):
                return None

        class Mask:
            dtype, ndim, device = np.dtype(bool), 1, Device()
            def __len__(self):
                return 4

        devicecounts.STARTERS["__main__"] = lambda mask: Never()

        @resettrace.traced("set_state", count="done")
        def reset(done):
            return None

        for _ in range(3):
            reset(Mask())
        reset(np.ones(2, bool))
    """))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RESETTRACE") or k == "RESETTRACE_PURE_PYTHON"}
    env["RESETTRACE_SHUTDOWN_TIMEOUT"] = "0.2"
    r = subprocess.run([sys.executable, "-m", "resettrace.cli", "run", "--stats-json",
                        "job.json", "--", sys.executable, "train.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["stats"]["dr_reset_set_state_ms"]["count"] == 4  # every call, at exit
    assert job["device_counts"] == {"deferred": 3, "arrived": 0, "lost": 3, "pending": 0}
    assert job["model"]["keys"]["dr_reset_set_state_ms"]["sums"]["n"] == 1  # the one that came
    said = [line for line in r.stderr.splitlines() if "never arrived" in line]
    assert said == ["resettrace: 3 env counts on a device never arrived; their records have "
                    "no count (logged once)",  # the process's, then the run's summary
                    "resettrace run: 3 env counts on a device never arrived (the device was "
                    "still busy at shutdown, or too many traces waited): those calls have no "
                    "count"]


def test_a_count_dropped_before_its_trace_closed_is_lost_and_holds_nothing_back(
        device: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread holds the counts it started for the trace that records them, up to a
    bound: past it (counts read and never recorded, in one trace) the oldest goes, and
    its trace is handed on with no count there (counted) rather than parked for good."""
    monkeypatch.setattr(devicecounts, "_HELD_MAX", 4)
    sink = Sink()
    rec = Recorder([sink])
    with rec.scope(C.RESET_DONE) as top:
        top.set_count(Mask(device, [True] * 3))  # (the record alone holds its handle)
        for _ in range(8):  # read alone: never recorded
            count_of(Mask(device, [True]))
        gc.collect()
    with rec.scope(C.RESET_DONE, 2):
        pass
    devicecounts.settle(0.0)  # (the device got nowhere: nothing to wait for)
    assert sink.counts(C.RESET_DONE) == [NO_COUNT, 2]
    assert devicecounts.COUNTS == {"deferred": 1, "arrived": 0, "lost": 1}


def test_a_parked_trace_outlives_its_recorder(device: Device) -> None:
    sink = Sink()
    rec = Recorder([sink])
    with rec.scope(C.RESET_DONE, Mask(device, [True] * 3)):
        pass
    del rec
    gc.collect()
    device.run()
    devicecounts.settle(0.0)
    assert sink.counts(C.RESET_DONE) == [3]


def test_a_trace_closed_while_traces_are_handed_on_waits_its_turn(device: Device) -> None:
    """A trace that closes on the thread handing traces on (a signal handler's, a sink
    that records) is queued behind them: every trace once, in order."""

    class Recording(Sink):
        def on_trace(self, trace: Any, r: Any) -> None:
            super().on_trace(trace, r)
            if len(self.traces) == 1:
                with rec.scope(C.RESET_DONE, 9):  # inside the hand-over
                    pass

    sink = Recording()
    rec2 = Recorder([sink])
    with rec2.scope(C.RESET_DONE, Mask(device, [True])):
        pass
    rec = Recorder([])
    rec._sinks = rec2._sinks  # (one parking: rec's traces are sink's too)
    with rec2.scope(C.RESET_DONE, 2):
        pass
    device.run()
    with rec2.scope(C.RESET_DONE, 3):
        pass
    assert sink.counts(C.RESET_DONE) == [1, 2, 3, 9]


class HeldUp(Sink):
    """A sink that holds up the first trace it gets until :attr:`gate` opens (a lock
    another thread holds), saying so on :attr:`inside`."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.inside = threading.Event(), threading.Event()

    def on_trace(self, trace: Any, r: Any) -> None:
        if not self.traces:
            self.inside.set()
            self.gate.wait()
        super().on_trace(trace, r)


def _a_reader_inside_a_sink(device: Device) -> tuple[HeldUp, Recorder, threading.Thread]:
    """A recorder whose first trace (a count of 1 that landed) a reader thread's settle
    is handing on, held up inside the sink."""
    sink = HeldUp()
    rec = Recorder([sink])
    with rec.scope(C.RESET_DONE, Mask(device, [True])):
        pass
    device.run()
    reader = threading.Thread(target=devicecounts.settle, args=(0.0,))
    reader.start()
    assert sink.inside.wait(60)
    return sink, rec, reader


def test_a_sink_that_waits_never_holds_up_the_training_thread(device: Device) -> None:
    """A reader thread handing traces on into a sink that waits (a lock another thread
    holds) leaves the training thread free: its traces queue behind, none lost."""
    sink, rec, reader = _a_reader_inside_a_sink(device)
    for n in (2, 3):  # returns while the reader's hand-over waits
        with rec.scope(C.RESET_DONE, n):
            pass
    sink.gate.set()
    reader.join()
    devicecounts.settle(0.0)
    assert sink.counts(C.RESET_DONE) == [1, 2, 3]


def test_a_parked_trace_keeps_the_attributes_it_closed_with(device: Device,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "spans.jsonl"
    session = Tracing(Config(mode="trace", shutdown_timeout_s=120.0,
                             exporters=(f"file:{out}",)))
    rec = session.recorder(attributes={"mylab.stage": 1})
    with rec.scope(C.RESET_DONE, Mask(device, [True] * 4)):
        pass
    device.lag = device.queries + 2  # the device gets there while the change waits
    rec.attributes["mylab.stage"] = 2
    with rec.scope(C.RESET_DONE, 1):
        pass
    session.shutdown()
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(d["attributes"][C.ATTR_RESET_COUNT], d["attributes"]["mylab.stage"])
            for d in spans if d["name"] == "reset_done"] == [(4, 1), (1, 2)]


def test_a_cuda_mask_is_counted_with_launches_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch starter, against a stand-in of torch's CUDA calls (no GPU here): the count
    and a non-blocking copy into pinned memory that holds -1 until it lands; whether it
    landed is a read of that memory; no count while a CUDA graph is captured."""
    calls: list[str] = []

    class HostInt:
        def __init__(self) -> None:
            self.v = -1

        def copy_(self, src: Any, non_blocking: bool = False) -> None:
            calls.append(f"copy non_blocking={non_blocking}")
            self.landing = src

        def __int__(self) -> int:
            return self.v

    class Cuda:
        capturing = False

        @staticmethod
        def current_device() -> int:
            return 0

        @classmethod
        def is_current_stream_capturing(cls) -> bool:
            return cls.capturing

        @staticmethod
        def synchronize() -> None:
            raise AssertionError("a host sync")

    class Torch:
        int64, cuda = "int64", Cuda

        @staticmethod
        def count_nonzero(mask: Any) -> str:
            calls.append("count_nonzero")
            return "n on the device"

        @staticmethod
        def full(shape: Any, value: int, dtype: Any, pin_memory: bool) -> HostInt:
            calls.append(f"full({value}) pinned={pin_memory}")
            return HostInt()

    class Dev:
        type, index = "cuda", 0

    class TensorMask:
        device = Dev()

    monkeypatch.setitem(sys.modules, "torch", Torch)
    pending = devicecounts._start_torch(TensorMask())
    assert calls == ["count_nonzero", "full(-1) pinned=True", "copy non_blocking=True"]
    assert pending.value() is None  # not landed: no wait
    pending.host.v = 7  # the copy landed
    assert pending.value() == 7
    Cuda.capturing = True
    assert devicecounts._start_torch(TensorMask()) is None
    assert len(calls) == 3


def test_a_scope_entered_again_records_its_device_count_again(device: Device) -> None:
    sink = Sink()
    rec = Recorder([sink])
    s = rec.scope(C.RESET_DONE, Mask(device, [True] * 3))
    for _ in range(2):  # one scope object, two traces: the same count in both
        with s:
            pass
    device.run()
    devicecounts.settle(0.0)
    assert sink.counts(C.RESET_DONE) == [3, 3]


def test_a_count_set_from_another_thread_or_across_an_overflow_arrives(
        device: Device) -> None:
    """Every record holding a count on the device is found when its trace closes, on
    whichever thread the count was read, across an overflow that cut the trace."""
    sink = Sink()
    rec = Recorder([sink])
    with rec.scope(C.RESET_DONE, Mask(device, [True])):
        pass
    with rec.scope(C.RESET_DONE) as top:
        t = threading.Thread(target=top.set_count, args=(Mask(device, [True] * 2),))
        t.start()
        t.join()
    old = recorder_module.MAX_TRACE_RECORDS
    recorder_module.set_max_trace_records(4)
    try:
        s = rec.scope(C.RESET_DONE, Mask(device, [True] * 3))
        with rec.scope(C.ENV_STEP):
            for _ in range(5):  # the trace overflows, and its next one holds the count too
                with s:
                    pass
    finally:
        recorder_module.set_max_trace_records(old)
    device.run()
    devicecounts.settle(0.0)
    assert sink.counts(C.RESET_DONE) == [1, 2, 3, 3, 3, 3, 3]
    assert all(r[R_COUNT] >= NO_COUNT for t in sink.traces for r in t)


def test_a_final_settle_while_another_thread_hands_on_finishes_the_job(
        device: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shutdown's final settle, and the bound on parked traces, hold while another
    thread is inside a sink: that thread goes on to the end."""
    monkeypatch.setattr(devicecounts, "MAX_PARKED", 2)
    sink, rec, reader = _a_reader_inside_a_sink(device)
    for n in range(2, 8):  # the device never gets to these
        with rec.scope(C.RESET_DONE, Mask(device, [True] * n)):
            pass
    sink.gate.set()
    reader.join()
    assert sink.counts(C.RESET_DONE) == [1] + [NO_COUNT] * 4  # the bound, kept
    del sink.traces[1:]
    with rec.scope(C.RESET_DONE, Mask(device, [True] * 9)):
        pass
    assert sink.counts(C.RESET_DONE) == [1, NO_COUNT]  # (past the bound again)
    devicecounts.settle(0.0, final=True)
    assert sink.counts(C.RESET_DONE) == [1] + [NO_COUNT] * 3
    c = devicecounts.COUNTS
    assert c["deferred"] == c["arrived"] + c["lost"] == 8


def test_an_env_count_on_a_device_starts_no_count(device: Device) -> None:
    assert recorder_module.env_count_of(Mask(device, [True] * 3)) == NO_COUNT
    assert device.queued == 0


def test_a_final_settle_from_another_thread_waits_for_the_hand_on_under_way(
        device: Device) -> None:
    """A shutdown on one thread while another is inside a sink: it returns once that one
    handed every trace on, none left parked for a stopped aggregation to miss."""
    sink, rec, reader = _a_reader_inside_a_sink(device)
    with rec.scope(C.RESET_DONE, Mask(device, [True] * 2)):
        pass
    (parking,) = rec._sinks
    device.lag = device.queries + 2  # it lands while the final settle waits for it
    final = threading.Thread(target=devicecounts.settle, args=(120.0,),
                             kwargs={"final": True})
    final.start()
    while not parking.final_wanted and final.is_alive():  # (it waits for the reader)
        final.join(0.01)
    sink.gate.set()
    final.join()
    reader.join()
    assert sink.counts(C.RESET_DONE) == [1, 2] and not parking.parked
