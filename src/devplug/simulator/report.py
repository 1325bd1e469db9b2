"""Forms of the simulator's results: records for `-o json|yaml`, readable tables, metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from devplug.ground.tables import table
from devplug.simulator.results import (
    ContainerResult,
    NodeStatus,
    PodResult,
    PodSummary,
    RuntimeOptions,
)


def container_record(container: ContainerResult) -> dict[str, Any]:
    """A container's result as plain JSON-ready data."""
    return {
        "container": container.name,
        "init": container.init,
        "state": container.state,
        "message": container.message,
        "devices": container.devices,
        "pre_started": container.pre_started,
        "options": msgspec.to_builtins(container.options),
    }


def _pod_container_record(
    name: str, namespace: str, uid: str, container: ContainerResult
) -> dict[str, Any]:
    return {"pod": name, "namespace": namespace, "uid": uid, "admitted": True} | container_record(
        container
    )


def pod_records(results: Sequence[PodResult]) -> list[dict[str, Any]]:
    """One record per container of each admitted pod; one per rejected pod."""
    records = []
    for pod in results:
        if not pod.admitted:
            record: dict[str, Any] = {
                "pod": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
                "admitted": False,
                "reason": pod.reason,
                "message": pod.message,
            }
            records.append(record)
            continue
        for container in pod.containers:
            record = _pod_container_record(pod.name, pod.namespace, pod.uid, container)
            records.append(record | {"unchanged": pod.unchanged})
    return records


def pod_summary_records(pods: Sequence[PodSummary]) -> list[dict[str, Any]]:
    """One record per container of each pod the node runs."""
    return [
        _pod_container_record(p.name, p.namespace, p.uid, c) for p in pods for c in p.containers
    ]


def _options_lines(options: RuntimeOptions, indent: str) -> list[str]:
    rows: list[tuple[str, str]] = []
    for device in options.devices:
        rows.append(
            ("device", f"{device.host_path} -> {device.container_path} ({device.permissions})")
        )
    for mount in options.mounts:
        mode = "ro" if mount.read_only else "rw"
        rows.append(("mount", f"{mount.host_path} -> {mount.container_path} ({mode})"))
    rows.extend(("env", f"{kv.name}={kv.value}") for kv in options.envs)
    rows.extend(("annotation", f"{kv.name}={kv.value}") for kv in options.annotations)
    rows.extend(("cdi", name) for name in options.cdi_devices)
    return [f"{indent}{key:<11} {value}" for key, value in rows]


def _container_lines(container: ContainerResult) -> list[str]:
    kind = "init container" if container.init else "container"
    state = container.state + (f": {container.message}" if container.message else "")
    lines = [f"  {kind} {container.name}: {state}"]
    for resource, ids in container.devices.items():
        lines.append(f"    {resource}: {', '.join(ids)}")
    if container.pre_started:
        lines.append(f"    PreStartContainer called: {', '.join(container.pre_started)}")
    lines += _options_lines(container.options, "    ")
    return lines


def results_text(results: Sequence[PodResult]) -> str:
    """Per pod: admitted, with each container's devices and runtime options, or the
    rejection with the kubelet's reason and message."""
    lines: list[str] = []
    for pod in results:
        if pod.unchanged:
            lines.append(f"pod {pod.namespace}/{pod.name} ({pod.uid}): unchanged")
        elif pod.admitted:
            lines.append(f"pod {pod.namespace}/{pod.name} ({pod.uid}): admitted")
            for container in pod.containers:
                lines += _container_lines(container)
        else:
            lines.append(f"pod {pod.namespace}/{pod.name}: rejected: {pod.reason}: {pod.message}")
    return "\n".join(lines)


def pods_text(pods: Sequence[PodSummary]) -> str:
    if not pods:
        return "no pods"
    rows = []
    for pod in pods:
        for container in pod.containers:
            devices = "; ".join(f"{r}: {','.join(ids)}" for r, ids in container.devices.items())
            rows.append(
                [
                    pod.namespace,
                    pod.name,
                    container.name + (" (init)" if container.init else ""),
                    container.state,
                    devices or "-",
                ]
            )
    return "\n".join(table(["NAMESPACE", "POD", "CONTAINER", "STATE", "DEVICES"], rows))


