"""The compose stack (OTel Collector -> Jaeger v2, Prometheus), checked without Docker.

Docker cannot run on the development machines, so these tests read the YAML files and check
what a typo would break: component references, the sampling policies, and the ports and host
names that connect resettrace, the collector, Prometheus and Jaeger. The Prometheus config is
also checked by the real ``promtool`` (Debian's prometheus package; ``make test`` installs it).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from resettrace.config import DEFAULT_OTLP_ENDPOINT

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
COLLECTOR_FILE = ROOT / "collector_config" / "otel-collector.yaml"
JAEGER_FILE = ROOT / "collector_config" / "jaeger.yaml"
PROMETHEUS_FILE = ROOT / "collector_config" / "prometheus.yaml"
PROMETHEUS_SERVICE = "prometheus"

COLLECTOR_SERVICE = "otel-collector"
JAEGER_SERVICE = "jaeger"
PIPELINE_KINDS = ("receivers", "processors", "exporters")
#: deprecated exporter aliases (CONTEXT.md section 6): use ``otlp_grpc`` / ``otlp_http``
DEPRECATED_EXPORTER_TYPES = {"otlp": "otlp_grpc", "otlphttp": "otlp_http"}
JAEGER_UI_PORT = 16686


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.name}: top level is not a mapping"
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load(COMPOSE_FILE)


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    return _load(COLLECTOR_FILE)


@pytest.fixture(scope="module")
def jaeger() -> dict[str, Any]:
    return _load(JAEGER_FILE)


# -- helpers ----------------------------------------------------------------------------------
def component_type(component_id: str) -> str:
    """``otlp_grpc/jaeger`` -> ``otlp_grpc``; ``otlp`` -> ``otlp``."""
    ctype, _, _name = component_id.partition("/")
    return ctype


def ids_of_type(section: dict[str, Any] | None, ctype: str) -> list[str]:
    return [cid for cid in (section or {}) if component_type(cid) == ctype]


def host_port(endpoint: str) -> tuple[str | None, int | None]:
    """``host:port`` or a URL -> (host, port), parsed with urllib."""
    parts = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    return parts.hostname, parts.port


def traces_pipeline(config: dict[str, Any]) -> dict[str, Any]:
    pipelines = config["service"]["pipelines"]
    names = [name for name in pipelines if component_type(name) == "traces"]
    assert names, "no traces pipeline"
    return pipelines[names[0]]


def pipeline_components(config: dict[str, Any], kind: str, ctype: str) -> list[str]:
    """Ids of type ``ctype`` that some traces pipeline uses as ``kind``."""
    found = []
    for name, pipeline in config["service"]["pipelines"].items():
        if component_type(name) == "traces":
            found += [cid for cid in pipeline.get(kind) or [] if component_type(cid) == ctype]
    return found


def published_ports(service: dict[str, Any]) -> dict[int, int]:
    """Compose ``ports`` -> {container port: host port} (short and long syntax)."""
    result = {}
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            container, host = entry["target"], entry.get("published", entry["target"])
        else:
            spec = str(entry).split("/")[0]  # drop "/tcp"
            pieces = spec.rsplit(":", 2)
            container = pieces[-1]
            host = pieces[-2] if len(pieces) > 1 else container
        result[int(container)] = int(host)
    return result


def command_args(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def config_path_in_container(service: dict[str, Any]) -> str:
    args = command_args(service)
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(("--config=", "--config.file=")):
            return arg.split("=", 1)[1]
    raise AssertionError(f"no --config in command {args}")


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Compose ``volumes`` -> [(source, target, mode)] for bind mounts."""
    mounts = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            if entry.get("type", "bind") == "bind":
                mode = "ro" if entry.get("read_only") else "rw"
                mounts.append((entry["source"], entry["target"], mode))
        else:
            pieces = str(entry).split(":")
            mode = pieces[2] if len(pieces) > 2 else "rw"
            if pieces[0].startswith((".", "/")):
                mounts.append((pieces[0], pieces[1], mode))
    return mounts


