"""A fleet from a cluster trace's node list (openb's `sn,cpu_milli,memory_mib,gpu,model`),
read as the capacity planner reads it (devplug.placement.trace), so that the real
scheduler and the planner place pods on the same nodes.

Each node of the list is a fleet node of the same name, CPU and memory; its GPUs are
the fake NVML driver's, named as the list names their model, and served for the
scheduler extender: `replicaPolicy: extender`, REPLICAS replicas per GPU, so one replica
is 10 milli-GPUs and a pod asks for a share of one GPU as a count of them (the trace's
shares are multiples of 10). Nodes alike (CPU, memory, GPUs, model) make one pool.
"""

from __future__ import annotations

import re

import yaml

from devplug.config.errors import ConfigError
from devplug.config.load import parse_config
from devplug.fleet.spec import Fleet, GpuHostSpec, Pool, PoolSpec, _stem_name
from devplug.kube.names import is_dns_subdomain
from devplug.placement.state import MILLI
from devplug.placement.trace import TraceError, read_nodes

RESOURCE = "devplug.io/gpu-milli"
REPLICAS = 100  # per GPU: one replica is MILLI / REPLICAS = 10 milli-GPUs
PODS = 10_000  # pods per node: the planner counts none, so none is the limit
FAKE_MODEL = "T4"  # the fake driver's GPU behind every model of the list (its name: the list's)


def unit() -> int:
    """The milli-GPUs one replica of RESOURCE is."""
    return MILLI // REPLICAS


def node_list_fleet(path: str) -> Fleet:
    """The fleet of a node list; ConfigError (one line) for a list it cannot serve."""
    try:
        nodes = read_nodes(path)
    except TraceError as error:
        raise ConfigError(str(error)) from None
    config = parse_config(
        yaml.safe_dump(
            {
                "resources": [
                    {
                        "name": RESOURCE,
                        "nvidia": {"replicas": REPLICAS, "replicaPolicy": "extender"},
                    }
                ]
            }
        ),
        f"{path}: the nodes' config",
    )
    shapes: dict[tuple[int, int, int, str], list[str]] = {}
    for node in nodes:
        if not node.gpus:
            raise ConfigError(
                f"{path}: node {node.name}: gpu: 0: every node of a fleet from a node list "
                "serves GPUs (the extender places pods on nodes that publish them)"
            )
        if not is_dns_subdomain(node.name):
            raise ConfigError(f"{path}: node {node.name!r}: sn: not a DNS subdomain")
        shapes.setdefault((node.cpu, node.memory, node.gpus, node.model), []).append(node.name)
    pools = []
    taken: set[str] = set()
    for index, ((cpu, memory, gpus, model), names) in enumerate(shapes.items()):
        name = _pool_name(model, gpus, cpu, memory, taken)
        spec = PoolSpec(
            name=name,
            count=len(names),
            cpu=f"{cpu}m",
            memory=f"{memory}Mi",
            pods=PODS,
            config={},
            gpus=GpuHostSpec(model=FAKE_MODEL, name=model, count=gpus),
        )
        pools.append(Pool(spec, config, tuple(names), f"pools[{index}] ({name})"))
    return Fleet(_stem_name(path), path, tuple(pools))


def _pool_name(model: str, gpus: int, cpu: int, memory: int, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9-]", "-", f"{model.lower()}-{gpus}x-{cpu}m-{memory}mi").strip("-")
    name = base[:56] or "gpu"
    suffix = 1
    while name in taken:
        suffix += 1
        name = f"{base[:50]}-{suffix}"
    taken.add(name)
    return name
