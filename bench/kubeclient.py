"""The Kubernetes client stacks side by side against one throwaway kube-apiserver: the
CPU each spends per API call on the fleet's call mix, and the memory of a DRA-daemon-like
process that imported it and did one list and one watch.

Candidates (each in a process of its own, one after the other, so that neither the
imports nor the CPU of one is counted for another; a candidate whose package is not
installed is skipped, saying so):

- `official_threads`: the official `kubernetes` client, blocking, calls in a thread
  pool (how the DRA driver and the label watch used it), bodies as dicts and answers
  read as JSON (`_preload_content=False`), the cheapest way through it;
- `official_aio`: `kubernetes.aio`, the official client's asyncio flavour, the same way;
- `kubernetes_asyncio`: the `kubernetes_asyncio` package (aiohttp), the same way;
- `lightkube`: lightkube's `AsyncClient` (httpx) with its typed models, the way it is
  meant to be used;
- `devplug`: devplug's own asyncio client (`devplug.apiserver.client`: aiohttp, bodies
  through msgspec, no generated models).

The mix, per round, is what the fleet does for one pod plus its node's heartbeat: create
the pod, bind it to a node (pods/binding), patch its status, post an Event, get it,
renew the node's Lease (PUT), patch the node's status, delete the pod; every tenth round
lists the pods (one page). A watch on the pods runs all along and decodes every event
(counted as work, not as calls). `WORKERS` rounds run at once.

The daemon-like process: the interpreter with devplug's package imported, then the
client stack imported and set up from the kubeconfig, the ResourceSlices listed and a
watch on them opened and its first event read; its RSS then, and how much of it the
client stack added.

Measured on the development machine (2 cores shared with other work, load average
about 15; kube-apiserver 1.36; 1,620 calls and 800 watch events per candidate; CPU of
the client process only; the interpreter with devplug imported: 24.7 MiB):

| stack              | CPU ms/call | RSS MiB after list+watch | added by the stack |
| ------------------ | ----------- | ------------------------ | ------------------ |
| official_threads   | 2.26        | 77.3                     | 52.6               |
| official_aio       | 3.31        | 90.3                     | 65.6               |
| kubernetes_asyncio | 2.80        | 77.0                     | 52.3               |
| lightkube          | 4.53        | 38.7                     | 14.0               |
| devplug            | 1.20        | 39.2                     | 14.5               |

Decision: devplug's own asyncio client (`devplug.apiserver.client`) is the one stack.
Of the libraries, the official client in threads costs the least CPU (1.9x devplug's)
but adds 38 MiB to every daemon that uses it (all its generated models are imported);
lightkube is as light in memory but costs 3.8x the CPU per call (typed models built
for every answer and watch event; it also fails to read the Status a binding answers);
the asyncio flavours of the generated client are both heavy and slower. The fleet runs
thousands of nodes in one process, where CPU per call is the limit, and the DRA daemon
runs on every node, where memory is: the measured need on both counts says to keep
the client devplug already has (aiohttp, msgspec, devplug's kubeconfig reader and its
failure and retry rules), which no library matches on either.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "default"
ROUNDS = 200
WORKERS = 8
LIST_EVERY = 10
CALLS_PER_ROUND = 8
NODE = "bench-kubeclient-node"
CANDIDATES = ("official_threads", "official_aio", "kubernetes_asyncio", "lightkube", "devplug")
# The package each candidate needs (skipped, saying so, where it is missing).
PACKAGES = {
    "official_threads": "kubernetes",
    "official_aio": "kubernetes.aio",
    "kubernetes_asyncio": "kubernetes_asyncio",
    "lightkube": "lightkube",
    "devplug": "aiohttp",
}
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def bench_kubeclient(root: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """Every candidate against one control plane (skipped where it is absent)."""
    from devplug.testing.controlplane import ControlPlane, how_to_provide

    plane = ControlPlane.find(ROOT)
    if plane is None:
        return {"skipped": how_to_provide(ROOT)}
    kubeconfig = plane.start()
    try:
        asyncio.run(_prepare(kubeconfig))
        report: dict[str, Any] = {"rounds": rounds, "workers": WORKERS}
        report["baseline_rss_mib"] = _child(kubeconfig, "none", rounds)["rss_mib"]
        for name in CANDIDATES:
            report[name] = _child(kubeconfig, name, rounds)
            if "rss_mib" in report[name]:
                added = report[name]["rss_mib"] - report["baseline_rss_mib"]
                report[name]["rss_added_mib"] = round(added, 1)
        return report
    finally:
        plane.stop()


def summary(report: dict[str, Any]) -> str:
    parts = [
        f"{name} {report[name]['cpu_ms_per_call']} ms/call {report[name]['rss_mib']} MiB"
        for name in CANDIDATES
        if "cpu_ms_per_call" in report.get(name, {})
    ]
    return "kube clients: " + ", ".join(parts) if parts else ""


def _child(kubeconfig: str, name: str, rounds: int) -> dict[str, Any]:
    """One candidate in a fresh interpreter: its JSON line, or why it was skipped."""
    command = [sys.executable, __file__, "--child", name, "--kubeconfig", kubeconfig]
    command += ["--rounds", str(rounds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {"failed": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- in the child ------------------------------------------------------------------------


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise KeyError("VmRSS")


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench": "kubeclient"}},
        "spec": {
            "schedulerName": "devplug-bench-none",  # no scheduler binds it but us
            "containers": [{"name": "main", "image": "registry.example/bench:1"}],
        },
    }


def _binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    }


def _pod_status(index: int) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "podIP": f"10.0.{index // 250}.{index % 250 + 1}",
        }
    }


def _event(name: str, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{index}", "namespace": NAMESPACE},
        "involvedObject": {"kind": "Pod", "name": name, "namespace": NAMESPACE},
        "reason": "Started",
        "message": "Started container main",
        "type": "Normal",
        "source": {"component": "kubelet", "host": NODE},
    }


def _node_status(index: int) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": f"Round{index}"}
    return {"status": {"conditions": [ready | {"lastHeartbeatTime": now}]}}


LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def _lease(index: int, version: str = "") -> dict[str, Any]:
    """The Lease of worker `index % WORKERS` (one each: renewals do not conflict)."""
    # Microseconds that are not all zero: a client that reads the string as a time
    # writes it back without them, which a Lease's MicroTime refuses.
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{index % 999_999 + 1:06d}Z"
    metadata = {"name": _lease_name(index), "namespace": "kube-node-lease"}
    if version:
        metadata["resourceVersion"] = version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": now},
    }


def _lease_name(index: int) -> str:
    return f"{NODE}-{index % WORKERS}"


class Stack:
    """What a candidate does, as coroutines over dicts (blocking clients in threads)."""

    async def setup(self, kubeconfig: str) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    async def list_slices(self) -> str:
        """The ResourceSlices listed; the list's resourceVersion."""
        raise NotImplementedError

    async def watch_slices_first(self, version: str) -> None:
        """A watch on the slices from the cache (resourceVersion 0: the slice there is its
        first event), until that event."""
        raise NotImplementedError

    async def round(self, index: int) -> None:
        raise NotImplementedError

    async def list_pods(self) -> str:
        """One page of the pods; the list's resourceVersion."""
        raise NotImplementedError

    async def watch_pods(self, version: str, seen: list[int], expected: int) -> None:
        """Decode the pods' events from `version` until `expected` came."""
        raise NotImplementedError


