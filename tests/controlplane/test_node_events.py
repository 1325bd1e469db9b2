"""`nodeEvents: true`: an Event on the Node for each change of a device's health, posted
by a real `devplug serve` to a real API server (the throwaway control plane)."""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.testing import KubeletHarness
from devplug.testing.controlplane import watch_until
from tests.sim_helpers import cli_command

RESOURCE = "example.com/widget"
WAIT_S = 60.0  # the daemon imports the Kubernetes client first, on a busy machine


def widget_config(folder: Path) -> str:
    folder.mkdir()
    for i in range(2):
        os.mknod(folder / f"widget{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    resource = {
        "name": RESOURCE,
        "allowAnyPath": True,
        "groups": [{"paths": [{"path": f"{folder}/widget*"}]}],
    }
    return yaml.safe_dump({"nodeEvents": True, "resources": [resource]})


@pytest.mark.timeout(240)
def test_a_device_that_goes_unhealthy_and_back_is_an_event_on_the_node(
    kubeconfig: str, api: Any, short_tmp: Path
) -> None:
    from kubernetes import client

    node = f"events-{uuid.uuid4().hex[:6]}"
    devices = short_tmp / "dev"
    config = widget_config(devices)
    events = client.EventsV1Api(api)

    def event_of(reason: str) -> dict[str, Any]:
        def wanted(event: dict[str, Any]) -> bool:
            return event["regarding"]["name"] == node and event["reason"] == reason

        return watch_until(
            api, events.list_namespaced_event, wanted, timeout=WAIT_S, namespace="default"
        )

    with KubeletHarness() as kubelet:
        kubelet.start_serve(config, "--kubeconfig", kubeconfig, "--node-name", node, timeout=WAIT_S)
        (devices / "widget1").unlink()
        kubelet.wait_for_resource(RESOURCE, count=1)
        [device] = kubelet.device_ids(RESOURCE, healthy=False)
        sick = event_of("DeviceUnhealthy")
        assert sick["type"] == "Warning"
        assert sick["regarding"]["kind"] == "Node"
        assert sick["reportingController"] == "devplug.io/devplug"
        assert sick["note"] == f"{RESOURCE}: devices now unhealthy: {device}"
        os.mknod(devices / "widget1", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        well = event_of("DeviceHealthy")
        assert well["type"] == "Normal"
        assert well["note"] == f"{RESOURCE}: devices now healthy: {device}"


def test_node_events_without_an_api_server_to_post_to_refuse_to_start(short_tmp: Path) -> None:
    config = short_tmp / "config.yaml"
    config.write_text(widget_config(short_tmp / "dev"))
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run(
        cli_command("serve", "--config", str(config), "--plugin-dir", str(short_tmp / "dp")),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("devplug serve: nodeEvents: no kubeconfig")
