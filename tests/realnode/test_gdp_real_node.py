"""The generic device plugin's own DaemonSet (its manifests/generic-device-plugin.yaml,
transcribed below) on the real node with devplug's image instead of its own: pods asking
for its resource names get the devices, from inside the container.

Skipped, saying what to provide, where the node cannot run (see tests/conftest.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml
from gdp_examples import MANIFEST_DEVICES

from devplug.testing.realnode import RealNode, allocatable, capacity, unschedulable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAMESPACE = "kube-system"
DAEMONSET = "generic-device-plugin"

# Its manifest as published, but for `args`, which are MANIFEST_DEVICES (--device each).
MANIFEST = """\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: generic-device-plugin
  namespace: kube-system
  labels:
    app.kubernetes.io/name: generic-device-plugin
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: generic-device-plugin
  template:
    metadata:
      labels:
        app.kubernetes.io/name: generic-device-plugin
    spec:
      priorityClassName: system-node-critical
      tolerations:
      - operator: "Exists"
        effect: "NoExecute"
      - operator: "Exists"
        effect: "NoSchedule"
      containers:
      - image: squat/generic-device-plugin
        args: []
        name: generic-device-plugin
        resources:
          requests:
            cpu: 50m
            memory: 10Mi
          limits:
            cpu: 50m
            memory: 20Mi
        ports:
        - containerPort: 8080
          name: http
        securityContext:
          privileged: true
        volumeMounts:
        - name: device-plugin
          mountPath: /var/lib/kubelet/device-plugins
        - name: dev
          mountPath: /dev
      volumes:
      - name: device-plugin
        hostPath:
          path: /var/lib/kubelet/device-plugins
      - name: dev
        hostPath:
          path: /dev
  updateStrategy:
    type: RollingUpdate
"""


def daemonset(image: str, extra: list[str]) -> dict[str, Any]:
    """Its DaemonSet with `image`, its own --device blocks, then `extra` ones."""
    manifest: dict[str, Any] = yaml.safe_load(MANIFEST)
    [container] = manifest["spec"]["template"]["spec"]["containers"]
    container["image"] = image
    container["args"] = [w for d in [*MANIFEST_DEVICES, *extra] for w in ("--device", d)]
    return manifest


def in_pod(node: RealNode, ns: str, pod: str, script: str) -> str:
    return node.kubectl("exec", "-n", ns, pod, "--", "sh", "-c", script, check=False).stdout


def test_its_daemonset_with_devplug_s_image_gives_pods_its_devices(
    real_node: RealNode, real_node_image: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Under /dev: the only host folder its manifest mounts, where it looks for paths.
    share, missing = f"/dev/gdp-share-{tag}", f"/dev/gdp-missing-{tag}"
    # Nodes its own --device blocks name, made where the host has none (and only those
    # are removed afterwards): /dev/video0 for `video`, and the second card's pair of
    # `capture`, served in the container under the first card's names (mountPath).
    made = real_node.exec(
        "sh",
        "-c",
        "test -d /dev/snd || { mkdir /dev/snd && echo /dev/snd; }; "
        "for n in /dev/video0 /dev/snd/controlC1 /dev/snd/pcmC1D0c; do "
        "  test -e $n || { mknod $n c 1 3 && echo $n; }; "
        "done; "
        f"mkdir {share} && echo hello > {share}/hello",
    ).stdout.split()
    extra = [
        # An optional path that is missing, beside one that is there.
        json.dumps(
            {
                "name": "optional",
                "groups": [
                    {"paths": [{"path": "/dev/video0"}, {"path": missing, "optional": True}]}
                ],
            }
        ),
        # A Mount path: a host folder bind-mounted read-only.
        json.dumps(
            {
                "name": "share",
                "groups": [
                    {
                        "paths": [
                            {
                                "path": share,
                                "type": "Mount",
                                "mountPath": "/share",
                                "readOnly": True,
                            }
                        ]
                    }
                ],
            }
        ),
    ]
    manifest = json.dumps(daemonset(real_node_image, extra))
    real_node.kubectl("apply", "-f", "-", input=manifest)
    try:
        # With the manifest's own limit (20Mi) the kernel stops devplug for memory once
        # it has imported its gRPC stack (after a Ready moment: no probe): the limit
        # docs/migrate.md gives, set at once.
        real_node.kubectl(
            *("-n", NAMESPACE, "set", "resources", f"ds/{DAEMONSET}"),
            "--limits=cpu=200m,memory=64Mi",
            "--requests=cpu=50m,memory=48Mi",
        )
        pod = real_node.rolled_out(NAMESPACE, DAEMONSET)
        status = in_pod(real_node, NAMESPACE, pod, "grep -E '^(VmRSS|RssAnon)' /proc/1/status")
        print(f"devplug in its DaemonSet: {' '.join(status.split())}")
        want = {"video": 1, "fuse": 10, "capture": 1, "optional": 1, "share": 1}
        node = real_node.wait_node(
            lambda n: all(allocatable(n, f"squat.ai/{r}") == c for r, c in want.items())
        )
        # The capture groups whose cards are missing are listed, not allocatable.
        assert capacity(node, "squat.ai/capture") == 4
        with real_node.namespace("gdp") as ns:
            asks = {f"squat.ai/{r}": 1 for r in want}
            real_node.create(real_node.busybox_pod("user", asks, namespace=ns))
            real_node.wait_pod(ns, "user")
            seen = in_pod(
                real_node,
                ns,
                "user",
                "stat -c '%n %F %t:%T' /dev/video0 /dev/fuse /dev/snd/controlC0 "
                f"/dev/snd/pcmC0D0c; test -e {missing} || echo no {missing}; "
                "exec 3<>/dev/fuse && echo fuse opened; cat /share/hello; "
                "touch /share/x 2>/dev/null || echo /share read-only",
            )
            assert seen.splitlines() == [
                "/dev/video0 character special file 1:3",
                f"/dev/fuse character special file {_numbers(real_node, '/dev/fuse')}",
                "/dev/snd/controlC0 character special file 1:3",
                "/dev/snd/pcmC0D0c character special file 1:3",
                f"no {missing}",
                "fuse opened",
                "hello",
                "/share read-only",
            ]
            # /dev/fuse shared by count 10: nine more for one pod, then none.
            real_node.create(real_node.busybox_pod("nine", {"squat.ai/fuse": 9}, namespace=ns))
            real_node.wait_pod(ns, "nine")
            real_node.create(real_node.busybox_pod("over", {"squat.ai/fuse": 1}, namespace=ns))
            pending = real_node.wait_pod(ns, "over", lambda p: unschedulable(p) is not None)
            assert "Insufficient squat.ai/fuse" in str(unschedulable(pending))
    finally:
        real_node.kubectl(
            *("delete", "-f", "-", "--wait=true", "--ignore-not-found", "--timeout=120s"),
            input=manifest,
            timeout=150,
        )
        real_node.exec("rm", "-rf", share, *made, check=False)


def _numbers(node: RealNode, path: str) -> str:
    """`stat -c %t:%T` of a node's device node: major and minor in hex."""
    return node.exec("stat", "-c", "%t:%T", path).stdout.strip()
