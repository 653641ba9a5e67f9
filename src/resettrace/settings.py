"""Every environment variable resettrace reads, in one place: what it does, its default,
and (a number) the range it must be in, read from :data:`resettrace.config.NUMBERS`.

docs/configuration.md's table and ``resettrace --help``'s list are generated from
:data:`SETTINGS` (``make docs`` rewrites the table; a test checks both); how each value
is read and checked is :mod:`resettrace.config`'s.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from resettrace.config import NUMBERS, NUMBERS_OF_RUNS, Number

__all__ = ["Setting", "SETTINGS", "markdown_table", "help_text", "write_docs"]


@dataclass(frozen=True)
class Setting:
    """One variable: ``text`` what it takes and does (Markdown, in the docs' table),
    ``short`` the same in a few words (``--help``), ``default`` as shown, ``number`` its
    field in :data:`~resettrace.config.NUMBERS` or ``NUMBERS_OF_RUNS`` (the range is
    appended to ``text`` from there)."""

    var: str
    text: str
    short: str
    default: str = ""
    number: str | None = None

    @property
    def range(self) -> Number | None:
        if self.number is None:
            return None
        return NUMBERS.get(self.number) or NUMBERS_OF_RUNS[self.number]


SETTINGS: tuple[Setting, ...] = (
    Setting("RESETTRACE", "`off`, `timing` (aggregate only), `trace` (aggregate and export "
            "spans)", "off, timing or trace", "`off`"),
    Setting("RESETTRACE_EXPORTER", "comma-separated: `otlp`, `file:PATH` (JSON lines), "
            "`perfetto:PATH` (Chrome trace JSON), `otlp-json:PATH` (OTLP-JSON), "
            "`jaeger-json:PATH` (Jaeger UI upload, no server), `memory`; paths may hold "
            "`{pid}`, `{rank}`; a symbolic link there is refused, a file that is not "
            "resettrace's kept (see [Span files](jaeger.md#span-files)); an item named twice "
            "is used once, two file kinds on one path are an error",
            "span sinks of trace mode", "`file:resettrace-spans.jsonl`"),
    Setting("RESETTRACE_SAMPLE_EVERY", "export 1 trace in K", "export 1 trace in K", "`1`",
            "sample_every"),
    Setting("RESETTRACE_SAMPLE", "`all`, or `slowest:W`: only the trace with the slowest "
            "`reset_done` of each W", "all, or slowest:W", "`all`"),
    Setting("RESETTRACE_MAX_SAMPLES", "samples kept per key for percentiles, count, mean, "
            "max, total stay exact", "samples kept per key", "`100000`", "max_samples"),
    Setting("RESETTRACE_QUEUE_SIZE", "traces waiting for the export process; beyond it "
            "traces are dropped and counted", "traces waiting for export", "`4096`",
            "queue_size"),
    Setting("RESETTRACE_AGGREGATE_QUEUE", "traces waiting for the aggregation thread "
            "(timing statistics); beyond it traces are dropped and counted "
            "(`Tracing.dropped_traces`, the run record's `traces_dropped`, one warning at "
            "shutdown)", "traces waiting for aggregation", "`100000`", "aggregate_queue"),
    Setting("RESETTRACE_SHUTDOWN_TIMEOUT", "seconds the final flush may take before the "
            "export process is stopped", "seconds for the final flush", "`2`",
            "shutdown_timeout_s"),
    Setting("RESETTRACE_WORKER_RANK", "worker rank, resource attribute "
            "`resettrace.worker.rank`, else `RANK` (torchrun), else `SLURM_PROCID` (srun) "
            "when it holds a valid rank; a multiprocessing worker given none: parent rank x "
            "1000 + its worker number (see \"Worker processes\")", "this worker's rank",
            "`0`", "worker_rank"),
    Setting("RESETTRACE_HANDLE_SIGTERM", "flush spans on SIGTERM when no other handler is "
            "installed", "flush spans on SIGTERM", "`1`"),
    Setting("RESETTRACE_METRICS", "`off`, or comma-separated: `otlp` (push OTLP metrics), "
            "`prometheus`, `prometheus:PORT` or `prometheus:HOST:PORT` (scrape endpoint; "
            "`[::1]:PORT` for IPv6); each process serves its own: the first to bind PORT "
            "gets it, every other one a port the OS chooses (said in one line); PORT `0`: "
            "every process on a port the OS chooses; see "
            "[Metrics](metrics.md#every-process-of-a-job)",
            "otlp, prometheus[:[HOST:]PORT]", "`off`; Prometheus on `127.0.0.1:9464`"),
    Setting("RESETTRACE_PROMETHEUS_SD", "a folder where each process serving Prometheus "
            "metrics lists its endpoint in a `file_sd` file of its own "
            "(`resettrace-HOST-PID.json`), removed when it stops serving; point "
            "Prometheus's `file_sd_configs` at `DIR/*.json`",
            "folder of Prometheus file_sd files", "none"),
    Setting("OTEL_METRIC_EXPORT_INTERVAL", "ms between OTLP metric pushes",
            "ms between OTLP metric pushes", "`60000`", "metrics_interval_s"),
    Setting("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "seconds one OTLP metrics push may take",
            "seconds per OTLP metrics push", "the OTLP timeout", "metrics_timeout_s"),
    Setting("OTEL_EXPORTER_OTLP_ENDPOINT", "collector for `otlp` (`..._TRACES_ENDPOINT` "
            "wins): `http://` or `https://` URL; for gRPC also `HOST:PORT`, which means TLS "
            "unless `OTEL_EXPORTER_OTLP_INSECURE=true`", "collector for otlp",
            "`http://localhost:4317`"),
    Setting("OTEL_EXPORTER_OTLP_PROTOCOL", "`grpc` or `http/protobuf` "
            "(`..._TRACES_PROTOCOL` wins)", "grpc or http/protobuf", "`grpc`"),
    Setting("OTEL_EXPORTER_OTLP_COMPRESSION", "`none`, `gzip` or `deflate` "
            "(`..._TRACES_COMPRESSION` wins)", "none, gzip or deflate", "`none`"),
    Setting("OTEL_EXPORTER_OTLP_TIMEOUT", "seconds one OTLP export may take, its retries "
            "included", "seconds per OTLP export", "`2`", "otlp_timeout_s"),
    Setting("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "spans per export call",
            "spans per export call", "`512`", "export_batch_size"),
    Setting("OTEL_BSP_SCHEDULE_DELAY", "ms a span waits at most for its export call",
            "ms a span waits for export", "`1000`", "export_delay_s"),
    Setting("OTEL_SERVICE_NAME", "`service.name` of exported spans",
            "service.name of exported spans", "`resettrace`"),
    Setting("RESETTRACE_INSTRUMENT", "a TOML spec of functions to record, installed by "
            "`import resettrace` (see [Trace your own env](instrument.md))",
            "a TOML spec of functions to record"),
    Setting("RESETTRACE_RUN_JSON", "a path where every process that recorded something "
            "keeps its run record current (a snapshot every `RESETTRACE_RECORD_PERIOD`, the "
            "complete record at exit) (`{pid}`, `{rank}` expand; without either only the "
            "first process of a job writes); `resettrace run` sets it",
            "where each process keeps its run record"),
    Setting("RESETTRACE_RECORD_PERIOD", "seconds between snapshots of a process's run "
            "record, so a killed process leaves its last one (0: only at exit; see "
            "[Jobs](jobs.md))", "seconds between run record snapshots", "`5`",
            "record_period_s"),
    Setting("RESETTRACE_JOB_WAIT", "seconds `resettrace run` waits, after its command "
            "ended, for members still running or ranks not yet written",
            "seconds resettrace run waits for members", "`10`", "job_wait_s"),
    Setting("OTEL_SDK_DISABLED", "`true` runs `trace` as `timing`",
            "true: trace runs as timing"),
    Setting("RESETTRACE_PURE_PYTHON", "`1`: record with the pure-Python recorder even where "
            "the compiled one is built (they record the same; on `bench overhead` the "
            "compiled one adds about a fifth of what the Python one adds to a reset trace, "
            "see benchmarks)", "1: the pure-Python recorder", "`0`"),
    Setting("RESETTRACE_SPAN_ENCODER", "`records`: the export process writes every format "
            "from the records; `sdk`: it builds SDK spans first (for comparison)",
            "records or sdk", "`records`"),
)


def _bound(x: float) -> str:
    if x == 2**31 - 1:
        return "2^31-1"
    if float(x).is_integer() and x >= 10**5 and re.fullmatch(r"10*", str(int(x))):
        return f"10^{len(str(int(x))) - 1}"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _text(s: Setting) -> str:
    r = s.range
    if r is None:
        return s.text
    return f"{s.text} ({_bound(r.low)} - {_bound(r.high)})"


def markdown_table() -> str:
    """docs/configuration.md's table of variables."""
    rows = ["| variable | values (numbers: valid range) | default |", "|---|---|---|"]
    rows += [f"| `{s.var}` | {_text(s)} | {s.default} |" for s in SETTINGS]
    return "\n".join(rows) + "\n"


def help_text(width: int = 88) -> str:
    """The variables for ``resettrace --help``: each with a few words and its default."""
    out = ["environment variables (all optional; docs/configuration.md says more):"]
    name_w = max(len(s.var) for s in SETTINGS) + 2
    for s in SETTINGS:
        default = s.default.replace("`", "")
        line = s.short + (f" (default {default})" if default else "")
        wrapped = textwrap.wrap(line, width - name_w - 2, break_on_hyphens=False) or [""]
        out.append(f"  {s.var.ljust(name_w)}{wrapped[0]}")
        out += [" " * (name_w + 2) + w for w in wrapped[1:]]
    return "\n".join(out)


#: the generated part of docs/configuration.md lies between these lines
BEGIN = "<!-- the variables: generated from resettrace/settings.py by `make docs` -->"
END = "<!-- end of the generated variables -->"


def write_docs(path: str | Path) -> bool:
    """Rewrite the table between :data:`BEGIN` and :data:`END` in ``path``; whether it
    changed."""
    p = Path(path)
    text = p.read_text()
    head, begin, rest = text.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{p}: no {BEGIN!r} ... {END!r} region")
    new = head + begin + markdown_table() + end + tail
    if new != text:
        p.write_text(new)
    return new != text


if __name__ == "__main__":  # pragma: no cover
    import sys

    for name in sys.argv[1:]:
        try:
            write_docs(name)
        except (OSError, ValueError) as e:
            print(f"resettrace.settings: {e}", file=sys.stderr)
            raise SystemExit(2) from None