_prefix = ["bench-kc"]  # the candidate's own: its pods never meet another's


def _paths(index: int) -> tuple[str, str]:
    name = f"{_prefix[0]}-{index}"
    return name, f"/api/v1/namespaces/{NAMESPACE}/pods"


def _slice() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "bench-kubeclient-slice"},
        "spec": {
            "driver": "bench.devplug.io",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


class DevplugStack(Stack):
    """devplug's own asyncio client."""

    async def setup(self, kubeconfig: str) -> None:
        from devplug.apiserver.client import KubeApi
        from devplug.apiserver.kubeconfig import load

        self.api = await KubeApi(load(kubeconfig), concurrency=WORKERS * 2).__aenter__()
        self.leases: dict[str, str] = {}

    async def close(self) -> None:
        await self.api.__aexit__()

    async def list_slices(self) -> str:
        listed = await self.api.call("GET", SLICES)
        return str(listed["metadata"]["resourceVersion"])

    async def watch_slices_first(self, version: str) -> None:
        async for _line in self.api.watch(SLICES, {"resourceVersion": "0"}, 30):
            return

    async def round(self, index: int) -> None:
        from devplug.apiserver.client import MERGE_PATCH, STRATEGIC_PATCH

        call = self.api.call
        name, pods = _paths(index)
        await call("POST", pods, _pod(name))
        await call("POST", f"{pods}/{name}/binding", _binding(name))
        patch = _pod_status(index)
        await call("PATCH", f"{pods}/{name}/status", patch, content_type=STRATEGIC_PATCH)
        await call("POST", f"/api/v1/namespaces/{NAMESPACE}/events", _event(name, index))
        await call("GET", f"{pods}/{name}")
        lease_name = _lease_name(index)
        if lease_name not in self.leases:  # once per worker
            lease = await call("GET", f"{LEASES}/{lease_name}")
            self.leases[lease_name] = lease["metadata"]["resourceVersion"]
        body = _lease(index, self.leases[lease_name])
        lease = await call("PUT", f"{LEASES}/{lease_name}", body)
        self.leases[lease_name] = lease["metadata"]["resourceVersion"]
        patch = _node_status(index)
        await call("PATCH", f"/api/v1/nodes/{NODE}/status", patch, content_type=MERGE_PATCH)
        await call("DELETE", f"{pods}/{name}", {"gracePeriodSeconds": 0})

    async def list_pods(self) -> str:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        listed = await self.api.call("GET", path, params={"limit": "500"})
        return str(listed["metadata"]["resourceVersion"])

    async def watch_pods(self, version: str, seen: list[int], expected: int) -> None:
        import msgspec

        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        async for line in self.api.watch(path, {"resourceVersion": version}, 600):
            msgspec.json.decode(line)
            seen[0] += 1
            if seen[0] >= expected:
                return


class OfficialThreads(Stack):
    """The official blocking client, each call in a thread of a pool."""

    async def setup(self, kubeconfig: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from kubernetes import client

        from devplug.apiserver.kubeconfig import load
        from devplug.testing.official import client_for

        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(WORKERS * 2))
        api = client_for(load(kubeconfig))
        self.core: Any = client.CoreV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.resource: Any = client.ResourceV1Api(api)
        self.leases: dict[str, str] = {}

    async def _json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def blocking() -> Any:
            return json.loads(call(*args, _preload_content=False, **kwargs).data)

        return await asyncio.to_thread(blocking)

    async def list_slices(self) -> str:
        listed = await self._json(self.resource.list_resource_slice)
        return str(listed["metadata"]["resourceVersion"])

    async def watch_slices_first(self, version: str) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        def blocking() -> None:
            answer = self.resource.list_resource_slice(
                watch=True, resource_version="0", timeout_seconds=30, _preload_content=False
            )
            for line in iter_resp_lines(answer):
                json.loads(line)
                break
            answer.close()

        await asyncio.to_thread(blocking)

    async def round(self, index: int) -> None:
        core, name = self.core, _paths(index)[0]
        await self._json(core.create_namespaced_pod, NAMESPACE, _pod(name))
        await self._json(core.create_namespaced_binding, NAMESPACE, _binding(name))
        await self._json(core.patch_namespaced_pod_status, name, NAMESPACE, _pod_status(index))
        await self._json(core.create_namespaced_event, NAMESPACE, _event(name, index))
        await self._json(core.read_namespaced_pod, name, NAMESPACE)
        if _lease_name(index) not in self.leases:  # once per worker
            lease = await self._json(
                self.coordination.read_namespaced_lease, _lease_name(index), "kube-node-lease"
            )
            self.leases[_lease_name(index)] = lease["metadata"]["resourceVersion"]
        lease = _lease(index, self.leases[_lease_name(index)])
        lease = await self._json(
            self.coordination.replace_namespaced_lease,
            _lease_name(index),
            "kube-node-lease",
            lease,
        )
        self.leases[_lease_name(index)] = lease["metadata"]["resourceVersion"]
        await self._json(core.patch_node_status, NODE, _node_status(index))
        await self._json(core.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0)

    async def list_pods(self) -> str:
        listed = await self._json(self.core.list_namespaced_pod, NAMESPACE, limit=500)
        return str(listed["metadata"]["resourceVersion"])

    async def watch_pods(self, version: str, seen: list[int], expected: int) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        def blocking() -> None:
            answer = self.core.list_namespaced_pod(
                NAMESPACE,
                watch=True,
                resource_version=version,
                timeout_seconds=600,
                _preload_content=False,
            )
            for line in iter_resp_lines(answer):
                json.loads(line)
                seen[0] += 1
                if seen[0] >= expected:
                    break
            answer.close()

        await asyncio.to_thread(blocking)


class GeneratedAio(Stack):
    """An asyncio client generated from the OpenAPI spec (`kubernetes.aio` or
    `kubernetes_asyncio`: the same generated interface), answers read as JSON."""

    def __init__(self, package: str) -> None:
        self.package = package

    async def setup(self, kubeconfig: str) -> None:
        import importlib

        client = importlib.import_module(f"{self.package}.client")
        config = importlib.import_module(f"{self.package}.config")
        settings = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=settings)
        settings.connection_pool_maxsize = WORKERS * 2
        self.api = client.ApiClient(settings)
        self.core: Any = client.CoreV1Api(self.api)
        self.coordination: Any = client.CoordinationV1Api(self.api)
        self.resource: Any = client.ResourceV1Api(self.api)
        self.leases: dict[str, str] = {}

    async def close(self) -> None:
        await self.api.close()

    @staticmethod
    async def _json(answer: Awaitable[Any]) -> Any:
        response = await answer
        return json.loads(await _body(response))

    def _raw(self, api: Any, method: str) -> Callable[..., Awaitable[Any]]:
        """`method` of `api` answering the raw response (the newer generator has a
        method of its own for that; the older one takes `_preload_content=False`)."""
        raw = getattr(api, f"{method}_without_preload_content", None)
        if raw is not None:
            return raw  # type: ignore[no-any-return]
        return functools.partial(getattr(api, method), _preload_content=False)

    async def list_slices(self) -> str:
        listed = await self._json(self._raw(self.resource, "list_resource_slice")())
        return str(listed["metadata"]["resourceVersion"])

    async def watch_slices_first(self, version: str) -> None:
        call = self._raw(self.resource, "list_resource_slice")
        response = await call(watch=True, resource_version="0", timeout_seconds=30)
        async for line in _lines(response):
            json.loads(line)
            break
        response.close()

    async def round(self, index: int) -> None:
        core, name = self.core, _paths(index)[0]
        await self._json(self._raw(core, "create_namespaced_pod")(NAMESPACE, _pod(name)))
        bind = self._raw(core, "create_namespaced_binding")
        await self._json(bind(NAMESPACE, _binding(name)))
        status = _pod_status(index)
        await self._json(self._raw(core, "patch_namespaced_pod_status")(name, NAMESPACE, status))
        event = _event(name, index)
        await self._json(self._raw(core, "create_namespaced_event")(NAMESPACE, event))
        await self._json(self._raw(core, "read_namespaced_pod")(name, NAMESPACE))
        lease_name = _lease_name(index)
        if lease_name not in self.leases:  # once per worker
            read = self._raw(self.coordination, "read_namespaced_lease")
            lease = await self._json(read(lease_name, "kube-node-lease"))
            self.leases[lease_name] = lease["metadata"]["resourceVersion"]
        body = _lease(index, self.leases[lease_name])
        replace = self._raw(self.coordination, "replace_namespaced_lease")
        lease = await self._json(replace(lease_name, "kube-node-lease", body))
        self.leases[lease_name] = lease["metadata"]["resourceVersion"]
        await self._json(self._raw(core, "patch_node_status")(NODE, _node_status(index)))
        delete = self._raw(core, "delete_namespaced_pod")
        await self._json(delete(name, NAMESPACE, grace_period_seconds=0))

    async def list_pods(self) -> str:
        listed = await self._json(self._raw(self.core, "list_namespaced_pod")(NAMESPACE, limit=500))
        return str(listed["metadata"]["resourceVersion"])

    async def watch_pods(self, version: str, seen: list[int], expected: int) -> None:
        call = self._raw(self.core, "list_namespaced_pod")
        response = await call(NAMESPACE, watch=True, resource_version=version, timeout_seconds=600)
        async for line in _lines(response):
            json.loads(line)
            seen[0] += 1
            if seen[0] >= expected:
                break
        response.close()


