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
    parser.add_argument(
        "--sysfs-root", metavar="DIR", help="where sysfs is (default: the config's, or /sys)"
    )
    parser.add_argument(
        "--dev-root", metavar="DIR", help="where device nodes are (default: the config's, or /dev)"
    )


def run(args: argparse.Namespace) -> int:
    from devplug.sources import ConfigError, build_plugins, load_config

    try:
        plugins = build_plugins(
            load_config(args.config), sysfs_root=args.sysfs_root, dev_root=args.dev_root
        )
        report = [_resource_report(p) for p in plugins]
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
        for warning in resource["warnings"]:
            print(f"  warning: {warning}")
