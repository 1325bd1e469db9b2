"""`devplug serve`: serve the resources of a config file to the kubelet until stopped."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from devplug.api.constants import DEVICE_PLUGIN_PATH
from devplug.cli import style
from devplug.cli.serveoptions import (
    add_dra_options,
    add_gdp_options,
    add_root_options,
    gdp_settings,
    node_name,
)

if TYPE_CHECKING:
    from pathlib import Path

    from devplug.framework.daemon import Service
    from devplug.sources import Config, SourcePlugin
    from devplug.sources.gdpfront import Settings as GdpSettings
    from devplug.sources.reload import BuildPlugins

__all__ = [
    "add_dra_options",
    "add_gdp_options",
    "add_root_options",
    "configure",
    "dra_dirs",
    "gdp_settings",
    "label_keys",
    "node_name",
    "nvidia_config_text",
    "reload_and_metrics",
    "run",
]

log = logging.getLogger("devplug.serve")


def configure(parser: argparse.ArgumentParser) -> None:
    style.add_config(parser)
    parser.add_argument(
        "--plugin-dir",
        default=DEVICE_PLUGIN_PATH,
        type=style.folder,
        metavar="DIR",
        help="the kubelet's device-plugins folder, where kubelet.sock is",
    )
    parser.add_argument(
        "--nvidia-config",
        metavar="PATH",
        help="serve the GPUs with NVIDIA device plugin's config file, or a folder of named "
        "ones chosen by the node label nvidia.com/device-plugin.config (instead of --config)",
    )
    parser.add_argument(
        "--nvidia-flags",
        type=style.json_object,
        default={},
        metavar="JSON",
        help="NVIDIA's command-line flags, laid over --nvidia-config, in the shape of its "
        'file ({"flags": {"migStrategy": "mixed"}}; nvidia-device-plugin sets it)',
    )
    parser.add_argument(
        "--nvidia-options",
        type=style.json_object,
        default={},
        metavar="JSON",
        help='devplug\'s own keys of that nvidia: block ({"hostRoot": "/host"})',
    )
    add_root_options(parser)
    parser.add_argument(
        "--feature-file",
        type=style.file_path,
        metavar="FILE",
        help="write node-feature-discovery labels to FILE (default: the config's nodeFeatures)",
    )
    parser.add_argument(
        "--metrics-port",
        type=style.port,
        metavar="PORT",
        help="serve /metrics, /healthz and /readyz on this port (default: off; 0: any)",
    )
    parser.add_argument(
        "--metrics-address",
        default="",
        metavar="ADDR",
        help="the address to serve metrics on (default: all)",
    )
    parser.add_argument(
        "--metrics-pod-resources",
        type=style.socket_path,
        metavar="SOCKET",
        help="add devplug_pod_device_info (device -> pod, container) from the kubelet's "
        "PodResources socket, e.g. /var/lib/kubelet/pod-resources/kubelet.sock",
    )
    add_dra_options(parser)
    add_gdp_options(parser)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import os

    log.debug("starting, pid %d", os.getpid())

    from devplug.framework.daemon import serve
    from devplug.sources import (
        ConfigError,
        build_plugins,
        load_config,
        load_default_config,
        parse_config,
    )
    from devplug.sources.services import build_services
    from devplug.sources.validate import CannotStart, plugins_to_serve

    def build(config: Config) -> list[SourcePlugin]:
        return build_plugins(config, sysfs_root=args.sysfs_root, dev_root=args.dev_root)

    from devplug.config.root import apply_node_modes, needs_node_labels

    text = None
    labels: dict[str, str] | None = None
    try:
        gdp = gdp_settings(args)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return style.EXIT_USAGE
    if gdp is not None:
        _use_gdp_settings(args, gdp)
    if args.nvidia_config is not None or args.nvidia_flags:
        if args.config:
            return style.fail(
                args,
                "--nvidia-config replaces --config: set nvidia.nvidiaConfig in a config "
                "file to use both",
                style.EXIT_USAGE,
            )
        text = nvidia_config_text(args.nvidia_config or "", args.nvidia_flags, args.nvidia_options)
    from devplug.config import nvidiafile

    # NVIDIA configs chosen by a node label read it from the API server, before choosing
    # (once; a failure stops the start with one line).
    nvidiafile.read_node_labels = lambda: _nvidia_node_labels(args)
    try:
        if gdp is not None:
            config = gdp.config
        elif text is not None:
            config = parse_config(text, "--nvidia-config")
        else:
            config = load_config(args.config) if args.config else load_default_config()
        source = "--nvidia-config" if text else args.config or "<packaged default.yaml>"
        source = gdp.source if gdp is not None else source
        if needs_node_labels(config):
            labels = _node_labels(args)
            apply_node_modes(config, labels, node_name(args), source)
        plugins = plugins_to_serve(config, source, build, args.plugin_dir)
        services = build_services(config, feature_file=args.feature_file)
    except (nvidiafile.NodeLabelsUnreadable, CannotStart) as error:
        return style.fail(args, str(error))
    except ConfigError as e:
        print(e, file=sys.stderr)
        return style.EXIT_USAGE
    except ValueError as e:  # no usable kubeconfig for the node's labels
        return style.fail(args, f"nodeModeLabel: {e}", style.EXIT_USAGE)
    from devplug.config.dra import serves_device_plugin, serves_dra

    device_plugins = [p for p in plugins if serves_device_plugin(p.spec.mode)]
    services = list(services)
    if any(serves_dra(p.spec.mode) for p in plugins):
        from devplug.ground.extras import MissingExtra

        try:
            services.append(_dra_service(args, plugins))
        except MissingExtra as e:
            return style.fail(args, str(e))
        except Exception as e:
            print(f"devplug serve: DRA: {e}", file=sys.stderr)
            return style.EXIT_USAGE
    if config.node_events:
        from devplug.framework.nodeevents import NodeEvents
        from devplug.ground.extras import MissingExtra

        try:
            services.append(NodeEvents(node_name(args), args.kubeconfig))
        except (MissingExtra, ValueError) as e:
            return style.fail(args, f"nodeEvents: {e}", style.EXIT_USAGE)
    from devplug.sources.nvidia.extender import uses_extender

    if any(uses_extender(p) for p in device_plugins):
        from devplug.ground.extras import MissingExtra
        from devplug.sources.nvidia.extender import ExtenderAgent

        try:
            services.append(ExtenderAgent(node_name(args), args.kubeconfig))
        except (MissingExtra, ValueError) as e:
            return style.fail(args, f"replicaPolicy extender: {e}", style.EXIT_USAGE)
    log.info(
        "serving %s from %s in %s",
        ", ".join(p.resource_name for p in plugins),
        source,
        args.plugin_dir,
    )

    def build_device_plugins(config: Config) -> list[SourcePlugin]:
        # A reload swaps device plugins only; DRA drivers take changes at a restart.
        # The node's labels as read at start choose the modes again.
        if labels is not None:
            apply_node_modes(config, labels, node_name(args), source)
        return [p for p in build(config) if serves_device_plugin(p.spec.mode)]

    from devplug.sources.services import config_followers

    followers = config_followers(services, feature_file=args.feature_file)
    services += reload_and_metrics(args, config, build_device_plugins, text, followers)
    from devplug.framework.daemon import ServiceFailed
    from devplug.ground.extras import MissingExtra

    try:
        services += _debug_services()
        asyncio.run(serve(device_plugins, args.plugin_dir, services=services))
    except (ServiceFailed, OSError, MissingExtra) as error:
        return style.fail(args, str(error))
    except Exception as error:  # a bug: one line, the trace at debug level
        log.debug("stopped on a failure", exc_info=True)
        return style.fail(args, f"stopped on a failure: {error!r}")
    return style.EXIT_OK


def _use_gdp_settings(args: argparse.Namespace, gdp: GdpSettings) -> None:
    """Serve as the generic device plugin would: its folder, its log level (unless
    --log-level says otherwise), /health and /metrics on its --listen address; its file
    is not reloaded (it never reloads it)."""
    if gdp.log_level is not None and args.log_level == "info":
        from devplug.ground.logs import setup_logging

        setup_logging(gdp.log_level, args.log_format)
    if gdp.plugin_directory is not None:
        args.plugin_dir = gdp.plugin_directory
    if args.metrics_port is None:
        args.metrics_port, args.metrics_address = gdp.listen_port, gdp.listen_host
        from devplug.ground.lazy import allow_ssl

        allow_ssl()  # prometheus-client imports it
    args.config = None


def _nvidia_node_labels(args: argparse.Namespace) -> dict[str, str]:
    from devplug.sources.nvidia.nodelabel import read_labels

    return read_labels(node_name(args), args.kubeconfig, args.context)


def _node_labels(args: argparse.Namespace) -> dict[str, str]:
    """The labels of this node, read once at start for `nodeModeLabel`; waited for while
    the API server is away or overloaded (the modes decide what is served); ValueError
    of one line when it refuses for good (TLS, 401, 403)."""
    from devplug.sources.nvidia.nodelabel import read_labels

    return read_labels(node_name(args), args.kubeconfig, args.context, waiting="nodeModeLabel")


def label_keys(config: Config) -> list[str]:
    """The node labels choosing NVIDIA configs of the config (their module loaded only
    when an `nvidia:` entry names one)."""
    if not any(r.nvidia is not None and r.nvidia.nvidia_config for r in config.resources):
        return []
    from devplug.sources.nvidia.nodelabel import label_keys as keys

    return keys(config)


def nvidia_config_text(
    path: str, flags: dict[str, Any] | None = None, options: dict[str, Any] | None = None
) -> str:
    """The config `--nvidia-config PATH` serves: one `nvidia:` entry reading that file
    (or choosing from that folder by the node label), NVIDIA's `flags` over it, and
    devplug's own keys of the block (`options`: hostRoot, recoverySeconds...)."""
    import json
    import os

    ref: dict[str, Any] = {}
    if path:
        ref["folder" if os.path.isdir(path) else "file"] = os.path.abspath(path)
    if flags:
        ref["flags"] = flags
    return json.dumps({"resources": [{"nvidia": {**(options or {}), "nvidiaConfig": ref}}]})


