"""The shipped image and manifests on a real node (real kubelet v1.36.2, containerd 2.3
with CDI, runc): `kubectl apply -k` of deploy/, deploy/dra/ and deploy/overlays/gpu/,
pods that get devices, kubelet restarts, the plugin pod replaced, and real host devices
reaching containers. What is asserted is what a user would check, from inside the
container where it matters.

Skipped, saying what to provide, where the node cannot run (see tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from node_helpers import (
    DEFAULT_RESOURCES,
    DEPLOY,
    NAMESPACE,
    PodLog,
    daemon_pods,
    deployed,
    overlay,
)

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.ground.unixserver import SocketIdentity, socket_identity
from devplug.simulator import checkpoint
from devplug.testing.controlplane import watch_until
from devplug.testing.realnode import (
    DIAL_FAILED,
    RealNode,
    capacity,
    unschedulable,
)

ROOT = Path(__file__).resolve().parents[2]
METRICS_PORT = 9477  # the DaemonSet's --metrics-port, on the host's network
NULL = "devplug.io/null"
DEFAULTS = list(DEFAULT_RESOURCES)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def in_pod(node: RealNode, ns: str, pod: str, script: str) -> subprocess.CompletedProcess[str]:
    return node.kubectl("exec", "-n", ns, pod, "--", "sh", "-c", script, check=False)


def env_of(node: RealNode, ns: str, pod: str) -> dict[str, str]:
    out = node.kubectl("exec", "-n", ns, pod, "--", "env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def http_get(path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}{path}", timeout=10) as reply:
        return reply.status, reply.read().decode()


def run_pod(
    node: RealNode, ns: str, name: str, resources: dict[str, int], ready: bool = True
) -> dict[str, Any]:
    node.create(node.busybox_pod(name, resources, namespace=ns))
    return node.wait_pod(ns, name) if ready else {}


def kubelet_started_and_registered(
    node: RealNode, kill: bool, resources: list[str], between: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Restart the kubelet and wait until it has dialled back every resource; the
    start, and the times measured (registered, allocatable back, both after start)."""
    with node.node_history() as history:
        start = node.restart_kubelet(kill=kill, between=between)
        registered = node.wait_connected(resources, start)
        back, dropped = history.allocatable_back(DEFAULT_RESOURCES, start.started, registered)
    return start, {
        "registered_s": round(registered - start.started, 3),
        "allocatable_back_s": round(back - start.started, 3),
        "dropped": dropped,
    }


def once_each(node: RealNode, start: Any, resources: list[str]) -> None:
    """Each resource asked to register exactly once by this kubelet start, and the
    kubelet dialled each back (none left dialling a missing socket)."""
    requests = {r: len(t) for r, t in node.registrations(start).items() if r in resources}
    assert requests == dict.fromkeys(resources, 1)
    assert {r: len(t) for r, t in node.connected(start).items() if r in resources} == requests
    assert not [line for line in node.kubelet_lines(start) if DIAL_FAILED in line]


@pytest.fixture(scope="class")
def daemon(real_node: RealNode, real_node_image: str) -> Iterator[str]:
    """`kubectl apply -k deploy/` as shipped: nothing in it needs changing here."""
    with deployed(real_node, DEPLOY) as pod:
        yield pod