def mounted_config(compose: dict[str, Any], service_name: str) -> Path:
    """The repository file a service reads as its ``--config``."""
    service = compose["services"][service_name]
    target = config_path_in_container(service)
    for source, mount_target, _mode in bind_mounts(service):
        if PurePosixPath(mount_target) == PurePosixPath(target):
            return (COMPOSE_FILE.parent / source).resolve()
    raise AssertionError(f"{service_name}: --config {target} is not a mounted file")


def walk_policies(policies: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict | None]]:
    """Every tail_sampling policy with its enclosing ``and`` policy (None at top level)."""
    found: list[tuple[dict[str, Any], dict | None]] = [(p, None) for p in policies]
    for policy in policies:
        if policy.get("type") == "and":
            subs = policy.get("and", {}).get("and_sub_policy") or []
            found += [(sub, policy) for sub in subs]
    return found


def tail_sampling(collector: dict[str, Any]) -> dict[str, Any]:
    ids = pipeline_components(collector, "processors", "tail_sampling")
    assert ids, "no tail_sampling processor in the traces pipeline"
    return collector["processors"][ids[0]]


# -- both Collector-style configs ---------------------------------------------------------
@pytest.mark.parametrize("path", [COLLECTOR_FILE, JAEGER_FILE, COMPOSE_FILE, PROMETHEUS_FILE],
                         ids=lambda p: p.name)
def test_yaml_parses_to_a_mapping(path: Path) -> None:
    assert path.is_file(), f"{path} missing"
    assert _load(path)


@pytest.mark.parametrize("path", [COLLECTOR_FILE, JAEGER_FILE], ids=lambda p: p.name)
def test_every_referenced_component_is_defined(path: Path) -> None:
    config = _load(path)
    service = config["service"]
    assert service.get("pipelines"), "no pipelines"
    missing = []
    for pipeline_name, pipeline in service["pipelines"].items():
        assert pipeline.get("receivers"), f"{pipeline_name}: no receivers"
        assert pipeline.get("exporters"), f"{pipeline_name}: no exporters"
        for kind in PIPELINE_KINDS:
            defined = dict(config.get(kind) or {})
            if kind != "processors":  # a connector is a pipeline's exporter and another's receiver
                defined.update(config.get("connectors") or {})
            missing += [f"{kind}.{cid} ({pipeline_name})" for cid in pipeline.get(kind) or []
                        if cid not in defined]
    defined_extensions = config.get("extensions") or {}
    missing += [f"extensions.{cid}" for cid in service.get("extensions") or []
                if cid not in defined_extensions]
    assert not missing, f"{path.name}: referenced but not defined: {missing}"


@pytest.mark.parametrize("path", [COLLECTOR_FILE, JAEGER_FILE], ids=lambda p: p.name)
def test_no_deprecated_exporter_aliases(path: Path) -> None:
    config = _load(path)
    used = [cid for cid in config.get("exporters") or {}
            if component_type(cid) in DEPRECATED_EXPORTER_TYPES]
    assert not used, f"{path.name}: deprecated exporter names {used}; use " + ", ".join(
        f"{old} -> {new}" for old, new in DEPRECATED_EXPORTER_TYPES.items())


# -- collector ------------------------------------------------------------------------------
def test_memory_limiter_is_first_processor(collector: dict[str, Any]) -> None:
    processors = traces_pipeline(collector).get("processors") or []
    assert processors, "traces pipeline has no processors"
    assert component_type(processors[0]) == "memory_limiter", processors
    limiter = collector["processors"][processors[0]]
    assert limiter.get("limit_mib") or limiter.get("limit_percentage"), "memory_limiter unset"


