"""Real, in-process OTLP trace receivers: for the overhead benchmark and the tests.

Everything binds to ``127.0.0.1`` on an ephemeral port chosen by the OS:

* :class:`GrpcReceiver` -- a grpcio server implementing ``TraceService/Export``.
* :class:`HttpReceiver` -- a stdlib ``ThreadingHTTPServer`` accepting
  ``POST /v1/traces`` (``application/x-protobuf``, optionally gzip/deflate encoded).

Either can be slow (``delay_s``: the answer comes that much later), refuse every request
(``refuse=``: a gRPC status name such as ``"UNAVAILABLE"``, or an HTTP status such as 503
or 413; the spans of refused requests are kept apart, in :attr:`refused`), and speak TLS
(``tls=(certfile, keyfile)``: the endpoint is then ``https://``). Each request's headers
(gRPC metadata) are kept in :attr:`headers`.
* :class:`BlackholeListener` -- accepts TCP connections and never reads or answers.
* :func:`refused_endpoint` -- an endpoint on which nothing listens.

Both receivers decode every span into a plain, frozen :class:`ReceivedSpan`::

    with GrpcReceiver() as rx:
        exporter = OTLPSpanExporter(endpoint=rx.endpoint, insecure=True)
        ...
        (span,) = rx.wait_for(1)

``from resettrace.testing.receivers import GrpcReceiver`` (grpcio and the OTLP protos
come with ``opentelemetry-exporter-otlp``).
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import zlib
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

__all__ = [
    "TRACES_PATH",
    "BlackholeListener",
    "GrpcReceiver",
    "HttpReceiver",
    "ReceivedSpan",
    "decode_request",
    "refused_endpoint",
    "self_signed_certificate",
]

HOST = "127.0.0.1"
TRACES_PATH = "/v1/traces"
_PROTOBUF = "application/x-protobuf"


# --------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class ReceivedSpan:
    """One received span, decoded to plain Python values."""

    name: str
    trace_id: str  # 32 lowercase hex chars
    span_id: str  # 16 lowercase hex chars
    parent_span_id: str | None  # 16 hex chars, None for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0  # 0 unset, 1 ok, 2 error (opentelemetry.proto Status.StatusCode)
    resource: dict[str, Any] = field(default_factory=dict)  # its ResourceSpans' attributes
    scope_name: str = ""  # instrumentation scope name
    status_message: str = ""
    kind: int = 0  # Span.SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, ...

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _any_value(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(_any_value(x) for x in v.array_value.values)
    if which == "kvlist_value":
        return _kv_dict(v.kvlist_value.values)
    return getattr(v, which)  # string_value/bool_value/int_value/double_value/bytes_value


def _kv_dict(kvs) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def decode_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Flatten an ``ExportTraceServiceRequest`` into :class:`ReceivedSpan` records."""
    out: list[ReceivedSpan] = []
    for rs in request.resource_spans:
        resource = _kv_dict(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex() or None,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_kv_dict(s.attributes),
                        status_code=int(s.status.code),
                        resource=dict(resource),
                        scope_name=ss.scope.name,
                        status_message=s.status.message,
                        kind=int(s.kind),
                    )
                )
    return out


# --------------------------------------------------------------------------- storage


