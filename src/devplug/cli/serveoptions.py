"""The options `devplug serve` and `devplug check` share: where sysfs and the device
nodes are, the DRA resources' settings, and the generic device plugin's own flags (its
DaemonSet with devplug's image); and this node's name."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from devplug.cli import style

if TYPE_CHECKING:
    from devplug.sources.gdpfront import Settings as GdpSettings

log = logging.getLogger("devplug.serve")


def add_gdp_options(parser: argparse.ArgumentParser) -> None:
    """The generic device plugin's own flags, for its DaemonSet with devplug's image."""
    group = parser.add_argument_group(
        "the generic device plugin's flags (with them, --config names its file: see "
        "docs/migrate.md)"
    )
    group.add_argument(
        "--device",
        action="append",
        metavar="SPEC",
        help="one of its device specs, YAML or JSON (repeatable)",
    )
    group.add_argument(
        "--domain", metavar="DOMAIN", help="the domain of its resource names (default: squat.ai)"
    )
    group.add_argument(
        "--plugin-directory",
        type=style.folder,
        metavar="DIR",
        help="the kubelet's device-plugins folder (as --plugin-dir)",
    )
    group.add_argument(
        "--listen",
        metavar="[HOST]:PORT",
        help="where to serve /health, /metrics, /healthz and /readyz (default: :8080)",
    )


def gdp_settings(args: argparse.Namespace) -> GdpSettings | None:
    """The generic device plugin's flags and file as devplug's config and settings, or
    None when none of its flags is given and --config is not its file. Raises
    ConfigError (one line)."""
    import os

    from devplug.sources.gdpfront import Flags, is_gdp_file, load

    flags = Flags(
        devices=args.device,
        domain=args.domain,
        plugin_directory=args.plugin_directory,
        listen=args.listen,
        config=args.config,
    )
    if not flags.given() and not (args.config and is_gdp_file(args.config)):
        return None
    settings = load(flags, os.environ)
    for warning in settings.warnings:
        log.warning("%s", warning)
    return settings


def add_root_options(parser: argparse.ArgumentParser) -> None:
    """Where sysfs and the device nodes are, for `serve` and `check` alike."""
    parser.add_argument(
        "--sysfs-root",
        type=style.folder,
        metavar="DIR",
        help="where sysfs is (default: the config's, or /sys)",
    )
    parser.add_argument(
        "--dev-root",
        type=style.folder,
        metavar="DIR",
        help="where device nodes are (default: the config's, or /dev)",
    )


def add_dra_options(parser: argparse.ArgumentParser) -> None:
    """Options of the resources served through DRA (`mode: dra` or `both`)."""
    from devplug.api.dra import constants as dra

    group = parser.add_argument_group("DRA (resources with mode dra or both)")
    group.add_argument(
        "--node-name",
        metavar="NAME",
        help="this node's name, the pool of its slices (default: $NODE_NAME, else the host name)",
    )
    style.add_kubeconfig(
        group,
        "kubeconfig of the API server (default: $KUBECONFIG, else in-cluster)",
    )
    group.add_argument(
        "--registry-dir",
        type=style.folder,
        metavar="DIR",
        help="the kubelet's plugin registration folder (default: plugins_registry beside "
        f"--plugin-dir, {dra.PLUGINS_REGISTRY_PATH})",
    )
    group.add_argument(
        "--dra-socket-dir",
        type=style.folder,
        metavar="DIR",
        help="the folder of each DRA driver's own folder and dra.sock, the kubelet's plugins "
        f"(default: plugins beside the registration folder, {dra.PLUGINS_PATH})",
    )
    group.add_argument(
        "--cdi-dir",
        default=dra.CDI_PATH,
        type=style.folder,
        metavar="DIR",
        help="where the CDI specs of prepared claims go",
    )
    group.add_argument(
        "--pod-uid",
        metavar="UID",
        help="this pod's UID (default: $POD_UID): two devplug pods then serve one node "
        "side by side during a rolling update",
    )
    group.add_argument(
        "--claims-dir",
        type=style.folder,
        metavar="DIR",
        help="read claims from YAML files in DIR, and write the slices there (no API server)",
    )


def node_name(args: argparse.Namespace) -> str:
    from devplug.framework.names import this_node

    name: str = args.node_name or this_node()
    return name