def test_tail_sampling_keeps_slow_reset_done_traces(collector: dict[str, Any]) -> None:
    policies = tail_sampling(collector).get("policies") or []
    latency = [(p, parent) for p, parent in walk_policies(policies) if p.get("type") == "latency"]
    assert latency, "no latency policy"
    policy, parent = latency[0]
    threshold_ms = policy["latency"]["threshold_ms"]
    assert isinstance(threshold_ms, int) and threshold_ms > 0
    # The latency policy measures the whole trace; it must be tied to the reset_done span.
    assert parent is not None, "latency policy is not combined with a reset_done condition"
    siblings = parent["and"]["and_sub_policy"]
    conditions = [c for sub in siblings if sub.get("type") == "ottl_condition"
                  for c in sub["ottl_condition"].get("span") or []]
    reset_conditions = [c for c in conditions if re.search(r'name\s*==\s*"reset_done"', c)]
    assert reset_conditions, f"no OTTL condition on reset_done spans in {parent['name']}"
    # The span-duration threshold must equal the latency threshold (ms -> ns).
    durations = [re.search(r"end_time_unix_nano\s*-\s*start_time_unix_nano\s*>=?\s*(\d+)", c)
                 for c in reset_conditions]
    nanos = [int(m.group(1)) for m in durations if m]
    assert nanos, f"no span-duration bound in {reset_conditions}"
    assert nanos == [threshold_ms * 1_000_000], (nanos, threshold_ms)


def test_tail_sampling_keeps_a_probabilistic_share(collector: dict[str, Any]) -> None:
    policies = tail_sampling(collector).get("policies") or []
    # top level only: inside an `and` it would only thin out the slow traces
    shares = [p["probabilistic"]["sampling_percentage"] for p in policies
              if p.get("type") == "probabilistic"]
    assert shares, "no top-level probabilistic policy"
    assert all(0 < share < 100 for share in shares), shares


def test_otlp_receiver_ports_match_resettrace_defaults(
        collector: dict[str, Any], compose: dict[str, Any]) -> None:
    ids = pipeline_components(collector, "receivers", "otlp")
    assert ids, "no otlp receiver in the traces pipeline"
    protocols = collector["receivers"][ids[0]]["protocols"]
    published = published_ports(compose["services"][COLLECTOR_SERVICE])
    for protocol, default_url in (("grpc", DEFAULT_OTLP_ENDPOINT["grpc"]),
                                  ("http", DEFAULT_OTLP_ENDPOINT["http/protobuf"])):
        default = urlsplit(default_url)
        host, port = host_port(protocols[protocol]["endpoint"])
        # a container listening on localhost is unreachable through a published port
        assert host == "0.0.0.0", f"{protocol} receiver binds {host}"
        assert port in published, f"{protocol} receiver port {port} not published"
        assert published[port] == default.port, (protocol, published[port], default_url)
        if protocol == "http":
            path = protocols["http"].get("traces_url_path", "/v1/traces")
            assert path == default.path, (path, default_url)


def test_collector_exports_to_jaeger_otlp_receiver(
        collector: dict[str, Any], jaeger: dict[str, Any], compose: dict[str, Any]) -> None:
    exporter_ids = pipeline_components(collector, "exporters", "otlp_grpc")
    assert exporter_ids, "no otlp_grpc exporter in the traces pipeline"
    exporter = collector["exporters"][exporter_ids[0]]
    host, port = host_port(exporter["endpoint"])
    assert host == JAEGER_SERVICE and host in compose["services"], host
    assert mounted_config(compose, host) == JAEGER_FILE.resolve()
    receiver_ids = pipeline_components(jaeger, "receivers", "otlp")
    assert receiver_ids, "jaeger has no otlp receiver in its traces pipeline"
    grpc = jaeger["receivers"][receiver_ids[0]]["protocols"]["grpc"]
    jaeger_host, jaeger_port = host_port(grpc["endpoint"])
    assert jaeger_host == "0.0.0.0", f"jaeger's receiver binds {jaeger_host}"
    assert port == jaeger_port == 4317, (port, jaeger_port)
    # plain gRPC inside the compose network, with a queue in front of Jaeger
    assert exporter.get("tls", {}).get("insecure") is True
    queue = exporter.get("sending_queue")
    assert isinstance(queue, dict) and queue.get("enabled", True) is not False