async def _body(response: Any) -> bytes:
    """The body of a raw answer of either generated asyncio client."""
    read = getattr(response, "read", None)
    if read is not None:
        data = read()
        return bytes(await data if asyncio.iscoroutine(data) else data)
    return bytes(response.data)


async def _lines(response: Any) -> Any:
    content = getattr(response, "content", None)
    if content is None:  # a RESTResponse around the aiohttp one
        content = response.response.content
    async for line in content:
        if line.strip():
            yield line


class Lightkube(Stack):
    """lightkube's AsyncClient (httpx), with its typed models."""

    async def setup(self, kubeconfig: str) -> None:
        from lightkube import AsyncClient, KubeConfig

        self.client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager="bench")
        self.leases: dict[str, str] = {}

    async def close(self) -> None:
        await self.client.close()

    async def list_slices(self) -> str:
        from lightkube.resources.resource_v1 import ResourceSlice

        listing = self.client.list(ResourceSlice)
        async for _ in listing:
            pass
        return str(listing.resourceVersion)

    async def watch_slices_first(self, version: str) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        async for _ in self.client.watch(ResourceSlice, resource_version="0"):
            return

    async def round(self, index: int) -> None:
        import msgspec
        from lightkube.resources.coordination_v1 import Lease
        from lightkube.resources.core_v1 import Binding, Event, Node, Pod
        from lightkube.types import PatchType

        client, name = self.client, _paths(index)[0]
        await client.create(Pod.from_dict(_pod(name)))
        # Bound: the server answers a Status, which lightkube reads as a Binding and fails.
        with contextlib.suppress(msgspec.ValidationError):
            await client.create(Binding.from_dict(_binding(name)), namespace=NAMESPACE)
        status = _pod_status(index)
        await client.patch(
            Pod.Status, name, status, namespace=NAMESPACE, patch_type=PatchType.STRATEGIC
        )
        await client.create(Event.from_dict(_event(name, index)))
        await client.get(Pod, name, namespace=NAMESPACE)
        lease_name = _lease_name(index)
        if lease_name not in self.leases:  # once per worker
            current = await client.get(Lease, lease_name, namespace="kube-node-lease")
            self.leases[lease_name] = str(current.metadata.resourceVersion)
        lease = await client.replace(Lease.from_dict(_lease(index, self.leases[lease_name])))
        self.leases[lease_name] = str(lease.metadata.resourceVersion)
        await client.patch(Node.Status, NODE, _node_status(index), patch_type=PatchType.MERGE)
        await client.delete(Pod, name, namespace=NAMESPACE, grace_period=0)

    async def list_pods(self) -> str:
        from lightkube.resources.core_v1 import Pod

        listing = self.client.list(Pod, namespace=NAMESPACE, chunk_size=500)
        async for _ in listing:
            pass
        return str(listing.resourceVersion)

    async def watch_pods(self, version: str, seen: list[int], expected: int) -> None:
        from lightkube.resources.core_v1 import Pod

        async for _ in self.client.watch(Pod, namespace=NAMESPACE, resource_version=version):
            seen[0] += 1
            if seen[0] >= expected:
                return


