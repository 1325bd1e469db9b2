"""`devplug gpus`: what NVML sees on this host and what devplug would serve from it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug.sources.nvidia.plugin import NvidiaPlugin

from devplug.cli import style

EXIT_NO_NVML = style.EXIT_FAILED


def configure(parser: argparse.ArgumentParser) -> None:
    style.add_config(
        parser, "a config file: its `nvidia:` resources (default: one `nvidia: {}` resource)"
    )
    parser.add_argument(
        "--host-root",
        default="/",
        type=style.folder,
        metavar="DIR",
        help="where the host's /dev, /proc, /sys are (a --config sets nvidia.hostRoot instead)",
    )
    style.add_output(parser)


def run(args: argparse.Namespace) -> int:
    import json

    from devplug.sources import ConfigError, build_plugins, load_config, parse_config
    from devplug.sources.nvidia.plugin import NvidiaPlugin

    try:
        if args.config:
            config = load_config(args.config)
        else:
            config = parse_config(
                f"resources:\n  - nvidia: {{hostRoot: {json.dumps(args.host_root)}}}\n",
                "--host-root",
            )
        plugins = [p for p in build_plugins(config) if isinstance(p, NvidiaPlugin)]
    except ConfigError as e:
        print(e, file=sys.stderr)
        return style.EXIT_USAGE
    if not plugins:
        problem = f"{args.config}: no resource has an `nvidia:` block"
        return style.fail(args, problem, style.EXIT_USAGE)
    reports = [_source_report(p, plugins) for p in plugins if p.primary]
    style.print_result(
        {"sources": reports}, args.output, text=lambda: "\n".join(map(_text, reports))
    )
    unusable = [r for r in reports if not r["nvml"]["usable"]]
    if unusable:  # the report above says what NVML said; the failure in one line too
        problems = "; ".join(f"{r['resource']}: {r['nvml']['problem']}" for r in unusable)
        return style.fail(args, f"NVML is not usable ({problems})", EXIT_NO_NVML)
    return style.EXIT_OK


def _source_report(primary: NvidiaPlugin, plugins: list[NvidiaPlugin]) -> dict[str, Any]:
    from devplug.sources.nvidia.labels import node_labels

    source = primary.source
    view = source.view
    mine = [p for p in plugins if p.source is source]
    nvml: dict[str, Any] = {"usable": view is not None, "problem": source.problem}
    if view is not None:
        numa = {u.gpu.index: u.numa for u in source.units}
        nvml |= {
            "driverVersion": view.driver_version,
            "cudaVersion": view.cuda_version,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.model,
                    "memoryMiB": g.memory // 2**20,
                    "computeCapability": "{}.{}".format(*g.compute_capability),
                    "pciAddress": g.bus_id,
                    "numaNode": numa.get(g.index),
                    "mig": "off" if not g.mig_capable else "on" if g.mig_enabled else "capable",
                    "migDevices": [
                        {"uuid": m.uuid, "profile": m.profile, "gpuInstance": m.gpu_instance}
                        for m in g.migs
                    ],
                }
                for g in view.gpus
            ],
            "nvlinks": [{"gpus": list(k), "links": n} for k, n in sorted(view.nvlinks.items())],
            "commonAncestors": [
                {"gpus": list(k), "level": n} for k, n in sorted(view.ancestors.items())
            ],
        }
    labels: dict[str, str] = {}
    resources = []
    for plugin in mine:
        devices = plugin.discover()
        labels |= node_labels(source, plugin.resource, plugin.primary, devices)
        resources.append(
            {
                "name": plugin.resource_name,
                "devices": [
                    {
                        "id": d.id,
                        "numaNodes": list(d.numa_nodes),
                        "env": dict(d.env),
                        "hostPaths": [n.host_path for n in d.nodes],
                        "cdiDevices": list(d.cdi_devices),
                    }
                    for d in devices
                ],
            }
        )
    return {
        "resource": primary.resource_name,
        "nvml": nvml,
        "resources": resources,
        "labels": labels,
        "warnings": primary.warnings,
    }


def _text(report: dict[str, Any]) -> str:
    from devplug.ground.tables import table

    nvml = report["nvml"]
    lines = [f"{report['resource']}:"]
    if not nvml["usable"]:
        lines.append(f"  NVML is not usable: {nvml['problem']}")
        return "\n".join(lines)
    gpus = nvml["gpus"]
    lines.append(
        f"  NVML: driver {nvml['driverVersion']}, CUDA {nvml['cudaVersion']}, {len(gpus)} GPU(s)"
    )
    rows = []
    for g in gpus:
        numa = "-" if g["numaNode"] is None else str(g["numaNode"])
        rows.append(
            (
                str(g["index"]),
                g["uuid"],
                g["model"],
                f"{g['memoryMiB']} MiB",
                g["computeCapability"],
                g["pciAddress"],
                numa,
                g["mig"],
            )
        )
        rows += [("", f"  {m['uuid']}", m["profile"], "", "", "", "", "") for m in g["migDevices"]]
    header = ("GPU", "UUID", "MODEL", "MEMORY", "CC", "PCI", "NUMA", "MIG")
    lines += table(header, rows, indent="  ")
    if nvml["nvlinks"]:
        pairs = ", ".join(
            f"{a}-{b} x{link['links']}" for link in nvml["nvlinks"] for a, b in [link["gpus"]]
        )
        lines.append(f"  NVLinks: {pairs}")
    for resource in report["resources"]:
        ids = [d["id"] for d in resource["devices"]]
        lines.append(f"  serves {resource['name']}: {len(ids)} device(s)")
    if report["labels"]:
        lines.append("  labels:")
        for name, value in sorted(report["labels"].items()):
            lines.append(f"    {name}={value}")
    for warning in report["warnings"]:
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)