class TestDeploy:
    """deploy/ on the node, for the tests of this class."""

    def test_serves_the_default_resources_to_a_pod(self, real_node: RealNode, daemon: str) -> None:
        real_node.wait_node(
            lambda n: all(capacity(n, r) == c for r, c in DEFAULT_RESOURCES.items())
        )
        with real_node.namespace("use") as ns:
            run_pod(real_node, ns, "user", {NULL: 1, "devplug.io/zero": 1})
            env = env_of(real_node, ns, "user")
            assert re.fullmatch(r"null::[0-3]", env["DEVPLUG_DEVPLUG_IO_NULL"])
            assert env["DEVPLUG_DEVPLUG_IO_ZERO"] == "zero"
            assert env["DEVPLUG_ZERO_NOTE"] == "zero and full as one device"
            # /dev/full came read-only (permissions: r): any container may write the
            # runtime's default /dev/full, this one may not.
            write = in_pod(real_node, ns, "user", "echo x > /dev/full")
            assert write.returncode != 0
            assert "Operation not permitted" in write.stderr
            assert in_pod(real_node, ns, "user", "head -c 4 /dev/zero | wc -c").stdout == "4\n"
            os_release = in_pod(real_node, ns, "user", "cat /run/devplug/host-os-release")
            assert os_release.stdout == Path("/etc/os-release").read_text()
            # devplug.io/zero's CDI name resolved: containerd refuses a name without a spec.
            assert Path("/var/run/cdi/devplug-devplug.io_zero.json").is_file()

            status = real_node.kubectl(
                "exec", "-n", NAMESPACE, "ds/devplug", "--", "devplug", "status"
            ).stdout
            held = [line.split() for line in status.splitlines() if f"{ns}/user/main" in line]
            assert sorted(row[0] for row in held) == sorted(
                [env["DEVPLUG_DEVPLUG_IO_NULL"], "zero"]
            )
            code, metrics = http_get("/metrics")
            assert code == 200
            assert f'devplug_allocations_total{{resource="{NULL}"}} 1.0' in metrics
            assert http_get("/readyz") == (200, "ok\n")

    @pytest.mark.parametrize("kill", [False, True], ids=["SIGTERM", "SIGKILL"])
    def test_kubelet_restarts_keep_held_devices_and_register_once(
        self, real_node: RealNode, daemon: str, kill: bool
    ) -> None:
        with real_node.namespace("restart") as ns:
            run_pod(real_node, ns, "held", {NULL: 1})
            held = env_of(real_node, ns, "held")["DEVPLUG_DEVPLUG_IO_NULL"]
            start, times = kubelet_started_and_registered(real_node, kill, DEFAULTS)
            once_each(real_node, start, DEFAULTS)
            print(f"kubelet {'SIGKILL' if kill else 'SIGTERM'}: {times}")
            # The held pod keeps its container and its device.
            pod = real_node.wait_pod(ns, "held")
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
            # A new pod gets a free device, not the held one.
            run_pod(real_node, ns, "fresh", {NULL: 1})
            fresh = env_of(real_node, ns, "fresh")["DEVPLUG_DEVPLUG_IO_NULL"]
            assert fresh != held
            # Two of four are held: three more stay Pending, by the scheduler's count.
            run_pod(real_node, ns, "over", {NULL: 3}, ready=False)
            pending = real_node.wait_pod(ns, "over", lambda p: unschedulable(p) is not None)
            assert f"Insufficient {NULL}" in str(unschedulable(pending))

    def test_the_start_up_wipe_right_after_a_re_serve_costs_nothing(
        self, real_node: RealNode, daemon: str
    ) -> None:
        """The race of a real restart, forced: the old kubelet is killed (its
        kubelet.sock stays), devplug's sockets are removed and served again, and only
        then does the new kubelet start and wipe them. devplug must neither register
        through the dead kubelet.sock into the new one, nor register before its socket
        is back: exactly one registration per resource, each dialled back at once."""
        folder = real_node.plugin_dir
        ours = sorted(p.name for p in folder.glob("devplug-*.sock"))
        assert len(ours) == len(DEFAULTS)
        re_served: dict[str, SocketIdentity | None] = {}

        def remove_and_wait_for_the_re_serve() -> None:
            with _created_watch(folder) as wait:
                for name in ours:
                    (folder / name).unlink()
                wait(lambda: all((folder / n).exists() for n in ours))
            re_served.update({n: socket_identity(folder / n) for n in ours})

        start, times = kubelet_started_and_registered(
            real_node, True, DEFAULTS, between=remove_and_wait_for_the_re_serve
        )
        once_each(real_node, start, DEFAULTS)
        # The wipe did land after the re-serve: each re-served socket was replaced.
        assert all(socket_identity(folder / n) != re_served[n] for n in ours)
        print(f"wipe after re-serve: {times}")

    def test_a_deleted_plugin_pod_is_replaced_and_registers(
        self, real_node: RealNode, daemon: str
    ) -> None:
        [old] = daemon_pods(real_node)
        offset = real_node.log_offset()
        with real_node.node_history() as history:
            deleted = time.time()
            real_node.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"])
            new = _new_daemon_pod(real_node, old["metadata"]["name"])
            registered = real_node.wait_connected(DEFAULTS, offset)
            back, dropped = history.allocatable_back(DEFAULT_RESOURCES, deleted, registered)
        assert new["status"]["phase"] == "Running"
        print(
            f"plugin pod deleted: registered {registered - deleted:.2f} s, allocatable back "
            f"{back - deleted:.2f} s (dropped in the API: {dropped})"
        )


