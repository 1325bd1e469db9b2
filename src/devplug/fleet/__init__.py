"""Fleets of simulated device nodes for a real API server and scheduler.

    fleet = load_fleet("fleet.yaml")                     # pools, their configs and GPUs
    async with KubeApi.from_kubeconfig("kubeconfig") as api:
        runner = FleetRunner(fleet, api, work_dir)
        await runner.start()                             # Nodes, Leases, ResourceSlices
        await runner.serve(stop)                         # the kubelet stand-in of each node

`devplug fleet up|down|check` is the command on top (see docs/fleet.md).
"""

import logging

from devplug.fleet.spec import Fleet, Pool, load_fleet, parse_fleet

__all__ = ["Fleet", "Pool", "load_fleet", "parse_fleet", "quiet_node_logs"]

# Lines per node and per pod: thousands of them in a fleet.
CHATTY_LOGGERS = ("devplug.simulator", "devplug.events", "devplug.fleet.node")


def quiet_node_logs(level: str) -> None:
    """Keep the per-node and per-pod info lines out unless `level` is debug."""
    if level != "debug":
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
