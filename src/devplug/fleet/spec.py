"""The fleet file: pools of simulated nodes, each pool with the devplug config its nodes
run (the same YAML as on a real node) and, for GPU pools, the fake NVML host its
nodes have.

    fleet = load_fleet("fleet.yaml")      # raises ConfigError, one line

A bad file gives one line naming the file, the pool and the field:
`fleet.yaml: pools[1] (h100).config: resources[0].count: expected an integer >= 1, got 0`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn

import msgspec
import yaml

from devplug.config.errors import ConfigError, convert
from devplug.config.load import parse_config
from devplug.config.root import Config
from devplug.ground import inputs
from devplug.kube.names import (
    is_dns_label,
    is_dns_subdomain,
    is_label_value,
    is_qualified_name_part,
)
from devplug.kube.quantity import QuantityError, parse_quantity
from devplug.simulator.topology import MAX_NUMA_NODES, POLICIES

MAX_NODES = 20_000
Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class _Schema(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class TaintSpec(_Schema):
    key: str
    effect: Effect
    value: str = ""


class GpuHostSpec(_Schema):
    """The GPUs NVML shows on each node of the pool (the fake NVML driver's host)."""

    # A fake NVML description (JSON) to use as it is; the keys below are then unused.
    description: str | None = None
    # A model of the fake driver's tables ('H100-SXM5-80GB', 'A100-SXM4-40GB'...) or
    # its NVML name ('NVIDIA H100 80GB HBM3').
    model: str = "H100-SXM5-80GB"
    # The name NVML gives the GPUs (nvmlDeviceGetName) instead of the model's own.
    name: str | None = None
    count: int = 8
    # GPUs are spread evenly over the NUMA nodes, in index order.
    numa_nodes: int = 1
    # MIG instances of every GPU, as `nvidia-smi mig -cgi ... -C` names them: MIG on.
    mig: list[str] | None = None
    # NVLink: none, pairs (0-1, 2-3...) or all (through NVSwitches).
    nvlink: Literal["none", "pairs", "all"] = "none"


class PoolSpec(_Schema):
    name: str
    count: int = 1
    # Node names are '<namePrefix><index>', from 0; default '<name>-'.
    name_prefix: str | None = None
    labels: dict[str, str] = {}
    taints: list[TaintSpec] = []
    cpu: str | int = "8"
    memory: str = "32Gi"
    pods: int = 110
    # The kubelet's topology manager on each node.
    topology_policy: str = "none"
    numa_nodes: int | None = None
    # The devplug config of the nodes: inline, or a file (relative to the fleet file).
    config: dict[str, Any] | None = None
    config_file: str | None = None
    gpus: GpuHostSpec | None = None


class FleetFile(_Schema):
    pools: list[PoolSpec]
    # Labels the objects of the fleet (devplug.io/fleet); default: the file's stem.
    name: str | None = None


class Pool(msgspec.Struct, frozen=True):
    """A checked pool: its spec, the parsed devplug config and its node names."""

    spec: PoolSpec
    config: Config
    nodes: tuple[str, ...]
    where: str  # 'pools[1] (h100)', for messages

    @property
    def name(self) -> str:
        return self.spec.name


class Fleet(msgspec.Struct, frozen=True):
    name: str
    source: str
    pools: tuple[Pool, ...]

    @property
    def node_count(self) -> int:
        return sum(len(p.nodes) for p in self.pools)

    def pool(self, name: str) -> Pool:
        return next(p for p in self.pools if p.name == name)


def load_fleet(path: str | os.PathLike[str]) -> Fleet:
    """Read and check a fleet file; ConfigError with a one-line message."""
    source = os.fspath(path)
    try:
        text = inputs.read_text(source, inputs.LARGE_LIMITS, what="the fleet file")
    except inputs.InputError as error:
        raise ConfigError(str(error)) from None
    return parse_fleet(text, source, Path(source).resolve().parent)


def parse_fleet(text: str, source: str = "<fleet>", folder: Path | None = None) -> Fleet:
    """Check fleet text; `folder` is where `configFile` and `description` paths start."""
    try:
        data = inputs.load_yaml(text, source, inputs.LARGE_LIMITS)
    except inputs.InputError as error:
        raise ConfigError(str(error)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with 'pools'")
    try:
        spec = convert(data, FleetFile, source)
    except ConfigError as error:
        raise ConfigError(_with_pool_name(str(error), data)) from None
    base = folder or Path.cwd()

    def fail(field: str, problem: str) -> NoReturn:
        raise ConfigError(f"{source}: {field}: {problem}")

    name = spec.name if spec.name is not None else _stem_name(source)
    if not is_dns_label(name):
        fail("name", f"{name!r} is not a DNS label (lower case letters, digits, '-')")
    if not spec.pools:
        fail("pools", "expected at least one pool")
    pools: list[Pool] = []
    seen_pools: dict[str, str] = {}
    seen_nodes: dict[str, str] = {}
    for index, pool in enumerate(spec.pools):
        where = f"pools[{index}] ({pool.name})" if pool.name else f"pools[{index}]"
        checked = _check_pool(pool, where, base, source, fail)
        if pool.name in seen_pools:
            fail(f"{where}.name", f"pool {pool.name!r} is already {seen_pools[pool.name]}")
        seen_pools[pool.name] = where
        for node in checked.nodes:
            if node in seen_nodes:
                fail(f"{where}.namePrefix", f"node {node!r} is also a node of {seen_nodes[node]}")
            seen_nodes[node] = where
        pools.append(checked)
    if len(seen_nodes) > MAX_NODES:
        fail("pools", f"{len(seen_nodes)} nodes, more than {MAX_NODES}")
    return Fleet(name, source, tuple(pools))


def _with_pool_name(message: str, data: dict[str, Any]) -> str:
    """'pools[1].colour: ...' -> 'pools[1] (h100).colour: ...' when the pool has a name."""
    match = re.search(r"pools\[(\d+)\]", message)
    pools = data.get("pools")
    if match is None or not isinstance(pools, list) or int(match[1]) >= len(pools):
        return message
    pool = pools[int(match[1])]
    name = pool.get("name") if isinstance(pool, dict) else None
    if not isinstance(name, str) or not name:
        return message
    return message.replace(match[0], f"{match[0]} ({name})", 1)


def _stem_name(source: str) -> str:
    stem = Path(source).stem.lower()
    return re.sub(r"[^a-z0-9-]", "-", stem).strip("-")[:63] or "fleet"


def _check_pool(
    pool: PoolSpec, where: str, base: Path, source: str, fail: Callable[[str, str], NoReturn]
) -> Pool:
    if not is_dns_label(pool.name):
        fail(f"{where}.name", f"{pool.name!r} is not a DNS label (lower case letters, digits, '-')")
    if not 1 <= pool.count <= MAX_NODES:
        fail(f"{where}.count", f"expected an integer from 1 to {MAX_NODES}, got {pool.count}")
    prefix = pool.name_prefix if pool.name_prefix is not None else f"{pool.name}-"
    nodes = tuple(f"{prefix}{i}" for i in range(pool.count))
    for node in (nodes[0], nodes[-1]):
        if not is_dns_subdomain(node):
            fail(f"{where}.namePrefix", f"node name {node!r} is not a DNS subdomain")
    for key, value in pool.labels.items():
        if problem := _label_problem(key, value):
            fail(f"{where}.labels", problem)
    for t, taint in enumerate(pool.taints):
        if problem := _label_problem(taint.key, taint.value):
            fail(f"{where}.taints[{t}]", problem)
    values: tuple[tuple[str, str | int], ...] = (("cpu", pool.cpu), ("memory", pool.memory))
    for field, amount in values:
        try:
            quantity = parse_quantity(amount)
        except QuantityError as error:
            fail(f"{where}.{field}", str(error))
        if quantity <= 0:
            fail(f"{where}.{field}", f"expected a quantity > 0, got {amount!r}")
    if pool.pods < 1:
        fail(f"{where}.pods", f"expected an integer >= 1, got {pool.pods}")
    if pool.topology_policy not in POLICIES:
        fail(
            f"{where}.topologyPolicy",
            f"expected one of {', '.join(POLICIES)}, got {pool.topology_policy!r}",
        )
    if pool.numa_nodes is not None and not 1 <= pool.numa_nodes <= MAX_NUMA_NODES:
        fail(
            f"{where}.numaNodes",
            f"expected an integer from 1 to {MAX_NUMA_NODES}, got {pool.numa_nodes}",
        )
    config = _pool_config(pool, where, base, source, fail)
    gpu_resources = [i for i, r in enumerate(config.resources) if r.nvidia is not None]
    if gpu_resources and pool.gpus is None:
        fail(
            f"{where}.gpus",
            f"required: the config serves NVIDIA GPUs (resources[{gpu_resources[0]}].nvidia)",
        )
    if pool.gpus is not None:
        if not gpu_resources:
            fail(f"{where}.gpus", "the config has no 'nvidia' resource to serve them")
        _check_gpus(pool.gpus, f"{where}.gpus", base, fail)
    return Pool(pool, config, nodes, where)


def _pool_config(
    pool: PoolSpec, where: str, base: Path, source: str, fail: Callable[[str, str], NoReturn]
) -> Config:
    if (pool.config is None) == (pool.config_file is None):
        fail(where, "expected one of 'config' (inline) or 'configFile'")
    if pool.config is not None:
        text = yaml.safe_dump(pool.config, sort_keys=False)
        return parse_config(text, f"{source}: {where}.config")
    assert pool.config_file is not None
    path = base / pool.config_file
    try:
        text = inputs.read_text(path, what=str(path))
    except inputs.InputError as error:
        fail(f"{where}.configFile", error.problem)
    return parse_config(text, f"{source}: {where}.configFile: {path}")


def _check_gpus(
    gpus: GpuHostSpec, where: str, base: Path, fail: Callable[[str, str], NoReturn]
) -> None:
    if gpus.description is not None:
        path = base / gpus.description
        if not path.is_file():
            fail(f"{where}.description", f"no such file: {path}")
        gpus.description = str(path)
        return
    if not 1 <= gpus.count <= 64:
        fail(f"{where}.count", f"expected an integer from 1 to 64, got {gpus.count}")
    if not 1 <= gpus.numa_nodes <= MAX_NUMA_NODES:
        fail(
            f"{where}.numaNodes",
            f"expected an integer from 1 to {MAX_NUMA_NODES}, got {gpus.numa_nodes}",
        )
    try:
        gpu_description(gpus)
    except KeyError as error:
        fail(f"{where}.model" if "model" in str(error) else f"{where}.mig", str(error.args[0]))
    except inputs.InputError as error:
        fail(f"{where}.description", str(error))
    except ValueError as error:
        fail(f"{where}.mig", str(error))


def _label_problem(key: str, value: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and not is_dns_subdomain(prefix):
        return f"{key!r}: the prefix must be a DNS subdomain"
    if not is_qualified_name_part(name):
        return f"{key!r}: the name must be 1-63 characters of [A-Za-z0-9-_.]"
    if not is_label_value(value):
        return f"{key}={value!r}: the value must be at most 63 characters of [A-Za-z0-9-_.]"
    return None


def gpu_description(spec: GpuHostSpec) -> dict[str, Any]:
    """The fake NVML description of a pool's GPUs (KeyError for an unknown model or
    MIG profile, ValueError for MIG instances that do not fit the GPU)."""
    from devplug.fakes.gpus import fake_host

    if spec.description is not None:
        text = inputs.read_text(spec.description, what="the GPU description")
        try:
            loaded: dict[str, Any] = json.loads(text)
        except RecursionError:
            raise inputs.InputError(spec.description, "nested too deep to read") from None
        except ValueError as error:
            problem = f"invalid JSON: {' '.join(str(error).split())}"
            raise inputs.InputError(spec.description, problem) from None
        return loaded
    per_numa = -(-spec.count // spec.numa_nodes)
    group: dict[str, Any] = {
        "model": spec.model,
        "count": spec.count,
        "numa": [i // per_numa for i in range(spec.count)],
    }
    if spec.mig:
        group["mig"] = spec.mig
    host = fake_host(yaml.safe_dump({"gpus": [group], "nvlink": spec.nvlink}))
    if spec.name:
        for entry in host["gpus"]:
            entry["name"] = spec.name
    return host
