"""Tracing core: hot-path recorder, timing processor, span materialiser, exporters.

Only the recorder and the session are imported here; the OpenTelemetry SDK parts
(:mod:`.processor`, :mod:`.materializer`, the export wing :mod:`.export`) load when a
session that needs them is created.
"""

from resettrace.tracing.recorder import NOOP_RECORDER, NoopRecorder, Recorder
from resettrace.tracing.session import Tracing

__all__ = ["NOOP_RECORDER", "NoopRecorder", "Recorder", "Tracing"]
