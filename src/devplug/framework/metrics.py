"""`/metrics`, `/healthz` and `/readyz` over HTTP, as a daemon service.

prometheus-client is imported here only, so a daemon without `--metrics-port` never
loads it; `/healthz` and `/readyz` do not need it (without it, `/metrics` answers 503
and says so, and the probes still work). Counters and histograms follow the
framework's events (`observe`, counted in `eventmetrics`); gauges (devices by health,
streams open, registered, build info) are read from the daemon when scraped, so they
can never drift from what is served. The HTTP server runs in threads; it asks the event
loop for health and readiness, so `/healthz` answers only while the loop runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import platform
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from devplug.framework import observe
from devplug.framework.daemon import ReadinessReporter
from devplug.framework.eventmetrics import EventMetrics, dra_registrations

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

    from devplug.framework.daemon import Daemon

log = logging.getLogger("devplug.metrics")

BIND_RETRY_FIRST_S = 0.1
BIND_RETRY_MAX_S = 2.0
LOOP_ANSWER_S = 2.0  # /healthz fails when the loop cannot answer within this
POD_RESOURCES_TIMEOUT_S = 1.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not events
        pass


class MetricsServer:
    """Serves the three endpoints on `address:port` while the daemon runs.

    With `pod_resources` (the kubelet's PodResources socket), `devplug_pod_device_info`
    maps each allocated device to its pod and container, read at scrape time.
    """

    def __init__(
        self,
        port: int,
        address: str = "",
        pod_resources: Path | str | None = None,
        *,
        wait_for_port: bool = False,
    ) -> None:
        self.port = port
        # Wait while the port is taken instead of failing: the previous pod of a
        # rolling update with surge holds it on the node's network.
        self.wait_for_port = wait_for_port
        self.address = address
        self.pod_resources = Path(pod_resources) if pod_resources else None
        self.bound_port: int | None = None
        self.serving = threading.Event()

    async def run(self, daemon: Daemon) -> None:
        metrics_app, counters = _prometheus(daemon, self.pod_resources)
        loop = asyncio.get_running_loop()

        def ask_loop(check: Callable[[], list[str]]) -> list[str]:
            async def run_check() -> list[str]:
                return check()

            future = asyncio.run_coroutine_threadsafe(run_check(), loop)
            try:
                return future.result(LOOP_ANSWER_S)
            except (concurrent.futures.TimeoutError, RuntimeError):
                future.cancel()
                return ["the event loop does not answer"]

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            # /health: the generic device plugin's name of /healthz.
            if path in ("/healthz", "/readyz", "/health"):
                problems = ask_loop(lambda: _not_ready(daemon) if path == "/readyz" else [])
                status = "503 Service Unavailable" if problems else "200 OK"
                body = ("\n".join(problems) if problems else "ok").encode() + b"\n"
                start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
                return [body]
            if path == "/metrics":
                return metrics_app(environ, start_response)  # type: ignore[no-any-return]
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics, /healthz or /readyz\n"]

        try:
            server = await self._bind(app)
        except OSError as error:  # in use, an address not of this host, no permission
            from devplug.framework.daemon import ServiceFailed

            where = f"{self.address or '*'} port {self.port}"
            raise ServiceFailed(
                f"cannot serve metrics on {where}: {error.strerror or error}"
            ) from None
        self.bound_port = server.server_port
        thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
        if counters is not None:
            observe.add_observer(counters.observe)
        thread.start()
        self.serving.set()
        log.info(
            "serving /metrics, /healthz and /readyz on %s:%d",
            self.address or "*",
            self.bound_port,
            extra={"port": self.bound_port},
        )
        try:
            await asyncio.Event().wait()
        finally:
            if counters is not None:
                observe.remove_observer(counters.observe)
            await asyncio.to_thread(server.shutdown)
            server.server_close()

    async def _bind(self, app: Any) -> _Server:
        """The server on its port; while another process holds the port (the previous
        pod of a rolling update with surge, on the node's network), wait for it."""
        delay = BIND_RETRY_FIRST_S
        said = False
        while True:
            try:
                server: _Server = make_server(
                    self.address, self.port, app, server_class=_Server, handler_class=_QuietHandler
                )
                return server
            except OSError as error:
                if error.errno != errno.EADDRINUSE or not self.wait_for_port:
                    raise
                if not said:
                    log.warning(
                        "metrics port %d is in use (the previous devplug pod of a rolling "
                        "update?): waiting for it",
                        self.port,
                    )
                    said = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, BIND_RETRY_MAX_S)


NO_PROMETHEUS = (
    "prometheus-client is not installed (a dependency of devplug: "
    "pip install 'prometheus-client>=0.21'): /metrics answers 503; /healthz and /readyz work"
)


def _prometheus(daemon: Daemon, pod_resources: Path | None) -> tuple[Any, EventMetrics | None]:
    """The WSGI app of /metrics and the event counters; without prometheus-client, an
    app answering 503 with the reason (said once in the log) and no counters."""
    try:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Histogram,
            disable_created_metrics,
            make_wsgi_app,
        )
        from prometheus_client.process_collector import ProcessCollector
    except ImportError:
        log.warning("%s", NO_PROMETHEUS)

        def unavailable(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [NO_PROMETHEUS.encode() + b"\n"]

        return unavailable, None
    disable_created_metrics()  # type: ignore[no-untyped-call]  # `_created`: noise
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    counters = EventMetrics(registry, Counter, Histogram)
    registry.register(_StateCollector(daemon, pod_resources))
    scrape = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        counters.know(daemon)  # the series of a resource served since the last scrape
        return scrape(environ, start_response)

    return app, counters


def _not_ready(daemon: Daemon) -> list[str]:
    problems = []
    for endpoint in daemon.endpoints:
        if not endpoint.registered:
            problems.append(f"{endpoint.name}: not registered with the kubelet")
        elif endpoint.streams == 0:
            problems.append(f"{endpoint.name}: registered, no ListAndWatch stream yet")
    reporters = [s for s in daemon.services if isinstance(s, ReadinessReporter)]
    for service in reporters:
        problems += service.problems()
    if not daemon.endpoints and not reporters:
        problems.append("no resource is served")
    return problems


class _StateCollector:
    """Gauges read from the daemon at scrape time (and the pod <-> device mapping)."""

    def __init__(self, daemon: Daemon, pod_resources: Path | None) -> None:
        self.daemon = daemon
        self.pod_resources = pod_resources
        self.build = (_installed_version(), platform.python_version())

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        build = GaugeMetricFamily(
            "devplug_build_info",
            "1, with the version of devplug and of Python as labels.",
            labels=["version", "python"],
        )
        build.add_metric(list(self.build), 1)
        yield build
        devices = GaugeMetricFamily(
            "devplug_devices", "Devices served, by health.", labels=["resource", "health"]
        )
        streams = GaugeMetricFamily(
            "devplug_listandwatch_streams_open",
            "ListAndWatch streams open now.",
            labels=["resource"],
        )
        registered = GaugeMetricFamily(
            "devplug_registered",
            "1 while registered with the current kubelet.",
            labels=["resource"],
        )
        for endpoint in list(self.daemon.endpoints):
            table = endpoint.plugin.devices
            healthy = sum(1 for d in table.values() if d.healthy)
            devices.add_metric([endpoint.name, "Healthy"], healthy)
            devices.add_metric([endpoint.name, "Unhealthy"], len(table) - healthy)
            streams.add_metric([endpoint.name], endpoint.streams)
            registered.add_metric([endpoint.name], 1 if endpoint.registered else 0)
        yield from (devices, streams, registered, self._dra_registered())
        if self.pod_resources is not None:
            yield self._pod_devices()

    def _dra_registered(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "devplug_dra_registered",
            "1 while the kubelet has registered the DRA driver.",
            labels=["driver"],
        )
        for name, registered in dra_registrations(self.daemon):
            family.add_metric([name], 1 if registered else 0)
        return family

    def _pod_devices(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        from devplug.framework.podresources import list_allocations

        family = GaugeMetricFamily(
            "devplug_pod_device_info",
            "1 for each device allocated to a container (from the kubelet's PodResources).",
            labels=["resource", "device", "namespace", "pod", "container"],
        )
        served = {e.name for e in self.daemon.endpoints}
        assert self.pod_resources is not None
        try:
            holders = list_allocations(self.pod_resources, POD_RESOURCES_TIMEOUT_S)
        except Exception as error:  # the kubelet is restarting: no series this scrape
            log.debug("PodResources List failed: %s", error)
            return family
        for h in holders:
            if h.resource in served:
                family.add_metric([h.resource, h.device, h.namespace, h.pod, h.container], 1)
        return family


def _installed_version() -> str:
    """devplug's version as installed ('unknown' when run from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("devplug")
    except PackageNotFoundError:
        return "unknown"