class _Receiver:
    """Thread-safe span store shared by both receivers, plus start/stop plumbing."""

    def __init__(self, delay_s: float = 0.0, *, count_only: bool = False,
                 refuse: Any = None, tls: tuple[str, str] | None = None) -> None:
        self.delay_s = float(delay_s)
        #: only count spans (what a load test needs), keeping none
        self.count_only = count_only
        #: answer every request with this error (gRPC status name or HTTP status)
        self.refuse = refuse
        #: (certificate file, key file) of a TLS server
        self.tls = tls
        self.counted = 0
        #: spans in each export request, in arrival order
        self.request_spans: list[int] = []
        #: spans of the requests refused (every attempt: a retried request twice)
        self.refused: list[ReceivedSpan] = []
        #: each request's headers or metadata, keys in lower case
        self.headers: list[dict[str, str]] = []
        self._cond = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self._requests = 0
        self._stopping = threading.Event()
        self._port: int | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    # -- records
    def _record(self, request: trace_service_pb2.ExportTraceServiceRequest,
                headers: dict[str, str] | None = None) -> bool:
        """Keep a request's spans; False when it is to be refused (its spans kept apart)."""
        with self._cond:
            self.headers.append(dict(headers or {}))
        if self.refuse is not None:
            decoded = decode_request(request)
            with self._cond:
                self.refused.extend(decoded)
            return False
        if self.count_only:
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with self._cond:
                self._requests += 1
                self.request_spans.append(n)
                self.counted += n
            return True
        decoded = decode_request(request)
        with self._cond:
            self._requests += 1
            self.request_spans.append(len(decoded))
            self._spans.extend(decoded)
            self._cond.notify_all()
        return True

    def span_keys(self) -> set[tuple[str, str]]:
        """(trace id, span id) of every distinct span received: a span sent again by a
        retry after a timed-out attempt counts once."""
        with self._cond:
            return {(s.trace_id, s.span_id) for s in self._spans}

    def _delay(self) -> None:
        # Interruptible by stop(), so a slow receiver never blocks teardown.
        if self.delay_s > 0:
            self._stopping.wait(self.delay_s)

    def spans(self) -> list[ReceivedSpan]:
        """A copy of every span received so far, in arrival order."""
        with self._cond:
            return list(self._spans)

    def by_name(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans() if s.name == name]

    @property
    def requests(self) -> int:
        """Number of export requests received (decoded successfully)."""
        with self._cond:
            return self._requests

    def wait_for(self, n: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        """Block until at least ``n`` spans arrived; return a copy of all spans.

        Raises ``AssertionError`` (with the count) on timeout.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._spans) >= n, timeout=timeout):
                raise AssertionError(
                    f"{type(self).__name__}: expected at least {n} span(s) within {timeout}s, "
                    f"got {len(self._spans)} in {self._requests} request(s)"
                )
            return list(self._spans)

    def clear(self) -> None:
        with self._cond:
            self._spans.clear()
            self.request_spans.clear()
            self._requests = 0

    # -- lifecycle
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    @property
    def running(self) -> bool:
        return self._port is not None

    def start(self):  # -> Self
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):  # -> Self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- gRPC


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, owner: GrpcReceiver) -> None:
        self._owner = owner

    def Export(self, request, context):  # grpc method name
        owner = self._owner
        headers = {k.lower(): v for k, v in context.invocation_metadata()
                   if isinstance(v, str)}
        accepted = owner._record(request, headers)
        owner._delay()
        if not accepted:
            context.abort(getattr(grpc.StatusCode, str(owner.refuse)), "refused by the test")
        return trace_service_pb2.ExportTraceServiceResponse()


class GrpcReceiver(_Receiver):
    """OTLP/gRPC trace receiver on ``127.0.0.1:<ephemeral>``.

    Spans are recorded on arrival; with ``delay_s`` the answer is sent that much later
    (so a client that times out still left its spans here, as with a real slow collector).
    """

    def __init__(self, delay_s: float = 0.0, max_workers: int = 8, *,
                 count_only: bool = False, refuse: str | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        super().__init__(delay_s, count_only=count_only, refuse=refuse, tls=tls)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://{HOST}:{self.port}"

    def start(self) -> GrpcReceiver:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers),
            options=[("grpc.so_reuseport", 0)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), server)
        if self.tls:
            with open(self.tls[0], "rb") as f:
                cert = f.read()
            with open(self.tls[1], "rb") as f:
                key = f.read()
            port = server.add_secure_port(f"{HOST}:0",
                                          grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(f"{HOST}:0")
        if not port:
            raise RuntimeError("grpc could not bind 127.0.0.1:0")
        server.start()
        self._server, self._port = server, port
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        self._port = None
        self._stopping.set()
        if server is not None:
            server.stop(grace=None).wait(5.0)


class GrpcMetricsReceiver:
    """OTLP/gRPC metrics receiver on ``127.0.0.1:<ephemeral>``: keeps every request."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> GrpcMetricsReceiver:
        from opentelemetry.proto.collector.metrics.v1 import (
            metrics_service_pb2,
            metrics_service_pb2_grpc,
        )

        owner = self

        class _Service(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # grpc method name
                with owner._lock:
                    owner.requests.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                             options=[("grpc.so_reuseport", 0)])
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Service(), server)
        self.port = server.add_insecure_port(f"{HOST}:0")
        server.start()
        self._server = server
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5.0)
            self._server = None

    def last(self) -> Any:
        """The latest request (cumulative metrics: it holds everything)."""
        with self._lock:
            return self.requests[-1] if self.requests else None


# --------------------------------------------------------------------------- HTTP


class _OtlpHttpHandler(BaseHTTPRequestHandler):
    server: _OtlpHttpServer
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers after stop()

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output quiet

    def _reply(self, code: int, body: bytes = b"", content_type: str = _PROTOBUF) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self._reply(404, b"not found", "text/plain")
            return
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if ctype != _PROTOBUF:
            self._reply(415, f"unsupported content type {ctype!r}".encode(), "text/plain")
            return
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding not in ("", "identity"):
                self._reply(415, f"unsupported encoding {encoding!r}".encode(), "text/plain")
                return
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
        except (OSError, zlib.error, DecodeError) as e:
            self._reply(400, f"bad request body: {e}".encode(), "text/plain")
            return
        accepted = owner._record(request, {k.lower(): v for k, v in self.headers.items()})
        owner._delay()
        if not accepted:
            self._reply(int(owner.refuse), b"refused by the test", "text/plain")
            return
        self._reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def do_GET(self) -> None:
        self._reply(404 if self.path.split("?", 1)[0] != TRACES_PATH else 405, b"", "text/plain")


