"""The one check between a config and what is served: `devplug check`, `devplug serve`
and a config reload all pass through `plugins_to_serve`, so that a config `check` calls
valid is one `serve` serves, and one a reload would refuse is one `check` refuses.

`parse_config` checks the file on its own; this checks what only the built plugins
say (a plugin that cannot start, a socket path past the unix limit) and bounds what
each one would publish by the config's limits, as serving will.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from devplug.api.constants import KUBELET_SOCKET
from devplug.config.dra import serves_device_plugin
from devplug.config.errors import ConfigError
from devplug.config.root import Config
from devplug.framework.limits import Limits, device_limit_problem
from devplug.ground.unixserver import socket_path_problem
from devplug.sources import start_problems

if TYPE_CHECKING:
    from devplug.sources.protocol import SourcePlugin

P = TypeVar("P", bound="SourcePlugin")


class CannotStart(ConfigError):
    """A valid config whose plugins cannot start on this host (NVML failing, for one):
    a runtime failure rather than a usage error."""


def plugins_to_serve(
    config: Config,
    source: str,
    build: Callable[[Config], Sequence[P]],
    plugin_dir: Path | str,
) -> list[P]:
    """The plugins `build` makes of a checked `config`, or a ConfigError (one line,
    naming `source`) saying why they cannot be served from `plugin_dir`."""
    plugins = list(build(config))
    if problems := start_problems(plugins):
        raise CannotStart("; ".join(problems))
    if problem := socket_path_problem(Path(plugin_dir) / KUBELET_SOCKET):
        raise ConfigError(f"--plugin-dir: {problem}")
    for plugin in plugins:
        if not serves_device_plugin(plugin.spec.mode):
            continue  # a DRA driver's sockets are its own (checked with its folders)
        if problem := socket_path_problem(Path(plugin_dir) / plugin.socket_name):
            raise ConfigError(f"{source}: {plugin.resource_name}: {problem}")
    return plugins


def served_devices(name: str, devices: Sequence[object], limits: Limits) -> tuple[int, str | None]:
    """How many of the `devices` found for resource `name` are served, and the warning
    said when the limit leaves some out (the same line the daemon logs)."""
    problem = device_limit_problem(name, len(devices), limits)
    return min(len(devices), limits.max_devices), problem
