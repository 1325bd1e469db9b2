"""DRA against a real control plane, and through the real kubelet on the real node.

Control plane (etcd + kube-apiserver + kube-scheduler): the daemon's start until its
slices are published; NodePrepareResources for one claim at a time and for 10 claims
at once (each read from the API server, a CDI spec written, the checkpoint saved),
then the same claims again (answered from the checkpoint); the same claims with device
metadata for containers written (KEP-5304) and without, side by side; 1,000 claims prepared on
one node (latency as the node fills, and the daemon's RSS then); unprepare; a device
turning unhealthy until its taint is in the API; a slice deleted by someone else
until it is back; a hot-plugged device node until the slice lists it.

Real node (node.sh: the real kubelet v1.36.2, in bench/realnode.py's session, key
`real_node.dra`): the kubelet's start (SIGTERM and SIGKILL) until the DRA slices it
wipes are back, and NodePrepareResources as the kubelet measures it (its
dra_grpc_operations_duration_seconds histogram).

Each part is skipped (with the reason) where its binaries are absent.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import yaml
from common import percentiles, rss_mib, serve_command
from dra_shapes import bench_shapes

from devplug.api.dra.v1 import api_pb2 as dra
from devplug.api.dra.v1 import api_pb2_grpc as dra_grpc
from devplug.config.ids import cap_id, path_device_id
from devplug.framework.dra.slices import slice_name
from devplug.ground.channel import FAST_RECONNECT
from devplug.kube.dranames import device_name
from devplug.testing.controlplane import ControlPlane, how_to_provide, watch_until

ROOT = Path(__file__).resolve().parent.parent
DRIVER = "bench.devplug.io"
MANY_DRIVER = "many.devplug.io"
# Two drivers alike but for dra.deviceMetadata (off, on).
METADATA_DRIVERS = ("meta-off.devplug.io", "meta-on.devplug.io")
NODE = "bench-node"
CLAIMS = 50  # one at a time
CONCURRENT = 10  # in flight, over another CLAIMS claims
# A device of its own per claim (prepare refuses a device already prepared for another
# claim), all in one slice (at most 128 devices), room left for the hot-plugged ones.
DEVICES = 2 * CLAIMS
MANY = 1000
ROUNDS = 5


def bench_dra(root: Path) -> dict[str, Any]:
    plane = ControlPlane.find(ROOT)
    if plane is None:
        return {"skipped": how_to_provide(ROOT)}
    started = time.monotonic()
    kubeconfig = plane.start()
    report: dict[str, Any] = {"control_plane_start_s": round(time.monotonic() - started, 2)}
    try:
        report.update(_bench(root / "dra", kubeconfig))
        report["shapes"] = bench_shapes(root / "dra-shapes", kubeconfig)
    finally:
        plane.stop()
    return report


class Bench:
    """The daemon on the control plane and what the benchmarks need of the API."""

    def __init__(self, root: Path, kubeconfig: str) -> None:
        from kubernetes import client

        from devplug.testing.official import api_client

        self.root = root
        self.kubeconfig = kubeconfig
        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.namespace = f"bench-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": self.namespace}})

    def serve(self, config: Path, name: str) -> subprocess.Popen[bytes]:
        folder = self.root / name
        folders = {"--registry-dir": "reg", "--dra-socket-dir": "pl", "--cdi-dir": "cdi"}
        args = [item for flag, sub in folders.items() for item in (flag, str(folder / sub))]
        args += ["--node-name", NODE, "--kubeconfig", self.kubeconfig]
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "serve.log").open("wb") as log:  # kept beside the run, for a failure
            return subprocess.Popen(
                serve_command(config, folder / "dp", *args, log_level=None),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def wait_slices(self, driver: str, test: Any, timeout: float = 60) -> dict[str, Any]:
        return watch_until(
            self.api,
            self.resource.list_resource_slice,
            lambda s: s["spec"]["driver"] == driver and test(s),
            timeout,
        )

    def devices(self, driver: str) -> list[str]:
        answer = self.resource.list_resource_slice(
            field_selector=f"spec.driver={driver}", _preload_content=False
        )
        return [d["name"] for s in json.loads(answer.data)["items"] for d in s["spec"]["devices"]]

    def allocated_claims(self, driver: str, devices: list[str], count: int) -> list[dra.Claim]:
        """`count` claims as the scheduler leaves them, each on a device of its own."""
        assert count <= len(devices), f"{count} claims on {len(devices)} devices"
        claims = []
        for i in range(count):
            name = f"{driver.partition('.')[0]}-{i}"
            body = {
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [{"name": "acc", "exactly": {"deviceClassName": driver}}]
                    }
                },
            }
            claim = self.resource.create_namespaced_resource_claim(self.namespace, body)
            result = {
                "request": "acc",
                "driver": driver,
                "pool": NODE,
                "device": devices[i],
            }
            self.resource.patch_namespaced_resource_claim_status(
                name,
                self.namespace,
                {"status": {"allocation": {"devices": {"results": [result]}}}},
            )
            claims.append(dra.Claim(namespace=self.namespace, name=name, uid=claim.metadata.uid))
        return claims


def dra_stub(socket: Path) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT)
    stub = dra_grpc.DRAPluginStub(channel)
    stub.NodePrepareResources(dra.NodePrepareResourcesRequest(), wait_for_ready=True, timeout=30)
    return channel, stub


def prepare(stub: Any, claim: dra.Claim) -> float:
    begin = time.perf_counter()
    answer = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[claim]), timeout=30)
    if answer.claims[claim.uid].error:
        raise RuntimeError(answer.claims[claim.uid].error)
    return time.perf_counter() - begin


def unprepare(stub: Any, claim: dra.Claim) -> float:
    begin = time.perf_counter()
    stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[claim]), timeout=30)
    return time.perf_counter() - begin


def config_file(root: Path, driver: str, resource: dict[str, Any]) -> Path:
    """A config serving `resource` as `<driver>/acc` through DRA under `driver`."""
    path = root / f"{driver}.yaml"
    root.mkdir(parents=True, exist_ok=True)
    entry = {"name": f"{driver}/acc", "mode": "dra", **resource}
    entry["dra"] = {"driver": driver, **entry.get("dra", {})}
    path.write_text(yaml.safe_dump({"resources": [entry]}))
    return path


def _bench(root: Path, kubeconfig: str) -> dict[str, Any]:
    bench = Bench(root, kubeconfig)
    bench.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    dev = root / "dev"
    dev.mkdir(parents=True)
    for i in range(DEVICES):
        os.mknod(dev / f"acc{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    config = config_file(
        root,
        DRIVER,
        {
            "allowAnyPath": True,
            "dra": {"attributes": {"model": "bench"}},
            "groups": [{"paths": [{"path": f"{dev}/acc*"}]}],
        },
    )
    report: dict[str, Any] = {}
    started = time.monotonic()
    proc = bench.serve(config, "main")
    try:
        bench.wait_slices(DRIVER, lambda s: len(s["spec"].get("devices") or []) >= DEVICES)
        report["start_to_slices_published_ms"] = round((time.monotonic() - started) * 1000, 1)
        report["rss_mib"] = rss_mib(proc.pid)
        names = bench.devices(DRIVER)
        claims = bench.allocated_claims(DRIVER, names, 2 * CLAIMS)
        one, many = claims[:CLAIMS], claims[CLAIMS:]
        channel, stub = dra_stub(root / "main" / "pl" / DRIVER / "dra.sock")
        with channel:
            report["prepare_1"] = percentiles([prepare(stub, c) for c in one])
            with ThreadPoolExecutor(CONCURRENT) as pool:
                report[f"prepare_{CONCURRENT}_concurrent"] = percentiles(
                    list(pool.map(lambda c: prepare(stub, c), many))
                )
            report["prepare_again"] = percentiles([prepare(stub, c) for c in one])
            report["unprepare"] = percentiles([unprepare(stub, c) for c in claims])
        report["health_to_taint"] = _health_to_taint(bench, dev)
        report["slice_deleted_to_restored"] = _restore(bench)
        report["hotplug_to_slice"] = _hotplug(bench, dev, len(names))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    report["device_metadata"] = _metadata(bench, root)
    report[f"claims_{MANY}"] = _many(bench, root)
    bench.api.close()
    return report


def _health_to_taint(bench: Bench, dev: Path) -> dict[str, float]:
    """A device node removed (the device Unhealthy) until the API shows its taint, and
    back until the taint is gone."""
    samples = []
    for i in range(ROUNDS):
        node = dev / f"acc{i}"

        # A glob match is published under a name made of its path, by devplug's rules.
        published = device_name(cap_id(path_device_id(str(node))))

        def tainted(s: dict[str, Any], name: str = published, want: bool = True) -> bool:
            found = [d for d in s["spec"].get("devices") or [] if d["name"] == name]
            return len(found) == 1 and ("taints" in found[0]) == want

        begin = time.perf_counter()
        node.unlink()
        bench.wait_slices(DRIVER, tainted)
        samples.append(time.perf_counter() - begin)
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        bench.wait_slices(DRIVER, lambda s, name=published: tainted(s, name, want=False))
    return percentiles(samples)


def _restore(bench: Bench) -> dict[str, float]:
    """A slice deleted by someone else (as the kubelet's start-up wipe does) until the
    publisher has created it again."""
    # The pool's first slice: others may still be going (a taint splits a pool in two).
    name = slice_name(NODE, DRIVER, 0)
    samples = []
    for _ in range(ROUNDS):
        current = bench.wait_slices(DRIVER, lambda s: s["metadata"]["name"] == name)
        uid = current["metadata"]["uid"]
        begin = time.perf_counter()
        bench.resource.delete_resource_slice(name)
        bench.wait_slices(
            DRIVER, lambda s, old=uid: s["metadata"]["name"] == name and s["metadata"]["uid"] != old
        )
        samples.append(time.perf_counter() - begin)
    return percentiles(samples)


def _hotplug(bench: Bench, dev: Path, known: int) -> dict[str, float]:
    samples = []
    for i in range(ROUNDS):
        begin = time.perf_counter()
        os.mknod(dev / f"acc-hot{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        want = known + i + 1
        bench.wait_slices(DRIVER, lambda s, n=want: len(s["spec"].get("devices") or []) >= n)
        samples.append(time.perf_counter() - begin)
    return percentiles(samples)


def _metadata(bench: Bench, root: Path) -> dict[str, Any]:
    """NodePrepareResources of CLAIMS claims with `dra.deviceMetadata` off and on: two
    daemons alike but for it, their claims prepared in turn (off, on, off...), so that
    both meet the same machine; the difference of the medians is what it adds."""
    procs, stubs, channels, claims = [], [], [], []
    try:
        for driver, on in zip(METADATA_DRIVERS, (False, True), strict=True):
            config = config_file(root, driver, {"virtual": CLAIMS, "dra": {"deviceMetadata": on}})
            procs.append(bench.serve(config, driver.partition(".")[0]))
        for driver in METADATA_DRIVERS:
            bench.wait_slices(driver, lambda s: len(s["spec"].get("devices") or []) >= CLAIMS)
            claims.append(bench.allocated_claims(driver, bench.devices(driver), CLAIMS))
            channel, stub = dra_stub(root / driver.partition(".")[0] / "pl" / driver / "dra.sock")
            channels.append(channel)
            stubs.append(stub)
        samples: list[list[float]] = [[], []]
        for i in range(CLAIMS):
            for side in (0, 1):
                samples[side].append(prepare(stubs[side], claims[side][i]))
        off, on = percentiles(samples[0]), percentiles(samples[1])
        return {
            "off": off,
            "on": on,
            "added_p50_ms": round(on["p50_ms"] - off["p50_ms"], 3),
            # What prepare does more, alone (the files of one claim and request, in a
            # folder of the same disk): the difference above is within the noise of
            # the API read and the CDI spec's fsync on a busy machine.
            "write_alone": _metadata_write(root / "metadata-alone"),
        }
    finally:
        for channel in channels:
            channel.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)


def _metadata_write(folder: Path, count: int = 200) -> dict[str, float]:
    from devplug.framework.dra import metadata

    attributes = {"model": {"string": "bench"}, "numaNode": {"int": 0}}
    device = {"pool": NODE, "name": "acc0", "attributes": attributes}
    samples = []
    for i in range(count):
        claim = {"metadata": {"name": f"claim-{i}", "namespace": "bench", "uid": f"uid-{i}"}}
        started = time.perf_counter()
        metadata.write(folder, METADATA_DRIVERS[1], claim, [("acc", device)])
        samples.append(time.perf_counter() - started)
    return percentiles(samples)


def _many(bench: Bench, root: Path) -> dict[str, Any]:
    """1,000 claims prepared on one node (1,000 virtual devices): the latency of the
    first and the last hundred, and the daemon's RSS once all are prepared."""
    config = config_file(root, MANY_DRIVER, {"virtual": MANY})
    proc = bench.serve(config, "many")
    try:
        bench.wait_slices(MANY_DRIVER, lambda s: bool(s["spec"].get("devices")))
        deadline = time.monotonic() + 60
        names: list[str] = []
        while len(names) < MANY and time.monotonic() < deadline:  # several slices: all of them
            names = bench.devices(MANY_DRIVER)
            if len(names) < MANY:
                threading.Event().wait(0.2)
        claims = bench.allocated_claims(MANY_DRIVER, names, MANY)
        rss_before = rss_mib(proc.pid)
        channel, stub = dra_stub(root / "many" / "pl" / MANY_DRIVER / "dra.sock")
        with channel:
            samples = [prepare(stub, c) for c in claims]
        return {
            "first_100": percentiles(samples[:100]),
            "last_100": percentiles(samples[-100:]),
            "rss_before_mib": rss_before,
            "rss_prepared_mib": rss_mib(proc.pid),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


# -- the real node ------------------------------------------------------------------


REAL_RESOURCE = "devplug.io/benchdra"
REAL_DRIVER = "benchdra.devplug.io"
RESTARTS = 3


def bench_dra_on_node(node: Any, root: Path) -> dict[str, Any]:
    """On the real node (started by bench/realnode.py): devplug as a host process of the
    node serving a DRA driver; the kubelet restarted by SIGTERM and SIGKILL until the
    slices it wipes are back; pods whose claims the kubelet prepares, timed by it."""
    from kubernetes import client

    from devplug.framework.dra.classes import device_class
    from devplug.testing.realnode import pod_ready

    resource = client.ResourceV1Api(node.api)
    root.mkdir(parents=True, exist_ok=True)
    config = root / "real.yaml"
    config.write_text(
        yaml.safe_dump({"resources": [{"name": REAL_RESOURCE, "mode": "dra", "virtual": 4}]})
    )
    resource.create_device_class(device_class(REAL_DRIVER, REAL_RESOURCE))
    command = [
        *(sys.executable, "-m", "devplug.cli.main", "serve", "--config", str(config)),
        *("--kubeconfig", str(node.kubeconfig), "--node-name", node.node_name),
        *("--plugin-dir", str(root / "dp")),  # no device plugin: kept off the kubelet's
        # The DRA folders follow --plugin-dir unless named: the kubelet's own.
        *("--registry-dir", "/var/lib/kubelet/plugins_registry"),
        *("--dra-socket-dir", "/var/lib/kubelet/plugins"),
    ]
    proc = node.popen(*command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ours(test: Any) -> dict[str, Any]:
        found: dict[str, Any] = watch_until(
            node.api,
            resource.list_resource_slice,
            lambda s: s["spec"]["driver"] == REAL_DRIVER and test(s),
            60,
        )
        return found

    report: dict[str, Any] = {}
    try:
        current = ours(lambda s: len(s["spec"].get("devices") or []) == 4)
        for kill in (False, True):
            samples = []
            for _ in range(RESTARTS):
                old = current["metadata"]["uid"]
                start = node.restart_kubelet(kill=kill)
                current = ours(lambda s, uid=old: s["metadata"]["uid"] != uid)
                samples.append(time.time() - start.started)
            key = "sigkill" if kill else "sigterm"
            report[f"kubelet_start_to_slices_back_{key}"] = percentiles(samples)
        with node.namespace("bench") as ns:
            for i in range(10):
                pod = node.busybox_pod(f"p{i}", {REAL_RESOURCE: 1}, namespace=ns)
                node.create(pod)
                node.wait_pod(ns, f"p{i}", pod_ready)
                node.kubectl("delete", "pod", "-n", ns, f"p{i}", "--wait=true")
            report["kubelet_node_prepare"] = _kubelet_histogram(node, "NodePrepareResources")
            report["kubelet_node_unprepare"] = _kubelet_histogram(node, "NodeUnprepareResources")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        resource.delete_device_class(REAL_DRIVER)
        for item in json.loads(
            resource.list_resource_slice(
                field_selector=f"spec.driver={REAL_DRIVER}", _preload_content=False
            ).data
        )["items"]:
            resource.delete_resource_slice(item["metadata"]["name"])
    return report


def _kubelet_histogram(node: Any, method: str) -> dict[str, Any]:
    """The kubelet's own timing of the driver's gRPC `method` that succeeded
    (dra_grpc_operations_duration_seconds), read from its metrics through the API
    server: the count and the mean (its buckets start at 0.1 s: too coarse for more)."""
    text = node.kubectl(
        "get", "--raw", f"/api/v1/nodes/{node.node_name}/proxy/metrics", timeout=30
    ).stdout
    total = count = 0.0
    for line in text.splitlines():
        if not line.startswith("dra_grpc_operations_duration_seconds_"):
            continue
        if method not in line or REAL_DRIVER not in line:
            continue
        if "grpc_status_code=" in line and 'grpc_status_code="OK"' not in line:
            continue  # a failed call
        name, _, value = line.rpartition(" ")
        if name.startswith("dra_grpc_operations_duration_seconds_sum"):
            total += float(value)
        elif name.startswith("dra_grpc_operations_duration_seconds_count"):
            count += float(value)
    if not count:
        return {"skipped": f"the kubelet reported no {method} of {REAL_DRIVER}"}
    return {"n": int(count), "mean_ms": round(total / count * 1000, 3)}
