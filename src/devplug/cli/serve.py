"""`devplug serve`: serve the resources of a config file to the kubelet until stopped."""

from __future__ import annotations

import argparse
import logging
import sys

from devplug.api.constants import DEVICE_PLUGIN_PATH

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


def run(args: argparse.Namespace) -> int:
    import asyncio

    from devplug.framework.daemon import serve
    from devplug.sources import ConfigError, build_plugins, load_config, load_default_config
    from devplug.sources.services import build_services

    try:
        config = load_config(args.config) if args.config else load_default_config()
        plugins = build_plugins(config, sysfs_root=args.sysfs_root, dev_root=args.dev_root)
        services = build_services(config, plugins, feature_file=args.feature_file)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_INVALID
    log.info(
        "serving %s from %s in %s",
        ", ".join(p.resource_name for p in plugins),
        args.config or "the packaged default config",
        args.plugin_dir,
    )
    try:
        asyncio.run(serve(plugins, args.plugin_dir, services=services))
    except Exception:
        log.exception("stopped on a failure")
        return EXIT_FAILED
    return EXIT_OK
