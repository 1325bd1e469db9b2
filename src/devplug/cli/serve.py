"""`devplug serve`: serve the resources of a config file to the kubelet until stopped."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from devplug.api.constants import DEVICE_PLUGIN_PATH

if TYPE_CHECKING:
    from devplug.framework.daemon import Service
    from devplug.sources import Config, SourcePlugin
    from devplug.sources.reload import BuildPlugins

log = logging.getLogger("devplug.serve")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="the config file (default: the packaged default.yaml)"
    )
    parser.add_argument(
        "--plugin-dir",
        default=DEVICE_PLUGIN_PATH,
        metavar="DIR",
        help=f"the kubelet's device-plugins folder (default: {DEVICE_PLUGIN_PATH})",
    )
    parser.add_argument(
        "--sysfs-root", metavar="DIR", help="where sysfs is (default: the config's, or /sys)"
    )
    parser.add_argument(
        "--dev-root", metavar="DIR", help="where device nodes are (default: the config's, or /dev)"
    )
    parser.add_argument(
        "--feature-file",
        metavar="FILE",
        help="write node-feature-discovery labels to FILE (default: the config's nodeFeatures)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics, /healthz and /readyz on this port (off by default; 0: any)",
    )
    parser.add_argument(
        "--metrics-address",
        default="",
        metavar="ADDR",
        help="the address to serve metrics on (default: all)",
    )
    parser.add_argument(
        "--metrics-pod-resources",
        metavar="SOCKET",
        help="add devplug_pod_device_info (device -> pod, container) from the kubelet's "
        "PodResources socket, e.g. /var/lib/kubelet/pod-resources/kubelet.sock",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from devplug.framework.daemon import serve
    from devplug.sources import ConfigError, build_plugins, load_config, load_default_config
    from devplug.sources.services import build_services

    def build(config: Config) -> list[SourcePlugin]:
        return build_plugins(config, sysfs_root=args.sysfs_root, dev_root=args.dev_root)

    try:
        config = load_config(args.config) if args.config else load_default_config()
        plugins = build(config)
        services = build_services(config, feature_file=args.feature_file)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_INVALID
    log.info(
        "serving %s from %s in %s",
        ", ".join(p.resource_name for p in plugins),
        args.config or "the packaged default config",
        args.plugin_dir,
    )
    services += reload_and_metrics(args, config, build)
    try:
        asyncio.run(serve(plugins, args.plugin_dir, services=services))
    except Exception:
        log.exception("stopped on a failure")
        return EXIT_FAILED
    return EXIT_OK


def reload_and_metrics(
    args: argparse.Namespace, config: Config, build: BuildPlugins
) -> list[Service]:
    """The config reloader (with --config; `build` as at start-up) and the metrics server
    (with --metrics-port), each imported only when used."""
    services: list[Service] = []
    if args.config:
        from devplug.sources.reload import ConfigReloader

        services.append(ConfigReloader(args.config, config, build))
    if args.metrics_port is not None:
        from devplug.framework.metrics import MetricsServer

        services.append(
            MetricsServer(args.metrics_port, args.metrics_address, args.metrics_pod_resources)
        )
    return services
