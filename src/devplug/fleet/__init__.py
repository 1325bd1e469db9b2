"""Fleets of simulated device nodes for a real API server and scheduler.

    fleet = load_fleet("fleet.yaml")                     # pools, their configs and GPUs
    async with KubeApi.from_kubeconfig("kubeconfig") as api:
        runner = FleetRunner(fleet, api, work_dir)
        await runner.start()                             # Nodes, Leases, ResourceSlices
        await runner.serve(stop)                         # the kubelet stand-in of each node

`devplug fleet up|down|check` is the command on top (see docs/fleet.md).
"""

from devplug.fleet.spec import Fleet, Pool, load_fleet, parse_fleet

__all__ = ["Fleet", "Pool", "load_fleet", "parse_fleet"]