class _created_watch:
    """inotify on `folder` for new entries; `wait(condition)` blocks until it holds."""

    def __init__(self, folder: Path) -> None:
        from asyncinotify import Inotify, Mask

        self._inotify = Inotify()
        self._inotify.add_watch(folder, Mask.CREATE | Mask.MOVED_TO)

    def __enter__(self) -> Any:
        def wait(condition: Any, timeout: float = 30.0) -> None:
            deadline = time.monotonic() + timeout
            while not condition():
                left = deadline - time.monotonic()
                assert left > 0, "devplug did not serve its sockets again"
                if select.select([self._inotify.fd], [], [], left)[0]:
                    os.read(self._inotify.fd, 65536)

        return wait

    def __exit__(self, *_: object) -> None:
        self._inotify.close()


def _new_daemon_pod(node: RealNode, old: str) -> dict[str, Any]:
    from kubernetes import client

    from devplug.testing.realnode import pod_ready

    return watch_until(
        node.api,
        client.CoreV1Api(node.api).list_namespaced_pod,
        lambda p: p["metadata"]["name"] != old and pod_ready(p),
        60,
        namespace=NAMESPACE,
        label_selector="app.kubernetes.io/name=devplug",
    )


def test_deploy_dra_starts_and_publishes_through_the_api(
    real_node: RealNode, real_node_image: str, tmp_path: Path
) -> None:
    """deploy/dra: the image has the Kubernetes client, the pod reaches the API server
    (the overlay's address), and serves its devices through DRA: a pod asking
    `devplug.io/null: 1` by count, with no claim, gets /dev/null through the shipped
    DeviceClass (the scheduler's claim, prepared by devplug, whose status devplug writes
    with the shipped RBAC and its pod's token)."""
    import json

    from kubernetes import client

    from tests.serve_helpers import wait_for_gone

    resource = client.ResourceV1Api(real_node.api)
    with deployed(real_node, overlay(tmp_path / "dra", "dra", real_node)) as pod:
        # deploy/dra's config: /dev/null once, eight fake devices, through DRA only.
        for driver, count in (("fake.devplug.io", 8), ("null.devplug.io", 1)):
            found = watch_until(
                real_node.api,
                resource.list_resource_slice,
                lambda s, d=driver, n=count: (
                    s["spec"]["driver"] == d and len(s["spec"].get("devices") or []) == n
                ),
                60,
                field_selector=f"spec.nodeName={real_node.node_name}",
            )
            assert found["spec"]["pool"]["name"] == real_node.node_name
        log = real_node.kubectl("logs", "-n", NAMESPACE, pod).stdout
        assert "No module named" not in log

        with real_node.namespace("count") as ns:
            counted = run_pod(real_node, ns, "counted", {NULL: 1})
            made = counted["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
            assert made.startswith("counted-extended-resources-")
            assert env_of(real_node, ns, "counted")["DEVPLUG_DEVPLUG_IO_NULL"] == "null"
            claim = json.loads(
                resource.read_namespaced_resource_claim(made, ns, _preload_content=False).data
            )
            [result] = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["device"]) == ("null.devplug.io", "null")
            spec = Path(f"/var/run/cdi/null.devplug.io-{claim['metadata']['uid']}.json")
            assert spec.exists()
            status = watch_until(
                real_node.api,
                resource.list_namespaced_resource_claim,
                lambda c: c["metadata"]["name"] == made and bool(c["status"].get("devices")),
                60,
                namespace=ns,
            )
            [entry] = status["status"]["devices"]
            assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")]
            client.CoreV1Api(real_node.api).delete_namespaced_pod(
                "counted", ns, grace_period_seconds=0
            )
            wait_for_gone(spec, timeout=60)
    # The kubelet removes a gone driver's slices only after a grace period: leave the
    # node as it was for the next test.
    real_node.kubectl(
        *("delete", "resourceslices", "-l", "app.kubernetes.io/managed-by=devplug"),
        f"--field-selector=spec.nodeName={real_node.node_name}",
    )