def test_collector_health_check(collector: dict[str, Any], compose: dict[str, Any]) -> None:
    ids = ids_of_type(collector.get("extensions"), "health_check")
    assert ids and ids[0] in collector["service"]["extensions"], "health_check not enabled"
    host, port = host_port(collector["extensions"][ids[0]]["endpoint"])
    assert (host, port) == ("0.0.0.0", 13133)
    assert published_ports(compose["services"][COLLECTOR_SERVICE]).get(13133) == 13133


# -- jaeger ---------------------------------------------------------------------------------
def test_jaeger_stores_in_memory_and_queries_the_same_store(jaeger: dict[str, Any]) -> None:
    extensions = jaeger["extensions"]
    backends = extensions["jaeger_storage"]["backends"]
    exporter_ids = pipeline_components(jaeger, "exporters", "jaeger_storage_exporter")
    assert exporter_ids, "jaeger's traces pipeline does not write to storage"
    store = jaeger["exporters"][exporter_ids[0]]["trace_storage"]
    assert store in backends, f"exporter writes to undefined backend {store}"
    assert extensions["jaeger_query"]["storage"]["traces"] == store
    max_traces = backends[store]["memory"]["max_traces"]
    assert isinstance(max_traces, int) and max_traces > 0
    for needed in ("jaeger_storage", "jaeger_query"):
        assert needed in jaeger["service"]["extensions"], needed


def test_jaeger_ui_published(jaeger: dict[str, Any], compose: dict[str, Any]) -> None:
    host, port = host_port(jaeger["extensions"]["jaeger_query"]["http"]["endpoint"])
    assert (host, port) == ("0.0.0.0", JAEGER_UI_PORT)
    assert published_ports(compose["services"][JAEGER_SERVICE]).get(port) == JAEGER_UI_PORT
    health = ids_of_type(jaeger.get("extensions"), "healthcheckv2")
    assert health and host_port(jaeger["extensions"][health[0]]["http"]["endpoint"])[1] == 13133


# -- compose --------------------------------------------------------------------------------
VERSION_TAG = re.compile(r"^v?\d+\.\d+\.\d+$")


