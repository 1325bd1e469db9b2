"""The Xid and health-transition counters of a real `devplug serve` of NVIDIA GPUs (the
fake NVML driver of devplug.fakes.nvml standing in for the host)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devplug.fakes.nvml import FakeGpuHost, eight_gpus, gpu_uuid
from devplug.testing import KubeletHarness
from tests.metrics_helpers import scrape, value
from tests.serve_helpers import free_port, wait_for_output

GPU = "nvidia.com/gpu"
XIDS = "devplug_gpu_xid_errors_total"
TRANSITIONS = "devplug_health_transitions_total"


@pytest.fixture
def eight(short_tmp: Path) -> FakeGpuHost:
    return FakeGpuHost(short_tmp / "gpus", eight_gpus())


def test_xids_are_counted_by_gpu_code_and_action_and_health_by_transition(
    kubelet: KubeletHarness, eight: FakeGpuHost
) -> None:
    port = free_port()
    nvidia = {"hostRoot": eight.host_root, "probeSeconds": 0.05, "recoverySeconds": 600}
    config = yaml.safe_dump({"resources": [{"nvidia": nvidia}]})
    daemon = kubelet.start_serve(config, "--metrics-port", str(port), env=eight.env)
    kubelet.wait_for_resource(GPU, count=8)
    wait_for_output(daemon, "serving /metrics")
    start = scrape(port)
    for before, after in (("Healthy", "Unhealthy"), ("Unhealthy", "Healthy")):
        assert value(start, TRANSITIONS, resource=GPU, **{"from": before, "to": after}) == 0
    assert not [name for name, _ in start if name == XIDS]  # no Xid yet, no series

    eight.inject_xid(2, 13)  # an application's error: ignored
    eight.inject_xid(3, 94)  # contained memory error: transient
    eight.inject_xid(5, 95)  # uncontained memory error: a reset
    # Handled in order: once GPUs 3 and 5 are Unhealthy, every Xid was counted.
    kubelet.wait_until(
        lambda: kubelet.device_ids(GPU, healthy=False) == [gpu_uuid(3), gpu_uuid(5)],
        what="GPUs 3 and 5 unhealthy",
    )
    samples = scrape(port)
    for index, xid, action in ((2, "13", "ignore"), (3, "94", "transient"), (5, "95", "reset")):
        labels = {"resource": GPU, "gpu": gpu_uuid(index), "xid": xid, "action": action}
        assert value(samples, XIDS, **labels) == 1
    assert len([name for name, _ in samples if name == XIDS]) == 3
    sick = {"resource": GPU, "from": "Healthy", "to": "Unhealthy"}
    assert value(samples, TRANSITIONS, **sick) == 2
    well = {"resource": GPU, "from": "Unhealthy", "to": "Healthy"}
    assert value(samples, TRANSITIONS, **well) == 0
    assert value(samples, "devplug_devices", resource=GPU, health="Unhealthy") == 2