def test_the_gpu_overlay_on_a_node_without_gpus_serves_none(
    real_node: RealNode, real_node_image: str
) -> None:
    """deploy/overlays/gpu as shipped, on a node labelled as node-feature-discovery
    labels GPU nodes: Ready, nvidia.com/gpu registered with no device."""
    label = "feature.node.kubernetes.io/pci-10de.present"
    real_node.kubectl("label", "node", real_node.node_name, f"{label}=true", "--overwrite")
    try:
        with deployed(real_node, DEPLOY / "overlays" / "gpu", "devplug-gpu") as pod:
            real_node.wait_node(lambda n: "nvidia.com/gpu" in (n["status"].get("capacity") or {}))
            assert capacity(real_node.node(), "nvidia.com/gpu") == 0
            assert "NVML is not usable" in real_node.kubectl("logs", "-n", NAMESPACE, pod).stdout
    finally:
        real_node.kubectl("label", "node", real_node.node_name, f"{label}-")


CONFIG_LABEL = "nvidia.com/device-plugin.config"
GPU_NODES = "feature.node.kubernetes.io/pci-10de.present"


def test_the_per_node_gpu_overlay_follows_the_node_label_in_place(
    real_node: RealNode, real_node_image: str, tmp_path: Path
) -> None:
    """deploy/overlays/gpu-per-node on a GPU-labelled node without GPUs, through its own
    RBAC and token: Ready with the default config; the node label switches the running
    pod to the config it names (time-sliced: nvidia.com/gpu.shared registered), a label
    naming no config is refused in one line while the old config keeps serving, and
    removing the label brings the default back; the pod never restarts."""
    node = real_node.node_name
    real_node.kubectl("label", "node", node, f"{GPU_NODES}=true", "--overwrite")
    folder = overlay(tmp_path / "per-node", "overlays/gpu-per-node", real_node)
    try:
        with (
            deployed(real_node, folder, "devplug-gpu") as pod,
            PodLog(real_node, pod) as log,
        ):
            assert "the default" in log.says("NVIDIA config 'default' (/available-configs/default)")
            _only_its_own_node_readable(real_node)

            offset = real_node.log_offset()
            real_node.kubectl("label", "node", node, f"{CONFIG_LABEL}=time-sliced")
            chosen = log.wait(lambda e: e.get("nvidia_config") == "time-sliced")
            assert chosen["msg"] == (
                "NVIDIA config 'time-sliced' (/available-configs/time-sliced): "
                f"named by the node label {CONFIG_LABEL}"
            )
            assert "added nvidia.com/gpu.shared, removed nvidia.com/gpu" in log.says(
                "config reloaded"
            )
            real_node.wait_connected(["nvidia.com/gpu.shared"], offset)
            real_node.wait_node(lambda n: "nvidia.com/gpu.shared" in n["status"]["capacity"])

            real_node.kubectl(
                "label", "node", node, f"{CONFIG_LABEL}=no-such-config", "--overwrite"
            )
            refused = log.says("config reload refused")
            assert refused == (
                "config reload refused, the previous config keeps serving: "
                "/etc/devplug/config.yaml: resources[0].nvidia.nvidiaConfig: "
                f"{CONFIG_LABEL}='no-such-config': the node label names config "
                "'no-such-config', which does not exist"
            )
            metrics = http_get("/metrics")[1]
            assert 'devplug_config_reloads_total{result="refused"} 1.0' in metrics
            assert 'devplug_registered{resource="nvidia.com/gpu.shared"} 1.0' in metrics
            assert http_get("/readyz") == (200, "ok\n")

            offset = real_node.log_offset()
            real_node.kubectl("label", "node", node, f"{CONFIG_LABEL}-")
            assert "the default" in log.says("NVIDIA config 'default'")
            assert "added nvidia.com/gpu, removed nvidia.com/gpu.shared" in log.says(
                "config reloaded"
            )
            real_node.wait_connected(["nvidia.com/gpu"], offset)
            assert 'devplug_registered{resource="nvidia.com/gpu"} 1.0' in http_get("/metrics")[1]

            # One pod all along, its label watch never refused by the API server.
            [running] = daemon_pods(real_node, "devplug-gpu")
            assert running["metadata"]["name"] == pod
            assert running["status"]["containerStatuses"][0]["restartCount"] == 0
            assert not [e for e in log.lines if "watching its labels failed" in e.get("msg", "")]
            print(f"per-node GPU pod: {_rss(real_node, pod)}")
    finally:
        real_node.kubectl("label", "node", node, f"{GPU_NODES}-", f"{CONFIG_LABEL}-")


