"""Fleets of simulated device nodes for a real API server and scheduler.

    fleet = load_fleet("fleet.yaml")                     # pools, their configs and GPUs
    async with connect("kubeconfig") as api:
        runner = FleetRunner(fleet, api, work_dir)
        await runner.start()                             # Nodes, Leases, ResourceSlices
        await runner.serve(stop)                         # the kubelet stand-in of each node

`devplug fleet up|down|check` is the command on top (see docs/fleet.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from devplug.fleet.spec import Fleet, Pool, load_fleet, parse_fleet

if TYPE_CHECKING:
    from devplug.apiserver.client import KubeApi

__all__ = ["Fleet", "Pool", "connect", "load_fleet", "parse_fleet", "quiet_node_logs"]

# Lines per node and per pod: thousands of them in a fleet.
CHATTY_LOGGERS = ("devplug.simulator", "devplug.events", "devplug.fleet.node")


def quiet_node_logs(level: str) -> None:
    """Keep the per-node and per-pod info lines out unless `level` is debug."""
    if level != "debug":
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def connect(kubeconfig: str | None, context: str | None = None, **kwargs: Any) -> KubeApi:
    """The API client of a fleet (or a plan on an API server): ValueError of one line
    for a kubeconfig that cannot be used; MissingExtra naming the `fleet` extra when
    aiohttp is missing."""
    from devplug.apiserver.client import KubeApi

    return KubeApi.from_kubeconfig(kubeconfig, context, **kwargs)
