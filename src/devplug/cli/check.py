"""`devplug check`: validate a config file and show the devices it would serve now."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug.sources import SourcePlugin

EXIT_OK = 0
EXIT_INVALID = 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="the config file")
    parser.add_argument(
        "--output", choices=["text", "json"], default="text", help="report format (text)"
    )
    from devplug.cli.serve import add_root_options

    add_root_options(parser)
    parser.add_argument(
        "--node-name",
        metavar="NAME",
        help="the node whose DRA slices to show (default: $NODE_NAME, else the host name)",
    )


def run(args: argparse.Namespace) -> int:
    from devplug.sources import ConfigError, build_plugins, load_config

    try:
        plugins = build_plugins(
            load_config(args.config), sysfs_root=args.sysfs_root, dev_root=args.dev_root
        )
        report = [_resource_report(p) for p in plugins]
        _add_dra_reports(args, plugins, report)
    except (ConfigError, ValueError) as e:
        problem = str(e) if isinstance(e, ConfigError) else f"{args.config}: {e}"
        print(problem, file=sys.stderr)
        return EXIT_INVALID
    if args.output == "json":
        import json

        json.dump({"config": args.config, "valid": True, "resources": report}, sys.stdout, indent=2)
        print()
    else:
        _print_text(args.config, report)
    return EXIT_OK


def _resource_report(plugin: SourcePlugin) -> dict[str, Any]:
    from devplug.sources import HostDevicePlugin, VirtualPlugin

    if isinstance(plugin, HostDevicePlugin) and plugin.spec.health is not None:
        import asyncio

        devices = asyncio.run(plugin.checked_devices())
    else:
        devices = plugin.discover()
    return {
        "name": plugin.resource_name,
        "kind": getattr(plugin, "kind", "virtual" if isinstance(plugin, VirtualPlugin) else "host"),
        "count": plugin.spec.count,
        "idsEnv": plugin.ids_env,
        "preferredAllocation": plugin.preferred_allocation,
        "devices": [
            {
                "id": d.id,
                "health": "Healthy" if d.healthy else "Unhealthy",
                "numaNodes": list(d.numa_nodes),
                "hostPaths": [n.host_path for n in d.nodes],
                "attributes": dict(d.attributes),
            }
            for d in devices
        ],
        "warnings": list(plugin.warnings),
    }


def _add_dra_reports(
    args: argparse.Namespace, plugins: list[SourcePlugin], report: list[dict[str, Any]]
) -> None:
    """The mode of each resource and, for those served through DRA, the ResourceSlices
    the daemon would publish for this node now."""
    from devplug.sources.draconfig import config_driver, serves_dra

    for plugin, entry in zip(plugins, report, strict=True):
        spec = plugin.spec
        entry["mode"] = spec.mode
        if not serves_dra(spec.mode):
            continue
        from devplug.cli.serve import node_name
        from devplug.framework.dra.slices import slice_bodies

        driver = config_driver(plugin)
        plugin.publish(plugin.discover())
        entry["draDriver"] = driver.name
        entry["slices"] = slice_bodies(driver, node_name(args), generation=1)


def _print_slices(resource: dict[str, Any]) -> None:
    for body in resource.get("slices", []):
        spec = body["spec"]
        where = f"  DRA driver {spec['driver']}, slice {body['metadata']['name']} "
        where += f"(node {spec['nodeName']})"
        if "sharedCounters" in spec:
            print(f"{where}: {len(spec['sharedCounters'])} counter set(s)")
            for counters in spec["sharedCounters"]:
                values = [f"{k}={v['value']}" for k, v in counters["counters"].items()]
                print(f"    {counters['name']}: {' '.join(values)}")
            continue
        print(f"{where}: {len(spec['devices'])} device(s)")
        for device in spec["devices"]:
            values = [
                f"{k}={next(iter(v.values()))}" for k, v in device.get("attributes", {}).items()
            ]
            # Capacities apart: a CEL selector reads them as device.capacity[...], not
            # device.attributes[...].
            capacity = [f"{k}={v['value']}" for k, v in device.get("capacity", {}).items()]
            if capacity:
                values += ["capacity", *capacity]
            if device.get("allowMultipleAllocations"):
                values.append("shared")
            for use in device.get("consumesCounters", []):
                taken = [f"{k}={v['value']}" for k, v in use["counters"].items()]
                values += [f"consumes {use['counterSet']}:", *taken]
            print(f"    {device['name']}: {' '.join(values) or '-'}")


def _print_text(config: str, report: list[dict[str, Any]]) -> None:
    from devplug.tables import table

    print(f"{config}: valid, {len(report)} resource(s)")
    for resource in report:
        devices = resource["devices"]
        healthy = sum(d["health"] == "Healthy" for d in devices)
        print(
            f"\n{resource['name']} ({resource['kind']}, count {resource['count']}, "
            f"env {resource['idsEnv'] or '-'}): {len(devices)} device(s), {healthy} healthy"
        )
        rows = [
            (
                d["id"],
                d["health"],
                "numa " + ",".join(map(str, d["numaNodes"])) if d["numaNodes"] else "-",
                " ".join(d["hostPaths"]) or "-",
            )
            for d in devices
        ]
        for line in table(None, rows, indent="  "):
            print(line)
        _print_slices(resource)
        for warning in resource["warnings"]:
            print(f"  warning: {warning}")