def test_images_pinned_to_a_version(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {COLLECTOR_SERVICE, JAEGER_SERVICE} <= set(services)
    for name, service in services.items():
        image = service["image"].split("@")[0]
        repository, sep, tag = image.rpartition(":")
        assert sep and "/" not in tag, f"{name}: image {image} has no tag"
        assert tag != "latest" and VERSION_TAG.match(tag), f"{name}: tag {tag} is not a version"
        assert repository
    assert services[JAEGER_SERVICE]["image"].split(":")[-1].lstrip("v").startswith("2."), \
        "Jaeger v2 is required by collector_config/jaeger.yaml"


@pytest.mark.parametrize("service_name", [COLLECTOR_SERVICE, JAEGER_SERVICE, PROMETHEUS_SERVICE])
def test_mounted_configs_exist_read_only(compose: dict[str, Any], service_name: str) -> None:
    mounts = bind_mounts(compose["services"][service_name])
    assert mounts, f"{service_name}: no bind mounts"
    for source, target, mode in mounts:
        assert (COMPOSE_FILE.parent / source).is_file(), f"{service_name}: {source} missing"
        assert "ro" in mode.split(","), f"{service_name}: {source} -> {target} is writable"
    assert mounted_config(compose, service_name).is_file()


def test_compose_service_wiring(compose: dict[str, Any]) -> None:
    services = compose["services"]
    depends = services[COLLECTOR_SERVICE].get("depends_on") or []
    assert JAEGER_SERVICE in depends, "collector must start after jaeger"
    for name, service in services.items():
        assert service.get("restart") == "unless-stopped", name
        probe = " ".join(map(str, (service.get("healthcheck") or {}).get("test") or []))
        assert not re.search(r"\b(curl|wget)\b", probe), f"{name}: distroless image, no {probe}"


# -- metrics: collector -> Prometheus -> Jaeger's Monitor tab ------------------------------
def _pipelines(config: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: p for name, p in config["service"]["pipelines"].items()
            if component_type(name) == kind}


def test_collector_serves_resettrace_metrics_and_spanmetrics_of_every_span(
        collector: dict[str, Any]) -> None:
    connectors = collector.get("connectors") or {}
    span_ids = ids_of_type(connectors, "spanmetrics")
    assert span_ids, "no spanmetrics connector"
    traces = _pipelines(collector, "traces")
    feeding = [name for name, p in traces.items() if span_ids[0] in (p.get("exporters") or [])]
    assert feeding, "no traces pipeline feeds the spanmetrics connector"
    for name in feeding:  # before sampling: the Monitor tab's numbers are of every span
        assert not any(component_type(c) == "tail_sampling"
                       for c in traces[name].get("processors") or []), name
    metrics = _pipelines(collector, "metrics")
    assert metrics, "no metrics pipeline"
    [pipeline] = metrics.values()
    receivers = pipeline["receivers"]
    assert "otlp" in receivers and span_ids[0] in receivers, receivers  # resettrace's + span
    prom = [e for e in pipeline["exporters"] if component_type(e) == "prometheus"]
    assert prom, pipeline["exporters"]
    host, port = host_port(collector["exporters"][prom[0]]["endpoint"])
    assert host == "0.0.0.0" and port == 8889
    unit = connectors[span_ids[0]].get("histogram", {}).get("unit", "ms")
    assert unit == "ms"  # Jaeger's normalize_duration reads ..._duration_milliseconds


def test_prometheus_scrapes_the_collector_and_promtool_accepts_it(
        compose: dict[str, Any], collector: dict[str, Any]) -> None:
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is missing: run `make test`"
    r = subprocess.run([promtool, "check", "config", str(PROMETHEUS_FILE)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    config = _load(PROMETHEUS_FILE)
    targets = [t for job in config["scrape_configs"]
               for sc in job.get("static_configs") or [] for t in sc["targets"]]
    [prom] = [e for p in _pipelines(collector, "metrics").values() for e in p["exporters"]
              if component_type(e) == "prometheus"]
    _, port = host_port(collector["exporters"][prom]["endpoint"])
    assert f"{COLLECTOR_SERVICE}:{port}" in targets, targets
    service = compose["services"][PROMETHEUS_SERVICE]
    assert mounted_config(compose, PROMETHEUS_SERVICE) == PROMETHEUS_FILE.resolve()
    # resettrace's exponential histograms arrive as native histograms
    assert "--enable-feature=native-histograms" in command_args(service)
    assert published_ports(service).get(9090) == 9090


def test_jaegers_monitor_tab_reads_the_compose_prometheus(
        jaeger: dict[str, Any], compose: dict[str, Any]) -> None:
    extensions = jaeger["extensions"]
    name = extensions["jaeger_query"]["storage"].get("metrics")
    assert name, "jaeger_query has no metrics storage: the Monitor tab stays empty"
    backend = extensions["jaeger_storage"]["metric_backends"][name]["prometheus"]
    host, port = host_port(backend["endpoint"])
    assert host == PROMETHEUS_SERVICE and host in compose["services"] and port == 9090
    assert backend.get("normalize_calls") is True and backend.get("normalize_duration") is True
    assert PROMETHEUS_SERVICE in (compose["services"][JAEGER_SERVICE].get("depends_on") or [])
