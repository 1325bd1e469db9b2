"""The Prometheus counters and histograms fed by framework events (see `observe`).

Every series whose labels are known up front is there from the moment its resource
or DRA driver is served, at 0: `increase()` and `absent()` then see the first event,
which a series born at 1 would hide. Series whose labels only an event can tell (the
gRPC code of a refusal, the Xid of a GPU) appear with their first event.

prometheus-client is passed in by `devplug.framework.metrics`, the only module that
imports it; the observer runs on the event loop and does only dictionary lookups and
additions (Allocate's hot path pays one of each).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from devplug.framework import observe

if TYPE_CHECKING:
    from devplug.framework.daemon import Daemon

ALLOCATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
# Prepare writes a CDI spec and a checkpoint, and reads the claim from the API server.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HEALTH = ("Healthy", "Unhealthy")
TRANSITIONS = (("Healthy", "Unhealthy"), ("Unhealthy", "Healthy"))


class EventMetrics:
    """The counters and histograms, fed by framework events."""

    def __init__(self, registry: Any, counter: Any, histogram: Any) -> None:
        def make(kind: Any, name: str, doc: str, labels: list[str], **kw: Any) -> Any:
            return kind(name, doc, labels, registry=registry, **kw)

        self.allocations = make(
            counter, "devplug_allocations", "Allocate calls answered.", ["resource"]
        )
        self.refused = make(
            counter,
            "devplug_refused_requests",
            "Kubelet requests refused, by method and gRPC status code.",
            ["resource", "method", "code"],
        )
        self.latency = make(
            histogram,
            "devplug_allocate_duration_seconds",
            "Time to answer (or refuse) an Allocate call.",
            ["resource"],
            buckets=ALLOCATE_BUCKETS,
        )
        self.registrations = make(
            counter,
            "devplug_registrations",
            "Successful registrations with the kubelet.",
            ["resource"],
        )
        self.restarts = make(
            counter,
            "devplug_kubelet_restarts_seen",
            "Registrations with a kubelet other than the one registered with before.",
            ["resource"],
        )
        self.reloads = make(
            counter, "devplug_config_reloads", "Config reloads, by result.", ["result"]
        )
        self.reloads.labels("applied")
        self.reloads.labels("refused")
        self.transitions = make(
            counter,
            "devplug_health_transitions",
            "Devices whose health changed, by the health before and after.",
            ["resource", "from", "to"],
        )
        self.xids = make(
            counter,
            "devplug_gpu_xid_errors",
            "Xid events (and double-bit ECC errors, as Xid 48) seen by NVML, by GPU "
            "and what devplug made of them (ignore, transient, reset).",
            ["resource", "gpu", "xid", "action"],
        )
        self.placements = make(
            counter,
            "devplug_extender_placements",
            "Shares of a GPU asked of a resource served with replicaPolicy extender, by "
            "result: followed (the extender's GPU given), unmatched (no pod with the "
            "extender's choice waiting for it), refused (another GPU allocated).",
            ["resource", "result"],
        )
        claim_labels = ["driver", "result"]
        self.prepares = make(
            counter, "devplug_dra_prepare_claims", "DRA claims prepared, by result.", claim_labels
        )
        self.prepare_time = make(
            histogram,
            "devplug_dra_prepare_claim_duration_seconds",
            "Time to prepare one DRA claim, by result.",
            claim_labels,
            buckets=CLAIM_BUCKETS,
        )
        self.unprepares = make(
            counter,
            "devplug_dra_unprepare_claims",
            "DRA claims unprepared, by result.",
            claim_labels,
        )
        self.unprepare_time = make(
            histogram,
            "devplug_dra_unprepare_claim_duration_seconds",
            "Time to unprepare one DRA claim, by result.",
            claim_labels,
            buckets=CLAIM_BUCKETS,
        )
        self.slice_publishes = make(
            counter,
            "devplug_dra_slice_publishes",
            "Publications of the node's ResourceSlices, by result (an error is retried).",
            claim_labels,
        )
        self.status_writes = make(
            counter,
            "devplug_dra_claim_status_writes",
            "Writes of a claim's device status, by result (an error after its retries).",
            claim_labels,
        )
        self._known: set[tuple[str, str]] = set()
        self._by_kind = {
            observe.CLAIM_PREPARED: (self.prepares, self.prepare_time),
            observe.CLAIM_UNPREPARED: (self.unprepares, self.unprepare_time),
            observe.SLICES_PUBLISHED: (self.slice_publishes, None),
            observe.CLAIM_STATUS_WRITTEN: (self.status_writes, None),
        }

    def know(self, daemon: Daemon) -> None:
        """Make the series of every resource and DRA driver served now (at 0); called
        before each scrape, so a resource added by a reload has them on the next."""
        for endpoint in list(daemon.endpoints):
            self._know_resource(endpoint.name)
        for resource in _dra_resources(daemon):
            self._know_health(resource)
        for driver in _dra_drivers(daemon):
            self._know_driver(driver)

    def _first(self, kind: str, name: str) -> bool:
        """Whether `name` is new (and now known)."""
        if (kind, name) in self._known:
            return False
        self._known.add((kind, name))
        return True

    def _know_resource(self, resource: str) -> None:
        """The series of a resource served as a device plugin."""
        if self._first("resource", resource):
            for family in (self.allocations, self.latency, self.registrations, self.restarts):
                family.labels(resource)
            self._know_health(resource)

    def _know_health(self, resource: str) -> None:
        if self._first("health", resource):
            for before, after in TRANSITIONS:
                self.transitions.labels(resource, before, after)

    def _know_driver(self, driver: str) -> None:
        if not self._first("driver", driver):
            return
        for counter, histogram in self._by_kind.values():
            for result in observe.RESULTS:
                counter.labels(driver, result)
                if histogram is not None:
                    histogram.labels(driver, result)

    def observe(self, event: observe.Event) -> None:
        kind, resource, fields = event.kind, event.resource, event.fields
        if kind == observe.ALLOCATED:
            self.allocations.labels(resource).inc()
            self.latency.labels(resource).observe(fields["seconds"])
        elif kind == observe.REFUSED:
            self.refused.labels(resource, fields["method"], fields["code"]).inc()
            if fields.get("seconds") is not None:
                self.latency.labels(resource).observe(fields["seconds"])
        elif kind in self._by_kind:
            self._know_driver(resource)  # the other results at 0 before the first scrape
            counter, histogram = self._by_kind[kind]
            counter.labels(resource, fields["result"]).inc()
            if histogram is not None:
                histogram.labels(resource, fields["result"]).observe(fields["seconds"])
        elif kind == observe.HEALTH_CHANGED:
            if fields["unhealthy"]:
                self.transitions.labels(resource, *HEALTH).inc(len(fields["unhealthy"]))
            if fields["healthy"]:
                self.transitions.labels(resource, *reversed(HEALTH)).inc(len(fields["healthy"]))
        elif kind == observe.PLACED:
            self.placements.labels(resource, fields["result"]).inc()
        elif kind == observe.XID:
            self.xids.labels(resource, fields["gpu"], str(fields["xid"]), fields["action"]).inc()
        elif kind == observe.REGISTERED:
            self._know_resource(resource)  # at 0 before its first Allocate (a reload)
            self.registrations.labels(resource).inc()
            if fields.get("kubelet_restart"):
                self.restarts.labels(resource).inc()
        elif kind == observe.RELOADED:
            self.reloads.labels("applied").inc()
        elif kind == observe.RELOAD_REFUSED:
            self.reloads.labels("refused").inc()


def _dra_services(daemon: Daemon) -> Iterable[Any]:
    # Looked up among the loaded modules: a daemon that serves no DRA driver never
    # imported the DRA service, and metrics must not import it for nothing.
    module = sys.modules.get("devplug.framework.dra.service")
    if module is None:
        return []
    return [s for s in list(daemon.services) if isinstance(s, module.DraService)]


def _dra_drivers(daemon: Daemon) -> list[str]:
    return [d.name for s in _dra_services(daemon) for d in s.drivers]


def _dra_resources(daemon: Daemon) -> list[str]:
    """The resources of the DRA drivers (health transitions are counted by resource)."""
    return [d.plugin.resource_name for s in _dra_services(daemon) for d in s.drivers]


def dra_registrations(daemon: Daemon) -> list[tuple[str, bool]]:
    """(driver, whether the kubelet registered it) of every DRA driver served."""
    return [
        (p.registration.driver_name, p.registration.registered.is_set())
        for s in _dra_services(daemon)
        for p in s.node_plugins
    ]
