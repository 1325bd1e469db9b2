"""`devplug check`: validate a config file and show the devices it would serve now."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug.sources import SourcePlugin

from devplug.cli import style


def configure(parser: argparse.ArgumentParser) -> None:
    style.add_config(parser)
    style.add_output(parser)
    from devplug.cli.serveoptions import add_root_options

    add_root_options(parser)
    from devplug.cli.serveoptions import add_gdp_options

    add_gdp_options(parser)
    parser.add_argument(
        "--node-name",
        metavar="NAME",
        help="the node whose DRA slices to show (default: $NODE_NAME, else the host name)",
    )
    parser.add_argument(
        "--device-classes",
        action="store_true",
        help="print the cluster objects the config's DRA drivers need instead of the "
        "report: their DeviceClasses and the ClusterRole for claim status (-o yaml: one "
        "document each, for kubectl apply -f -)",
    )


def run(args: argparse.Namespace) -> int:
    from devplug.api.constants import DEVICE_PLUGIN_PATH
    from devplug.cli.serveoptions import gdp_settings
    from devplug.sources import ConfigError, build_plugins, load_config, load_default_config
    from devplug.sources.validate import CannotStart, plugins_to_serve

    name = args.config or "the packaged default config"
    try:
        gdp = gdp_settings(args)
        if gdp is not None:
            name = gdp.source
            config = gdp.config
        else:
            config = load_config(args.config) if args.config else load_default_config()
        plugins = plugins_to_serve(
            config,
            name,
            lambda c: build_plugins(c, sysfs_root=args.sysfs_root, dev_root=args.dev_root),
            DEVICE_PLUGIN_PATH,
        )
        report = [_resource_report(p) for p in plugins]
        _add_dra_reports(args, plugins, report)
    except CannotStart as e:
        return style.fail(args, str(e))
    except (ConfigError, ValueError) as e:
        problem = str(e) if isinstance(e, ConfigError) else f"{name}: {e}"
        print(problem, file=sys.stderr)
        return style.EXIT_USAGE
    if args.device_classes:
        objects = _cluster_objects(report)
        style.print_result(objects, args.output, text=lambda: _objects_text(objects), each=True)
        return style.EXIT_OK
    if gdp is not None:
        # The devplug config of the generic device plugin's flags, to move to it.
        from devplug.sources.gdpfront import to_yaml

        shown = {"config": name, "valid": True, "devplugConfig": gdp.data, "resources": report}
        style.print_result(shown, args.output, text=lambda: to_yaml(gdp).rstrip("\n"))
        return style.EXIT_OK
    result = {"config": args.config, "valid": True, "resources": report}
    style.print_result(result, args.output, text=lambda: _text(name, report))
    return style.EXIT_OK


def _cluster_objects(report: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DeviceClass of each DRA driver, then the drivers' claim-status ClusterRole."""
    from devplug.framework.dra.classes import driver_status_role

    classes = [r["deviceClass"] for r in report if "deviceClass" in r]
    if not classes:
        return []
    return [*classes, driver_status_role([c["metadata"]["name"] for c in classes])]


def _objects_text(objects: list[dict[str, Any]]) -> str:
    lines = []
    for obj in objects:
        extended = (obj.get("spec") or {}).get("extendedResourceName")
        what = f" (extended resource {extended})" if extended else ""
        lines.append(f"{obj['kind']} {obj['metadata']['name']}{what}")
    return "\n".join(lines) or "no DRA driver: no cluster objects"


def _resource_report(plugin: SourcePlugin) -> dict[str, Any]:
    from devplug.sources import HostDevicePlugin

    if isinstance(plugin, HostDevicePlugin) and plugin.spec.health is not None:
        import asyncio

        devices = asyncio.run(plugin.checked_devices())
    else:
        devices = plugin.discover()
    from devplug.sources.validate import served_devices

    # What serving would publish: the first devices up to limits.maxDevicesPerResource.
    served, problem = served_devices(plugin.resource_name, devices, plugin.limits)
    devices = devices[:served]
    warnings = [*plugin.warnings, *([problem] if problem else [])]
    return {
        "name": plugin.resource_name,
        "kind": plugin.kind,
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
        "warnings": warnings,
    }


def _add_dra_reports(
    args: argparse.Namespace, plugins: list[SourcePlugin], report: list[dict[str, Any]]
) -> None:
    """The mode of each resource and, for those served through DRA, the ResourceSlices
    the daemon would publish for this node now."""
    from devplug.config.dra import extended_resource_name, plugin_driver_name, serves_dra
    from devplug.sources.dradriver import config_driver

    for plugin, entry in zip(plugins, report, strict=True):
        spec = plugin.spec
        entry["mode"] = spec.mode
        if spec.node_mode_label is not None:
            entry["nodeModeLabel"] = spec.node_mode_label
        if not serves_dra(spec.mode) and spec.node_mode_label is None:
            continue
        from devplug.framework.dra.classes import device_class

        driver_name = plugin_driver_name(plugin.resource_name, spec.name, spec.dra)
        # A node may serve it through DRA (its mode, or a node label): the class is
        # cluster-wide, and on nodes with the counted resource the scheduler uses that.
        mode = spec.mode if serves_dra(spec.mode) else "dra"
        extended = extended_resource_name(plugin.resource_name, spec.name, mode, spec.dra)
        entry["deviceClass"] = device_class(driver_name, extended)
        if not serves_dra(spec.mode):
            continue
        from devplug.cli.serveoptions import node_name
        from devplug.framework.dra.slices import slice_bodies

        driver = config_driver(plugin)
        plugin.publish(plugin.discover())
        entry["draDriver"] = driver.name
        entry["slices"] = slice_bodies(driver, node_name(args), generation=1)
        from devplug.framework.dra.rules import slice_problems

        # What a Kubernetes 1.38 API server would refuse stops here, not on a cluster.
        if problems := [p for body in entry["slices"] for p in slice_problems(body)]:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ValueError(f"{problems[0]}{more}")


def _slices_lines(resource: dict[str, Any]) -> list[str]:
    lines = []
    if label := resource.get("nodeModeLabel"):
        lines.append(f"  mode {resource['mode']}, or the value of the node's label {label}")
    if dc := resource.get("deviceClass"):
        extended = dc["spec"].get("extendedResourceName")
        counted = f", asked by count as {extended}" if extended else ", claims only"
        lines.append(f"  DeviceClass {dc['metadata']['name']}{counted}")
    for body in resource.get("slices", []):
        spec = body["spec"]
        where = f"  DRA driver {spec['driver']}, slice {body['metadata']['name']} "
        where += f"(node {spec['nodeName']})"
        if "sharedCounters" in spec:
            lines.append(f"{where}: {len(spec['sharedCounters'])} counter set(s)")
            for counters in spec["sharedCounters"]:
                values = [f"{k}={v['value']}" for k, v in counters["counters"].items()]
                lines.append(f"    {counters['name']}: {' '.join(values)}")
            continue
        lines.append(f"{where}: {len(spec['devices'])} device(s)")
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
            lines.append(f"    {device['name']}: {' '.join(values) or '-'}")
    return lines


def _text(config: str, report: list[dict[str, Any]]) -> str:
    from devplug.ground.tables import table

    lines = [f"{config}: valid, {len(report)} resource(s)"]
    for resource in report:
        devices = resource["devices"]
        healthy = sum(d["health"] == "Healthy" for d in devices)
        lines.append(
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
        lines += table(None, rows, indent="  ")
        lines += _slices_lines(resource)
        lines += [f"  warning: {warning}" for warning in resource["warnings"]]
    return "\n".join(lines)