class _OtlpHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, owner: HttpReceiver) -> None:
        self.owner = owner
        super().__init__((HOST, 0), _OtlpHttpHandler)

    def shutdown_request(self, request: Any) -> None:
        # a slow answer may outlive stop(), which closed the connection already
        with contextlib.suppress(OSError):
            super().shutdown_request(request)


class HttpReceiver(_Receiver):
    """OTLP/HTTP (protobuf) trace receiver on ``http://127.0.0.1:<ephemeral>/v1/traces``.

    200 + empty ``ExportTraceServiceResponse`` for a valid export, 404 for other paths,
    415 for non-protobuf content types or unknown encodings, 400 for undecodable bodies.
    """

    def __init__(self, delay_s: float = 0.0, *, refuse: int | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        super().__init__(delay_s, refuse=refuse, tls=tls)
        self._server: _OtlpHttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.port}"

    @property
    def endpoint(self) -> str:
        return self.base_url + TRACES_PATH

    def start(self) -> HttpReceiver:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _OtlpHttpServer(self)
        if self.tls:
            import ssl

            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*self.tls)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"otlp-http-rx-{server.server_address[1]}",
            daemon=True,
        )
        thread.start()
        self._server, self._thread, self._port = server, thread, server.server_address[1]
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        self._port = None
        self._stopping.set()
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(5.0)


# --------------------------------------------------------------------------- failures


class BlackholeListener:
    """TCP listener that accepts connections and never reads from or answers them.

    Sockets stay open until :meth:`stop`, so a client hangs until its own timeout.
    """

    def __init__(self, port: int = 0) -> None:
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._port: int | None = None
        self._want = port  # 0: any free port

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("BlackholeListener is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """For the gRPC exporter."""
        return f"http://{HOST}:{self.port}"

    @property
    def http_endpoint(self) -> str:
        """For the HTTP exporter."""
        return self.endpoint + TRACES_PATH

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return len(self._conns)

    def start(self) -> BlackholeListener:
        if self._sock is not None:
            return self
        self._stopping.clear()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((HOST, self._want))
        sock.listen(64)
        sock.settimeout(0.05)  # accept loop polls the stop flag
        self._sock, self._port = sock, sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"blackhole-{self._port}", daemon=True
        )
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with self._lock:
            for c in self._conns:
                try:
                    c.close()
                except OSError:
                    pass
            self._conns.clear()
        self._port = None

    def __enter__(self) -> BlackholeListener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def refused_endpoint(path: str = "") -> str:
    """``http://127.0.0.1:PORT`` + ``path`` for a port nothing listens on (connection refused).

    The port is taken from a socket bound to port 0 and closed again at once, so it is free
    (barring a race with another process). ``refused_endpoint(TRACES_PATH)`` suits the HTTP
    exporter.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    return f"http://{HOST}:{port}{path}"


def self_signed_certificate(folder: str) -> tuple[str, str]:
    """A certificate for ``127.0.0.1`` and ``localhost`` signed by a throwaway CA, written
    to ``folder``: (certificate file, key file) for a TLS receiver; the CA's certificate is
    ``folder/ca.pem`` (what a client trusts: ``OTEL_EXPORTER_OTLP_CERTIFICATE``)."""
    import os

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(os.path.join(folder, "ca.pem"))
    cert_path = os.path.join(folder, "server.pem")
    key_path = os.path.join(folder, "server.key")
    cert.cert_chain_pems[0].write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)
    return cert_path, key_path


class ReceiverProcess:
    """A :class:`GrpcReceiver` in a child process, so that its decoding does not compete
    for this process's GIL (the overhead benchmark's collector stand-in).

    ``endpoint`` is known once started; :meth:`stop` returns the number of spans received.
    """

    def __init__(self, *, count_only: bool = False) -> None:
        import subprocess
        import sys

        from resettrace._run import helper_environment

        args = ["--count-only"] if count_only else []
        self._proc = subprocess.Popen([sys.executable, "-m", "resettrace.testing.receivers",
                                       *args],
                                      env=helper_environment(),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self._proc.kill()
            raise RuntimeError(f"the receiver process did not start: {line!r}")
        self.endpoint = line

    @property
    def pid(self) -> int:
        return int(self._proc.pid)

    def stop(self) -> int:
        """Close the receiver; the number of spans it received."""
        out, _ = self._proc.communicate(timeout=30)
        return int(out.strip().splitlines()[-1])

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def _serve_until_stdin_closes() -> None:
    import os
    import sys

    # below training, as the export process is: at idle priority it got no CPU while
    # training kept every core busy, and the export process's requests timed out
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), 10))

    count_only = "--count-only" in sys.argv[1:]
    with GrpcReceiver(count_only=count_only) as rx:
        print(rx.endpoint, flush=True)
        sys.stdin.read()
        print(rx.counted if count_only else len(rx.spans()), flush=True)


if __name__ == "__main__":
    _serve_until_stdin_closes()