def reload_and_metrics(
    args: argparse.Namespace,
    config: Config,
    build: BuildPlugins,
    text: str | None = None,
    followers: Sequence[Callable[[Config], None]] = (),
) -> list[Service]:
    """The config reloader (with --config or --nvidia-config, whose `text` it is; `build`
    as at start-up; `followers` told each applied config), the node label watch (when a
    node label chooses an NVIDIA config) and the metrics server (with --metrics-port),
    each imported only when used."""
    services: list[Service] = []
    if args.config or text is not None:
        from devplug.sources.reload import ConfigReloader

        reloader = ConfigReloader(args.config, config, build, text, followers)
        services.append(reloader)
        if keys := label_keys(config):
            from devplug.sources.nvidia.nodelabel import NodeLabelWatch

            services.append(
                NodeLabelWatch(
                    node_name(args), args.kubeconfig, keys, reloader.request, args.context
                )
            )
    if args.metrics_port is not None:
        import os

        from devplug.framework.metrics import MetricsServer

        # With a pod UID (a rolling update with surge), the old pod may hold the port.
        surge = bool(getattr(args, "pod_uid", None) or os.environ.get("POD_UID"))
        services.append(
            MetricsServer(
                args.metrics_port,
                args.metrics_address,
                args.metrics_pod_resources,
                wait_for_port=surge,
            )
        )
    return services


