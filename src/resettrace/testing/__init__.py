"""Test helpers: real OTLP trace receivers (gRPC and HTTP) on ``127.0.0.1``, used by the
project's tests and by ``resettrace bench overhead`` (its collector stand-in), never by the
library itself. Importing :mod:`resettrace.testing.receivers` loads grpcio and the OTLP
protos (they come with ``opentelemetry-exporter-otlp``); this package itself imports nothing.
"""
