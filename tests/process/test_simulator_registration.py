"""Registration with the simulated kubelet: refusals, replacement, the grace period."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest
from sim_helpers import FOO, PluginProcess, device, plugin, pod

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.channel import unix_channel
from devplug.simulator import REASON_UNEXPECTED_ADMISSION, Kubelet


async def register(
    kubelet: Kubelet, *, version: str = "v1beta1", resource: str = FOO, endpoint: str = "p.sock"
) -> grpc.aio.AioRpcError | None:
    async with unix_channel(kubelet.registration_socket) as channel:
        try:
            await pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource),
                timeout=10,
                wait_for_ready=True,
            )
        except grpc.aio.AioRpcError as error:
            return error
    return None


async def test_refusals_say_why(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    async with Kubelet(plugins, tmp_path / "state", dial_timeout=0.3) as kubelet:
        (plugins / "notes.txt").write_text("not a socket")
        # A socket file nobody listens on.
        with socket.socket(socket.AF_UNIX) as dead:
            dead.bind(str(plugins / "dead.sock"))
            cases = [
                (
                    {"version": "v1"},
                    'requested API version "v1" is not supported by kubelet. '
                    'Supported version is ["v1beta1"]',
                ),
                ({"resource": "foo"}, 'the ResourceName "foo" is invalid'),
                ({"resource": "requests.example.com/x"}, "is invalid"),
                ({"endpoint": "../p.sock"}, "failed to dial device plugin: the endpoint"),
                ({"endpoint": "notes.txt"}, "notes.txt is not a socket"),
                ({"endpoint": "dead.sock"}, "context deadline exceeded"),
                ({"endpoint": "missing.sock"}, "context deadline exceeded"),
            ]
            for fields, expected in cases:
                error = await register(kubelet, **fields)
                assert error is not None, fields
                # A Go error returned by the kubelet's handler: status UNKNOWN.
                assert error.code() == grpc.StatusCode.UNKNOWN
                assert expected in (error.details() or ""), (fields, error.details())
        status = kubelet.node_status()
        assert status.resources == []
        assert status.registrations == {}
        # Counted before the checks, as kubelet_device_plugin_registration_total is.
        assert status.registration_total == {FOO: 5, "foo": 1, "requests.example.com/x": 1}
        refused = [e for e in kubelet.events if e.kind == "registration_refused"]
        assert len(refused) == 7


async def test_start_cleans_sockets_but_keeps_other_files(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "keep.txt").write_text("x")
    (plugins / "sub").mkdir()
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(plugins / "stale.sock"))
    async with Kubelet(plugins, tmp_path / "state") as kubelet:
        names = sorted(p.name for p in plugins.iterdir())
        assert names == ["keep.txt", "kubelet.sock", "sub"]
        assert kubelet.registration_socket.is_socket()
        assert kubelet.pod_resources_socket.is_socket()
    assert not (plugins / "kubelet.sock").exists()


async def test_second_registration_replaces_the_first(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    async with Kubelet(plugins, tmp_path / "state") as kubelet:
        first = PluginProcess(
            tmp_path, plugins, [plugin(FOO, [device("a1"), device("a2")], socket="a.sock")]
        )
        second = None
        try:
            await kubelet.wait_for_resource(FOO, count=2)
            second = PluginProcess(
                tmp_path, plugins, [plugin(FOO, [device("b1")], socket="b.sock")]
            )
            await kubelet.wait_for_registration(FOO, after=1)
            status = await kubelet.wait_for_resource(FOO, count=1)
            assert [d.id for d in status.devices] == ["b1"]
            # The first plugin's stream was closed by the kubelet: its end is no news.
            since = kubelet.last_event_seq
            first.stop()
            [result] = await kubelet.apply(pod("p", {"c": {FOO: 1}}))
            assert result.admitted, result.message
            assert result.containers[0].devices == {FOO: ["b1"]}
            assert not [e for e in kubelet.events if e.seq > since and e.kind == "endpoint_stopped"]
            assert kubelet.node_status().registrations == {FOO: 2}
        finally:
            first.close()
            if second is not None:
                second.close()


async def test_grace_period_keeps_devices_unhealthy_then_drops_them(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    async with Kubelet(plugins, tmp_path / "state", grace_period=0.5) as kubelet:
        with PluginProcess(tmp_path, plugins, [plugin(FOO, [device("d0"), device("d1")])]) as proc:
            await kubelet.wait_for_resource(FOO, count=2)
            [held] = await kubelet.apply(pod("held", {"c": {FOO: 1}}))
            assert held.admitted
            since = kubelet.last_event_seq
            proc.kill()
            await kubelet.wait_for_event("endpoint_stopped", resource=FOO, after=since)
            status = kubelet.resource_status(FOO)
            assert status is not None
            assert (status.capacity, status.allocatable, status.endpoint) == (2, 0, "stopped")
            assert status.grace_left_s is not None
            [late] = await kubelet.apply(pod("late", {"c": {FOO: 1}}))
            assert (late.admitted, late.reason) == (False, REASON_UNEXPECTED_ADMISSION)
            assert late.message == (
                "Allocate failed due to no healthy devices present; cannot allocate "
                "unhealthy devices example.com/foo, which is unexpected"
            )
            await kubelet.wait_for_event("resource_removed", resource=FOO, after=since)
            assert kubelet.resource_status(FOO) is None
            # The running pod keeps its device; new pods meet an unregistered resource.
            [later] = await kubelet.apply(pod("later", {"c": {FOO: 1}}))
            assert later.message == (
                "Allocate failed due to cannot allocate unregistered device "
                "example.com/foo, which is unexpected"
            )
            assert kubelet.pod("held") is not None


@pytest.mark.parametrize("bad", [{"topology_policy": "strict"}, {"grace_period": -1}])
def test_bad_parameters(tmp_path: Path, bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        Kubelet(tmp_path, **bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("sig", "level"), [("SIGTERM", "INFO"), ("SIGKILL", "WARNING")])
async def test_a_plugin_stopping_on_purpose_is_no_warning(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, sig: str, level: str
) -> None:
    """A plugin that stops (SIGTERM) closes its stream itself: an info line; one that
    dies (SIGKILL) loses it: the kubelet's warning."""
    import signal

    from devplug.simulator.events import ENDPOINT_STOPPED

    plugins = short_tmp / "plugins"

    with caplog.at_level("INFO", logger="devplug.simulator"):
        async with Kubelet(plugins, short_tmp / "state", control_socket=False) as kubelet:
            process = PluginProcess(short_tmp, plugins, [plugin(FOO, [device("d0")])])
            try:
                await kubelet.wait_for_resource(FOO, timeout=20)
                seen = kubelet.last_event_seq
                process.stop(getattr(signal, sig))
                await kubelet.wait_for_event(ENDPOINT_STOPPED, after=seen, timeout=20)
            finally:
                process.close()
    [record] = [r for r in caplog.records if "ListAndWatch" in r.getMessage()]
    assert record.levelname == level, record.getMessage()