def _dra_service(args: argparse.Namespace, plugins: Sequence[Any]) -> Any:
    """The DRA service of the resources with mode dra or both (its Kubernetes client
    lets in the ssl module `devplug serve` leaves out)."""
    import os
    from pathlib import Path

    from devplug.config.dra import serves_dra
    from devplug.framework.dra.service import DraService, DraSettings
    from devplug.sources.dradriver import config_driver

    drivers = [config_driver(plugin) for plugin in plugins if serves_dra(plugin.spec.mode)]
    registry, sockets = dra_dirs(args)
    settings = DraSettings(
        node_name=node_name(args),
        registry_dir=registry,
        plugins_dir=sockets,
        cdi_dir=Path(args.cdi_dir),
        kubeconfig=args.kubeconfig,
        context=args.context,
        claims_dir=Path(args.claims_dir) if args.claims_dir else None,
        pod_uid=args.pod_uid or os.environ.get("POD_UID", ""),
    )
    from devplug.framework.dra.nodeplugin import driver_sockets

    for driver in drivers:  # before anything is made: one line, a usage error
        try:
            driver_sockets(driver.name, registry, sockets, settings.pod_uid)
        except ValueError as error:
            raise ValueError(f"driver {driver.name}: {error}") from None
    return DraService(drivers, settings)


def dra_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """The kubelet's registration folder and DRA plugins folder: those given, else
    derived from the folders given (a moved --plugin-dir moves both), so that a
    serve on other folders never makes one on the real kubelet's."""
    from pathlib import Path

    registry = Path(args.registry_dir or Path(args.plugin_dir).parent / "plugins_registry")
    sockets = Path(args.dra_socket_dir or registry.parent / "plugins")
    return registry, sockets


def _debug_services() -> list[Service]:
    """The SIGUSR1 state dump, only when DEVPLUG_DEBUG_STATE asks for it (fault tests)."""
    import os

    from devplug.framework.debug import DEBUG_STATE_ENV

    path = os.environ.get(DEBUG_STATE_ENV)
    if not path:
        return []
    from devplug.framework.debug import DebugState

    return [DebugState(path)]