def node_text(status: NodeStatus) -> str:
    lines = [
        f"topology policy: {status.topology_policy}, NUMA nodes: "
        + ",".join(map(str, status.numa_nodes))
    ]
    if status.checkpoint_problem:
        lines.append(f"checkpoint not used: {status.checkpoint_problem}")
    rows = []
    for r in status.resources:
        endpoint = r.endpoint
        if r.grace_left_s is not None:
            endpoint += f" ({r.grace_left_s:.0f}s left)"
        rows.append(
            [
                r.name,
                str(r.capacity),
                str(r.allocatable),
                str(r.allocated),
                endpoint,
                str(status.registrations.get(r.name, 0)),
                str(status.registration_total.get(r.name, 0)),
            ]
        )
    header = [
        "RESOURCE",
        "CAPACITY",
        "ALLOCATABLE",
        "ALLOCATED",
        "ENDPOINT",
        "REGISTERED",
        "REGISTER CALLS",
    ]
    lines += table(header, rows) if rows else ["no resources registered"]
    device_rows = []
    for r in status.resources:
        for d in r.devices:
            device_rows.append(
                [
                    r.name,
                    d.id,
                    "healthy" if d.healthy else "unhealthy",
                    ",".join(map(str, d.numa_nodes)) or "-",
                    ", ".join(d.allocated_to) or "-",
                ]
            )
    if device_rows:
        lines.append("")
        lines += table(["RESOURCE", "DEVICE", "HEALTH", "NUMA", "ALLOCATED TO"], device_rows)
    if status.alloc_duration:
        lines.append("")
        rows = [
            [name, str(h.count), f"{(h.sum_seconds / h.count * 1000) if h.count else 0:.1f} ms"]
            for name, h in status.alloc_duration.items()
        ]
        lines += table(["RESOURCE", "ALLOCATE CALLS", "MEAN DURATION"], rows)
    if status.dra_drivers:
        lines.append("")
        rows = [[name, version] for name, version in sorted(status.dra_drivers.items())]
        lines += table(["DRA DRIVER", "VERSION"], rows)
    if status.dra_claims:
        lines.append("")
        rows = [
            [f"{c.namespace}/{c.name}", " ".join(i for ids in c.cdi_devices.values() for i in ids)]
            for c in status.dra_claims
        ]
        lines += table(["CLAIM", "CDI DEVICES"], rows)
    return "\n".join(lines)


def metrics_text(status: NodeStatus) -> str:
    """kubelet_device_plugin_registration_total and _alloc_duration_seconds, in the
    Prometheus text format."""
    registration = "kubelet_device_plugin_registration_total"
    duration = "kubelet_device_plugin_alloc_duration_seconds"
    lines = [
        f"# HELP {registration} Cumulative number of device plugin registrations. "
        "Broken down by resource name.",
        f"# TYPE {registration} counter",
    ]
    for resource, count in status.registration_total.items():
        lines.append(f'{registration}{{resource_name="{resource}"}} {count}')
    lines += [
        f"# HELP {duration} Duration in seconds to serve a device plugin Allocation request. "
        "Broken down by resource name.",
        f"# TYPE {duration} histogram",
    ]
    for resource, histogram in status.alloc_duration.items():
        label = f'resource_name="{resource}"'
        for bound, count in histogram.buckets:
            lines.append(f'{duration}_bucket{{{label},le="{bound:g}"}} {count}')
        lines.append(f'{duration}_bucket{{{label},le="+Inf"}} {histogram.count}')
        lines.append(f"{duration}_sum{{{label}}} {histogram.sum_seconds}")
        lines.append(f"{duration}_count{{{label}}} {histogram.count}")
    return "\n".join(lines) + "\n"