def _stack(name: str) -> Stack:
    if name == "official_threads":
        return OfficialThreads()
    if name == "official_aio":
        return GeneratedAio("kubernetes.aio")
    if name == "kubernetes_asyncio":
        return GeneratedAio("kubernetes_asyncio")
    if name == "lightkube":
        return Lightkube()
    return DevplugStack()


async def _watch_pods(stack: Stack, version: str, seen: list[int], expected: int) -> None:
    """The pods' watch, started again from `version` after a failure (the watch cache
    of a busy API server behind the list's version answers 504 for a moment)."""
    from devplug.apiserver.backoff import Backoff

    backoff = Backoff(0.1, 1.0)
    for attempt in range(10):
        try:
            await stack.watch_pods(version, seen, expected)
            return
        except Exception:
            if attempt == 9:
                raise
            seen[0] = 0
            await asyncio.sleep(backoff.next())


async def _run_child(name: str, kubeconfig: str, rounds: int) -> dict[str, Any]:
    """Import, set up, list and watch (the daemon-like RSS), then the mix (CPU)."""
    import importlib.util

    import devplug.apiserver.kubeconfig  # noqa: F401  (the floor every stack shares)

    if name == "none":
        return {"rss_mib": _rss_mib()}
    _prefix[0] = f"bench-{name.replace('_', '-')}-{os.getpid()}"
    try:
        found = importlib.util.find_spec(PACKAGES[name]) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return {"skipped": f"{PACKAGES[name]} is not installed"}
    started = time.perf_counter()
    stack = _stack(name)
    await stack.setup(kubeconfig)
    imported_s = time.perf_counter() - started
    await stack.list_slices()
    await stack.watch_slices_first("0")
    result: dict[str, Any] = {
        "setup_s": round(imported_s, 3),
        "rss_mib": _rss_mib(),
    }
    listed = await stack.list_pods()
    expected = 4 * rounds
    seen = [0]
    cpu = _cpu()
    wall = time.perf_counter()
    watch = asyncio.ensure_future(_watch_pods(stack, listed, seen, expected))

    async def worker(first: int) -> None:
        for index in range(first, rounds, WORKERS):
            await stack.round(index)
            if index % LIST_EVERY == LIST_EVERY - 1:
                await stack.list_pods()

    await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    await asyncio.wait_for(watch, 60)
    spent = _cpu() - cpu
    calls = rounds * CALLS_PER_ROUND + rounds // LIST_EVERY
    result |= {
        "calls": calls,
        "watch_events": seen[0],
        "cpu_ms_per_call": round(spent / calls * 1000, 3),
        "calls_per_s": round(calls / (time.perf_counter() - wall)),
        "rss_after_mix_mib": _rss_mib(),
    }
    await stack.close()
    return result


async def _prepare(kubeconfig: str) -> None:
    """The node, the workers' Leases and one ResourceSlice every candidate works on."""
    from devplug.apiserver.client import ApiError, KubeApi

    async with KubeApi.from_kubeconfig(kubeconfig) as api:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        objects = [("/api/v1/nodes", node), (SLICES, _slice())]
        objects += [(LEASES, _lease(index)) for index in range(WORKERS)]
        for path, body in objects:
            try:
                await api.call("POST", path, body)
            except ApiError as error:
                if error.status != 409:
                    raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if args.child:
        try:
            result = asyncio.run(_run_child(args.child, args.kubeconfig, args.rounds))
        except Exception as error:  # a blocked watch thread must not hold the exit
            import traceback

            traceback.print_exc()
            print(f"{args.child}: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        print(json.dumps(result))
        return 0
    with tempfile.TemporaryDirectory(prefix="devplug-bench-") as tmp:
        report = bench_kubeclient(Path(tmp), args.rounds)
    print(json.dumps(report, indent=2))
    print(summary(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
