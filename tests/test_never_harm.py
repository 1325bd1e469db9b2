"""Nothing devplug did not create is removed, replaced or truncated: one test per place
where devplug removes, replaces or truncates a file or socket (the simulator's start and
restart, its control socket, checkpoint and pod list, a daemon's sockets, the CDI and NFD
outputs, the demo's folder, `devplug status`), against real sockets that answer."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sim_helpers import FOO, PluginProcess, cli_command, device, devplug, kubelet_process, plugin

from devplug.framework.unixserver import SocketPathTaken, UnixServer, socket_identity
from devplug.simulator import Kubelet
from devplug.testing.realnode import RealNode

WAIT_S = 60


@contextmanager
def listening(path: Path) -> Iterator[socket.socket]:
    """A unix socket at `path` that another process would serve: it answers."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    try:
        yield server
    finally:
        server.close()


def answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def stale(path: Path) -> None:
    """A socket file whose process is gone."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def snapshot(folder: Path) -> dict[str, tuple[int, int, int] | None]:
    return {p.name: socket_identity(p) for p in sorted(folder.rglob("*"))}


def test_a_second_simulator_refuses_and_touches_nothing(short_tmp: Path) -> None:
    plugins, state = short_tmp / "plugins", short_tmp / "state"
    control = str(state / "control.sock")
    with (
        kubelet_process("--plugin-dir", str(plugins), "--state-dir", str(state)) as (first, _),
        PluginProcess(short_tmp, plugins, [plugin(FOO, [device("d0")])]),
    ):
        waited = devplug("node", "--control", control, "--wait-for", f"{FOO}=1", "-o", "json")
        assert waited.returncode == 0, waited.stderr
        before = snapshot(plugins) | snapshot(state)
        for args in (
            ["--plugin-dir", str(plugins), "--state-dir", str(state)],
            ["--plugin-dir", str(plugins), "--state-dir", str(short_tmp / "other")],
        ):
            second = devplug("kubelet", *args, timeout=WAIT_S)
            assert second.returncode == 1, second.stderr
            [line] = second.stderr.splitlines()
            assert line.startswith(f"devplug kubelet: {plugins / 'kubelet.sock'} is served by ")
            assert f"process {first.pid} (" in line
            assert "does not start beside it" in line
        assert snapshot(plugins) | snapshot(state) == before
        assert not (short_tmp / "other").exists()
        node = devplug("node", "--control", control, "--wait-for", f"{FOO}=1")
        assert node.returncode == 0, node.stderr  # the first one still serves its plugin


@pytest.mark.timeout(300)
def test_the_simulator_refuses_to_start_beside_the_real_kubelet(real_node: RealNode) -> None:
    folder = "/var/lib/kubelet/device-plugins"

    def listing() -> str:
        return real_node.exec("ls", "-li", folder, "/var/lib/kubelet").stdout

    before = listing()
    cmd = [sys.executable, "-m", "devplug.cli.main", "kubelet", "--plugin-dir", folder]
    done = real_node.exec(*cmd, check=False, timeout=60)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"devplug kubelet: {folder}/kubelet.sock is served by process ")
    assert f"process {real_node.kubelet_pid} (kubelet)" in line
    assert listing() == before
    ready = {c["type"]: c["status"] for c in real_node.node()["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_simulator_start_removes_only_sockets_nobody_serves(short_tmp: Path) -> None:
    plugins = short_tmp / "plugins"
    plugins.mkdir()
    stale(plugins / "dead.sock")
    (plugins / "notes.sock").write_text("a file, not a socket")
    (plugins / "folder.sock").mkdir()
    (plugins / "link.sock").symlink_to(plugins / "notes.sock")

    async def scenario() -> None:
        with listening(plugins / "alive.sock"):
            async with Kubelet(plugins, short_tmp / "state", control_socket=False):
                assert not (plugins / "dead.sock").exists()
                assert answers(plugins / "alive.sock")
                assert (plugins / "notes.sock").read_text() == "a file, not a socket"
                assert (plugins / "folder.sock").is_dir()
                assert (plugins / "link.sock").is_symlink()

    asyncio.run(scenario())


def test_simulator_restart_removes_its_plugins_sockets_only(short_tmp: Path) -> None:
    plugins = short_tmp / "plugins"

    async def scenario() -> None:
        async with Kubelet(plugins, short_tmp / "state", control_socket=False) as kubelet:
            with (
                PluginProcess(short_tmp, plugins, [plugin(FOO, [device("d0")])]),
                listening(plugins / "stranger.sock"),
            ):
                await kubelet.wait_for_resource(FOO, timeout=WAIT_S)
                registered = kubelet.registrations(FOO)
                ours = plugins / "devplug-example.com-foo.sock"
                before = socket_identity(ours)
                await kubelet.restart()
                await kubelet.wait_for_registration(FOO, after=registered, timeout=WAIT_S)
                assert socket_identity(ours) != before  # removed; the plugin served anew
                assert answers(plugins / "stranger.sock")

    asyncio.run(scenario())


def test_control_socket_never_replaces_a_file_or_a_live_socket(short_tmp: Path) -> None:
    plugins, state = short_tmp / "plugins", short_tmp / "state"
    state.mkdir()
    control = state / "control.sock"

    async def scenario() -> None:
        control.write_text("someone's file")
        with pytest.raises(SocketPathTaken, match="is not a socket"):
            await Kubelet(plugins, state).start()
        assert control.read_text() == "someone's file"
        control.unlink()
        with listening(control):
            with pytest.raises(SocketPathTaken, match=f"{control} is served by process"):
                await Kubelet(plugins, state).start()
            assert answers(control)
            assert not (plugins / "kubelet.sock").exists()
        # One that someone replaced while the simulator ran is theirs: left at stop.
        kubelet = Kubelet(plugins, state)
        await kubelet.start()
        control.unlink()
        with listening(control):
            await kubelet.stop()
            assert answers(control)

    asyncio.run(scenario())


def test_a_daemon_socket_replaced_while_serving_is_left_at_stop(short_tmp: Path) -> None:
    path = short_tmp / "plugin.sock"

    async def scenario() -> None:
        server = UnixServer(path, lambda _server: None)
        await server.start()
        path.unlink()
        with listening(path):
            await server.stop(0)
            assert answers(path)

    asyncio.run(scenario())


def test_unusable_checkpoint_and_pod_list_are_kept_aside(short_tmp: Path) -> None:
    plugins, state = short_tmp / "plugins", short_tmp / "state"
    state.mkdir()
    (state / "kubelet_internal_checkpoint").write_bytes(b"not a checkpoint")
    (state / "simulator_pods.json").write_text("{broken")

    async def scenario() -> None:
        async with Kubelet(plugins, state, control_socket=False) as kubelet:
            assert kubelet.checkpoint_problem
            assert "kept as" in kubelet.checkpoint_problem
            await kubelet.apply({"metadata": {"name": "p"}, "spec": {"containers": [{}]}})

    asyncio.run(scenario())
    kept = {p.name: p.read_bytes() for p in state.glob("*.unusable-*")}
    assert kept == {
        "kubelet_internal_checkpoint.unusable-1": b"not a checkpoint",
        "simulator_pods.json.unusable-1": b"{broken",
    }


def serve_command(plugins: Path, config: Path, *extra: str) -> list[str]:
    return cli_command(
        "serve",
        "--config",
        str(config),
        "--plugin-dir",
        str(plugins),
        "--log-level",
        "warning",
        *extra,
    )


def test_serve_never_replaces_another_s_feature_file_or_cdi_spec(short_tmp: Path) -> None:
    features = short_tmp / "features"
    features.write_text("vendor.example/thing=1\n")
    cdi = short_tmp / "cdi"
    cdi.mkdir()
    spec = cdi / "devplug-example.com_fake.json"
    config = short_tmp / "config.yaml"
    config.write_text(
        "resources:\n  - name: example.com/fake\n    groups: [{paths: [{path: /dev/null}]}]\n"
        f"    cdi: {{dir: {cdi}}}\n"
    )
    plugins = short_tmp / "plugins"
    for extra, path in ((["--feature-file", str(features)], features), ([], spec)):
        if path == spec:  # one at a time: each stops the daemon
            spec.unlink(missing_ok=True)  # devplug's own, if the first run wrote it
            spec.write_text('{"kind": "other.example/fake"}\n')
        done = subprocess.run(
            serve_command(plugins, config, *extra),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.splitlines()
        assert f"{path} exists and was not written by devplug: left alone" in line
    assert features.read_text() == "vendor.example/thing=1\n"
    assert spec.read_text() == '{"kind": "other.example/fake"}\n'


def test_a_feature_file_rewritten_by_someone_is_left_at_stop(short_tmp: Path) -> None:
    from hw_helpers import wait_for_file

    from devplug.framework.daemon import Daemon
    from devplug.framework.device import Device
    from devplug.framework.plugin import Plugin
    from devplug.outputs.nfd import HEADER, FeatureFile

    features = short_tmp / "features"

    async def scenario() -> None:
        stop = asyncio.Event()
        plugin = Plugin("example.com/widget", [Device("w0")])
        daemon = Daemon([plugin], short_tmp / "plugins", services=[FeatureFile(features)])
        task = asyncio.create_task(daemon.run(stop))
        await wait_for_file(features, lambda t: t is not None and t.startswith(HEADER))
        features.unlink()
        features.write_text("someone.example/else=1\n")
        stop.set()
        await task
        assert features.read_text() == "someone.example/else=1\n"

    asyncio.run(scenario())


def test_the_demo_removes_its_own_folder_only(short_tmp: Path) -> None:
    tmp = short_tmp / "tmp"
    tmp.mkdir()
    (tmp / "keep-me").write_text("not the demo's")
    env = {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run(
        [sys.executable, "-m", "devplug.cli.main", "demo", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp.iterdir()) == ["keep-me"]
    assert (tmp / "keep-me").read_text() == "not the demo's"


def test_status_leaves_the_plugin_folder_as_it_was(short_tmp: Path) -> None:
    plugins, state = short_tmp / "plugins", short_tmp / "state"
    with (
        kubelet_process("--plugin-dir", str(plugins), "--state-dir", str(state)),
        PluginProcess(short_tmp, plugins, [plugin(FOO, [device("d0")])]),
    ):
        control = str(state / "control.sock")
        assert devplug("node", "--control", control, "--wait-for", f"{FOO}=1").returncode == 0
        (plugins / "notes").write_text("keep")
        before = snapshot(plugins)
        pod_resources = str(state / "pod-resources" / "kubelet.sock")
        done = devplug("status", "--pod-resources", pod_resources, "--plugin-dir", str(plugins))
        assert done.returncode == 0, done.stderr
        assert FOO in done.stdout
        assert snapshot(plugins) == before
