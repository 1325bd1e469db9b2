"""Metrics, probes and logs of a real `devplug serve` process against the simulator."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from serve_helpers import free_port, http_get, metric_lines, wait_for_output

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.testing import KubeletHarness

SERVING = "serving /metrics, /healthz and /readyz"


def node_config(nodes: Path) -> str:
    return (
        "resources:\n"
        "  - name: example.com/widget\n"
        "    allowAnyPath: true\n"
        "    groups:\n"
        f"      - paths: [{{path: '{nodes}/widget*'}}]\n"
        "  - name: example.com/fake\n"
        "    virtual: 2\n"
    )


@pytest.fixture
def nodes(short_tmp: Path) -> Path:
    folder = short_tmp / "dev"
    folder.mkdir()
    for i in range(2):
        os.mknod(folder / f"widget{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return folder


def test_metrics_probes_and_pod_labels_follow_what_happens(nodes: Path) -> None:
    port = free_port()
    with KubeletHarness() as kubelet:
        pod_resources = kubelet.state_dir / "pod-resources" / "kubelet.sock"
        serve = kubelet.start_serve(
            node_config(nodes),
            "--metrics-port",
            str(port),
            "--metrics-pod-resources",
            str(pod_resources),
        )
        wait_for_output(serve, SERVING)
        assert http_get(port, "/healthz") == (200, "ok\n")
        assert http_get(port, "/readyz") == (200, "ok\n")
        assert metric_lines(port, "devplug_devices{") == [
            'devplug_devices{health="Healthy",resource="example.com/widget"} 2.0',
            'devplug_devices{health="Unhealthy",resource="example.com/widget"} 0.0',
            'devplug_devices{health="Healthy",resource="example.com/fake"} 2.0',
            'devplug_devices{health="Unhealthy",resource="example.com/fake"} 0.0',
        ]
        assert 'devplug_listandwatch_streams_open{resource="example.com/fake"} 1.0' in (
            metric_lines(port, "devplug_listandwatch_streams_open")
        )
        assert metric_lines(port, "devplug_registered") == [
            'devplug_registered{resource="example.com/widget"} 1.0',
            'devplug_registered{resource="example.com/fake"} 1.0',
        ]

        pod = kubelet.admit({"example.com/widget": 1}, name="user")
        assert pod.admitted, pod
        (device,) = pod.devices()["example.com/widget"]
        # Every resource's counters are there from the start, at 0 until used.
        assert sorted(metric_lines(port, "devplug_allocations_total")) == [
            'devplug_allocations_total{resource="example.com/fake"} 0.0',
            'devplug_allocations_total{resource="example.com/widget"} 1.0',
        ]
        assert sorted(metric_lines(port, "devplug_allocate_duration_seconds_count")) == [
            'devplug_allocate_duration_seconds_count{resource="example.com/fake"} 0.0',
            'devplug_allocate_duration_seconds_count{resource="example.com/widget"} 1.0',
        ]
        assert metric_lines(port, "devplug_pod_device_info") == [
            "devplug_pod_device_info{container="
            f'"main",device="{device}",namespace="default",pod="user",'
            'resource="example.com/widget"} 1.0'
        ]

        # A refused request, counted by its gRPC code.
        socket = kubelet.plugin_dir / "devplug-example.com-fake.sock"
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=["nope"])]
            )
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.DevicePluginStub(channel).Allocate(request, timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert metric_lines(port, "devplug_refused_requests_total") == [
            "devplug_refused_requests_total"
            '{code="INVALID_ARGUMENT",method="Allocate",resource="example.com/fake"} 1.0'
        ]

        # A device node goes: Unhealthy in the gauge.
        (nodes / "widget1").unlink()
        kubelet.wait_for_resource("example.com/widget", count=1)
        assert 'devplug_devices{health="Unhealthy",resource="example.com/widget"} 1.0' in (
            metric_lines(port, "devplug_devices")
        )

        # A kubelet restart: registrations and restarts seen.
        kubelet.restart()
        wait_for_output(serve, "re-registered with the restarted kubelet", count=2)
        assert 'devplug_registrations_total{resource="example.com/fake"} 2.0' in (
            metric_lines(port, "devplug_registrations_total")
        )
        assert sorted(metric_lines(port, "devplug_kubelet_restarts_seen_total")) == [
            'devplug_kubelet_restarts_seen_total{resource="example.com/fake"} 1.0',
            'devplug_kubelet_restarts_seen_total{resource="example.com/widget"} 1.0',
        ]

        # The kubelet goes away: alive, not ready, saying why.
        kubelet.run(kubelet.simulator.stop())
        wait_for_output(serve, "kubelet.sock is gone", count=2)
        status, body = http_get(port, "/readyz")
        assert status == 503
        assert "example.com/fake: not registered with the kubelet" in body
        assert metric_lines(port, "devplug_registered") == [
            'devplug_registered{resource="example.com/widget"} 0.0',
            'devplug_registered{resource="example.com/fake"} 0.0',
        ]
        assert http_get(port, "/healthz") == (200, "ok\n")
        assert http_get(port, "/nothing")[0] == 404
        assert serve.stop() == 0


def test_without_metrics_port_no_metrics_library_is_loaded(short_tmp: Path) -> None:
    with KubeletHarness() as kubelet:
        process = kubelet.start_command(
            [
                *(sys.executable, "-X", "importtime", "-m", "devplug.cli.main", "serve"),
                *("--plugin-dir", str(kubelet.plugin_dir)),
            ],
            wait_for=["devplug.io/null"],
        )
        assert process.stop() == 0
        imported = process.output
    assert "devplug.framework.daemon" in imported  # the check sees what was imported
    assert "prometheus_client" not in imported
    assert "devplug.framework.metrics" not in imported


def test_json_logs_one_line_per_event(nodes: Path) -> None:
    with KubeletHarness() as kubelet:
        config = kubelet.root / "widgets.yaml"
        config.write_text(node_config(nodes))
        command = [sys.executable, "-m", "devplug.cli.main", "--log-format", "json", "serve"]
        serve = kubelet.start_command(
            [*command, "--config", str(config), "--plugin-dir", str(kubelet.plugin_dir)],
            wait_for=["example.com/widget", "example.com/fake"],
        )
        pod = kubelet.admit({"example.com/fake": 2}, name="two")
        assert pod.admitted, pod
        (nodes / "widget0").unlink()
        kubelet.wait_for_resource("example.com/widget", count=1)
        sick = kubelet.device_ids("example.com/widget", healthy=False)
        kubelet.restart()
        assert serve.stop() == 0
        output = serve.output
    not_json = [line for line in output.splitlines() if not line.startswith("{")]
    assert not not_json, output
    lines = [json.loads(line) for line in output.splitlines()]
    events = [(e.get("event"), e.get("resource")) for e in lines if e.get("event")]
    assert events.count(("registered", "example.com/fake")) == 2
    registered = [e for e in lines if e.get("event") == "registered"]
    assert [e["kubelet_restart"] for e in registered if e["resource"] == "example.com/fake"] == [
        False,
        True,
    ]
    (allocated,) = [e for e in lines if e.get("event") == "allocated"]
    assert allocated["resource"] == "example.com/fake"
    assert allocated["containers"] == [pod.devices()["example.com/fake"]]
    (health,) = [e for e in lines if e.get("event") == "health_changed"]
    assert health["unhealthy"] == sick
    assert sick[0].endswith("widget0")
    assert health["level"] == "warning"
    # Every line is one JSON object with a time, a level and a message.
    assert all({"ts", "level", "msg"} <= set(e) for e in lines)


def test_text_logs_are_readable(nodes: Path) -> None:
    with KubeletHarness() as kubelet:
        serve = kubelet.start_serve(node_config(nodes))
        pod = kubelet.admit({"example.com/widget": 1}, name="one")
        assert pod.admitted, pod
        serve.stop()
        output = serve.output
    assert "example.com/widget: registered with the kubelet as devplug-example.com-widget.sock" in (
        output
    )
    (device,) = pod.devices()["example.com/widget"]
    assert f"example.com/widget: allocated {device}" in output


def test_metrics_port_in_use_stops_the_daemon_with_the_reason(short_tmp: Path) -> None:
    with KubeletHarness() as kubelet, __import__("socket").socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                *(sys.executable, "-m", "devplug.cli.main", "serve"),
                *("--plugin-dir", str(kubelet.plugin_dir), "--metrics-address", "127.0.0.1"),
                *("--metrics-port", str(port)),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    assert lines[-1] == (
        f"devplug serve: cannot serve metrics on 127.0.0.1 port {port}: Address already in use"
    )


def test_probes_work_without_prometheus_client(nodes: Path, short_tmp: Path) -> None:
    """A broken install without prometheus-client: /healthz and /readyz still answer,
    /metrics says what is missing, and the log says it once."""
    shadow = short_tmp / "shadow" / "prometheus_client"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'prometheus_client'\", "
        "name='prometheus_client')\n"
    )
    port = free_port()
    with KubeletHarness() as kubelet:
        serve = kubelet.start_serve(
            node_config(nodes),
            "--metrics-port",
            str(port),
            env={"PYTHONPATH": str(shadow.parent)},
        )
        output = wait_for_output(serve, SERVING)
        assert http_get(port, "/healthz") == (200, "ok\n")
        assert http_get(port, "/readyz") == (200, "ok\n")
        status, body = http_get(port, "/metrics")
        assert status == 503
        assert "prometheus-client is not installed" in body
        assert output.count("prometheus-client is not installed") == 1
        assert serve.stop() == 0


def test_with_a_pod_uid_the_metrics_server_waits_for_its_port(short_tmp: Path) -> None:
    """The second pod of a rolling update with surge, on the node's network: the old
    pod holds the port; the new one serves once it is free."""
    with KubeletHarness() as kubelet:
        taken = __import__("socket").socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = kubelet.start_serve(
            "resources: [{name: example.com/fake, virtual: 1}]\n",
            *("--metrics-address", "127.0.0.1", "--metrics-port", str(port)),
            env={"POD_UID": "0f4c-new"},
        )
        wait_for_output(serve, f"metrics port {port} is in use")
        taken.close()
        wait_for_output(serve, SERVING)
        assert http_get(port, "/healthz") == (200, "ok\n")


def test_events_without_consequence_log_nothing(nodes: Path) -> None:
    """Folder events that change nothing (a foreign file in the plugin folder, a name
    no glob matches) log no line; the next line is the next real event."""
    with KubeletHarness() as kubelet:
        config = kubelet.root / "widgets.yaml"
        config.write_text(node_config(nodes))
        serve = kubelet.start_serve(config)
        before = wait_for_output(serve, "registered with the kubelet", count=2).splitlines()
        for folder in (kubelet.plugin_dir, nodes):
            (folder / "unrelated").write_text("")
            (folder / "unrelated").unlink()
        os.kill(serve.pid, signal.SIGHUP)  # a real event, after the others
        output = wait_for_output(serve, "config reloaded")
        new = output.splitlines()[len(before) :]
        assert len(new) == 1, new
        assert "nothing changed" in new[0]
        assert serve.stop() == 0