def _only_its_own_node_readable(node: RealNode) -> None:
    """The overlay's RBAC, as the API server decides for the pod's service account:
    Nodes read and watched, nothing written, nothing else read."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(node.api)
    user = f"system:serviceaccount:{NAMESPACE}:devplug-gpu"

    def allowed(resource: str, verb: str, subresource: str = "") -> bool:
        attributes = {"resource": resource, "verb": verb, "subresource": subresource}
        review = authz.create_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": user, "resourceAttributes": attributes},
            }
        )
        return bool(review.status.allowed)

    for verb in ("get", "list", "watch"):
        assert allowed("nodes", verb), verb
    for verb in ("update", "patch", "delete", "create"):
        assert not allowed("nodes", verb), verb
    assert not allowed("nodes", "patch", "status")
    assert not allowed("pods", "list")
    assert not allowed("secrets", "get")
    assert not allowed("configmaps", "get")


def _rss(node: RealNode, pod: str) -> str:
    """The daemon's memory in its container, for the overlay's limits."""
    status = node.kubectl("exec", "-n", NAMESPACE, pod, "--", "cat", "/proc/1/status").stdout
    return " ".join(line for line in status.splitlines() if line.startswith(("VmRSS", "VmHWM")))


HARDWARE = """\
resources:
  # Through CDI alone: Allocate names the CDI device, the runtime makes the node.
  - name: example.com/fuse
    cdi: {mode: cdi}
    groups: [{paths: [{path: /dev/fuse}]}]
  - name: example.com/tun
    cdi: {mode: both}
    groups: [{paths: [{path: /dev/net/tun}]}]
  # This machine's virtio-blk disk, by PCI ID: its node (vda) is found in sysfs.
  - name: example.com/disk
    groups: [{pci: {vendor: "1af4", device: "1042"}}]
  # virtio-rng: its /dev/hwrng is not below it in sysfs, so it comes without a node...
  - name: example.com/rng
    groups: [{pci: {vendor: "1af4", device: "1044"}}]
  # ...unless the group names it.
  - name: example.com/rng-node
    groups: [{pci: {vendor: "1af4", device: "1044"}, paths: [{path: /dev/hwrng}]}]
