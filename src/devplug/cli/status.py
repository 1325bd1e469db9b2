"""`devplug status`: on a node, each resource's devices, their health and the pod and
container holding each, from the kubelet's PodResources API.

The kubelet reports allocatable (healthy) devices and allocations, not health itself:
where devplug serves the resource, the health comes from the plugin's own socket
(its current device list); elsewhere a device the kubelet no longer offers while a
container holds it is shown Unhealthy.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from devplug.api.constants import DEVICE_PLUGIN_PATH, POD_RESOURCES_SOCKET
from devplug.cli import style

PLUGIN_LIST_TIMEOUT_S = 1.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-resources",
        default=POD_RESOURCES_SOCKET,
        type=style.socket_path,
        metavar="SOCKET",
        help="the kubelet's PodResources socket (with the simulator: "
        "STATE_DIR/pod-resources/kubelet.sock, as `devplug kubelet` printed it)",
    )
    parser.add_argument(
        "--plugin-dir",
        default=DEVICE_PLUGIN_PATH,
        type=style.folder,
        metavar="DIR",
        help="where devplug's plugin sockets are, for device health",
    )
    style.add_output(parser)
    style.add_timeout(parser, "the kubelet may take to answer", 5.0)


def plugin_health(plugin_dir: Path, resource: str) -> dict[str, bool] | None:
    """Device ID -> healthy, from the first list of devplug's plugin for `resource`;
    None when no devplug socket serves it here."""
    import grpc

    from devplug.api.constants import HEALTHY
    from devplug.api.v1beta1 import api_pb2 as pb
    from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
    from devplug.framework.plugin import default_socket_name

    socket = plugin_dir / default_socket_name(resource)
    if not socket.exists():
        return None
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(
                pb.Empty(), timeout=PLUGIN_LIST_TIMEOUT_S
            )
            first = next(stream)
            stream.cancel()
    except (grpc.RpcError, StopIteration):
        return None
    return {d.ID: d.health == HEALTHY for d in first.devices}


def node_report(pod_resources: Path | str, plugin_dir: Path, timeout: float) -> dict[str, Any]:
    from devplug.framework.podresources import node_devices

    node = node_devices(pod_resources, timeout)
    held: dict[tuple[str, str], list[dict[str, str]]] = {}
    for h in node.holders:
        held.setdefault((h.resource, h.device), []).append(
            {"namespace": h.namespace, "pod": h.pod, "container": h.container}
        )
    names = sorted({*node.allocatable, *(h.resource for h in node.holders)})
    resources = []
    for name in names:
        offered = node.allocatable.get(name, [])
        ids = list(
            dict.fromkeys([*offered, *(h.device for h in node.holders if h.resource == name)])
        )
        health = plugin_health(plugin_dir, name)
        devices = []
        for device_id in ids:
            healthy = health[device_id] if health and device_id in health else device_id in offered
            devices.append(
                {
                    "id": device_id,
                    "health": "Healthy" if healthy else "Unhealthy",
                    "allocatable": device_id in offered,
                    "holders": held.get((name, device_id), []),
                }
            )
        resources.append(
            {
                "name": name,
                "healthSource": "plugin" if health is not None else "kubelet",
                "allocatable": len(offered),
                "allocated": sum(1 for d in devices if d["holders"]),
                "devices": devices,
            }
        )
    return {"podResources": str(pod_resources), "resources": resources}


def report_text(report: dict[str, Any]) -> str:
    from devplug.ground.tables import table

    lines: list[str] = []
    for resource in report["resources"]:
        lines.append(
            f"{resource['name']}: {len(resource['devices'])} devices, "
            f"{resource['allocatable']} allocatable, {resource['allocated']} allocated"
        )
        rows = [
            [
                d["id"],
                d["health"],
                ", ".join(f"{h['namespace']}/{h['pod']}/{h['container']}" for h in d["holders"])
                or "-",
            ]
            for d in resource["devices"]
        ]
        lines += table(["DEVICE", "HEALTH", "HELD BY (namespace/pod/container)"], rows, "  ")
    if not report["resources"]:
        lines.append("the kubelet reports no device-plugin resources")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import grpc

    try:
        report = node_report(args.pod_resources, Path(args.plugin_dir), args.timeout)
    except grpc.RpcError as error:
        code = error.code().name if isinstance(error, grpc.Call) else "UNAVAILABLE"
        return style.fail(
            args, f"cannot read the kubelet's PodResources API at {args.pod_resources}: {code}"
        )
    style.print_result(report, args.output, text=lambda: report_text(report))
    return style.EXIT_OK