"""
HARDWARE_RESOURCES = re.findall(r"name: (\S+)", HARDWARE)


def test_real_host_devices_reach_containers_through_the_runtime(
    real_node: RealNode, tmp_path: Path
) -> None:
    if not Path("/sys/bus/pci/devices/0000:00:02.0/virtio1/block/vda").exists():
        pytest.skip("this test names the virtio-blk disk and virtio-rng of these machines")
    config = tmp_path / "hardware.yaml"
    config.write_text(HARDWARE)
    check = real_node.exec(
        sys.executable, "-m", "devplug.cli.main", "check", "--config", str(config)
    )
    rng_warning = "example.com/rng: device 0000:00:05.0 (1af4:1044) has no device node"
    assert f"warning: {rng_warning}" in check.stdout

    log = tmp_path / "serve.log"
    offset = real_node.log_offset()
    with log.open("w") as out:
        daemon = real_node.popen(
            *(sys.executable, "-m", "devplug.cli.main", "serve", "--config", str(config)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        real_node.wait_connected(HARDWARE_RESOURCES, offset)
        real_node.wait_node(lambda n: all(capacity(n, r) == 1 for r in HARDWARE_RESOURCES))
        with real_node.namespace("hw") as ns:
            run_pod(real_node, ns, "hw", {r: 1 for r in HARDWARE_RESOURCES[:4]})
            script = (
                "stat -c '%n %F %t:%T' /dev/fuse /dev/net/tun /dev/vda; "
                "exec 3<>/dev/fuse && echo fuse opened; exec 4<>/dev/net/tun && echo tun opened; "
                "test -e /dev/hwrng || echo no hwrng"
            )
            seen = in_pod(real_node, ns, "hw", script)
            # The host's own nodes (this machine's root disk is not readable even by the
            # host's root: its presence and numbers are what is checked there).
            assert seen.stdout.splitlines() == [
                f"/dev/fuse character special file {_numbers('/dev/fuse')}",
                f"/dev/net/tun character special file {_numbers('/dev/net/tun')}",
                f"/dev/vda block special file {_numbers('/dev/vda')}",
                "fuse opened",
                "tun opened",
                "no hwrng",
            ], seen.stderr
            assert env_of(real_node, ns, "hw")["DEVPLUG_EXAMPLE_COM_RNG"] == "0000:00:05.0"
            run_pod(real_node, ns, "rng", {"example.com/rng-node": 1})
            assert in_pod(real_node, ns, "rng", "test -c /dev/hwrng && echo hwrng").stdout == (
                "hwrng\n"
            )
            # What the kubelet got from Allocate, in its own checkpoint: fuse by CDI name
            # alone, tun by name and node.
            answers = _allocate_answers(real_node)
            assert list(answers["example.com/fuse"].devices) == []
            assert [d.name for d in answers["example.com/fuse"].cdi_devices] == [
                "example.com/fuse=fuse"
            ]
            assert [d.host_path for d in answers["example.com/tun"].devices] == ["/dev/net/tun"]
            assert [d.name for d in answers["example.com/tun"].cdi_devices] == [
                "example.com/tun=net-tun"
            ]
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
    assert rng_warning in log.read_text()


def _numbers(path: str) -> str:
    """`stat -c %t:%T` of a host device node: major and minor in hex."""
    rdev = os.stat(path).st_rdev
    return f"{os.major(rdev):x}:{os.minor(rdev):x}"


def _allocate_answers(node: RealNode) -> dict[str, pb.ContainerAllocateResponse]:
    data = checkpoint.read(node.plugin_dir / "kubelet_internal_checkpoint")
    assert data is not None
    return {
        e.resource: pb.ContainerAllocateResponse.FromString(e.alloc_resp or b"")
        for e in data.entries or []
    }
