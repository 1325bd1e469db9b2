"""Security properties of the daemon, each checked on the real thing: socket modes,
links and foreign files in the plugin folder, config paths, limits, no shell."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest
from fault_harness import (
    NODE,
    VIRT,
    WAIT_S,
    Serve,
    make_nodes,
    new_kubelet,
    node_config,
    serving,
    virt_config,
    wait_for_path,
)

from devplug.api.constants import KUBELET_SOCKET
from devplug.framework.plugin import default_socket_name
from devplug.sources import ConfigError, parse_config

SRC = Path(__file__).resolve().parents[2] / "src" / "devplug"


async def test_sockets_are_0600(short_tmp: Path) -> None:
    plugin_dir = short_tmp / "plugins"
    async with (
        new_kubelet(short_tmp, plugin_dir) as kubelet,
        serving(Serve(short_tmp, virt_config(2), plugin_dir)),
    ):
        await kubelet.wait_for_resource(VIRT, count=2, timeout=WAIT_S)
        mode = (plugin_dir / default_socket_name(VIRT)).lstat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600


async def test_a_linked_kubelet_sock_is_not_followed(short_tmp: Path) -> None:
    """kubelet.sock in the plugin folder is a link to a kubelet elsewhere: the daemon
    does not register through it."""

    elsewhere, plugin_dir = short_tmp / "elsewhere", short_tmp / "plugins"
    plugin_dir.mkdir()
    async with new_kubelet(short_tmp, elsewhere) as kubelet:
        (plugin_dir / KUBELET_SOCKET).symlink_to(elsewhere / KUBELET_SOCKET)
        async with serving(Serve(short_tmp, virt_config(2), plugin_dir)) as serve:
            await serve.wait_for_log("kubelet.sock is not a socket: not registering")
            assert kubelet.registrations(VIRT) == 0
            assert serve.running


async def test_a_file_that_took_the_socket_path_is_never_removed(short_tmp: Path) -> None:
    """Someone replaces the daemon's socket with a file of their own: the daemon says
    so, leaves it, and leaves it at shutdown too."""

    plugin_dir = short_tmp / "plugins"
    socket_path = plugin_dir / default_socket_name(VIRT)
    async with new_kubelet(short_tmp, plugin_dir) as kubelet:
        serve = Serve(short_tmp, virt_config(2), plugin_dir)
        async with serving(serve):
            await kubelet.wait_for_resource(VIRT, count=2, timeout=WAIT_S)
            theirs = short_tmp / "theirs"
            theirs.write_text("theirs")
            os.replace(theirs, socket_path)
            await serve.wait_for_log("exists and is not a socket: it is left alone")
        assert await serve.stop() == 0
        assert socket_path.read_text() == "theirs"


async def test_devices_beyond_the_limit_are_left_out_with_an_error(short_tmp: Path) -> None:
    plugin_dir, dev = short_tmp / "plugins", short_tmp / "dev"
    make_nodes(dev, 4)
    limits = "limits:\n  maxDevicesPerResource: 5\n"
    async with new_kubelet(short_tmp, plugin_dir) as kubelet:
        serve = Serve(short_tmp, node_config(dev, 2, limits=limits), plugin_dir)
        async with serving(serve):
            status = await kubelet.wait_for_resource(NODE, count=5, timeout=WAIT_S)
            assert status.capacity == 5
            (line,) = await serve.wait_for_log("more than the limit")
            assert "8 devices, more than the limit of 5" in line


@pytest.mark.parametrize(
    ("snippet", "field", "problem"),
    [
        ("groups: [{paths: [{path: /dev/../etc/shadow}]}]", "paths[0].path", "contains '..'"),
        ("groups: [{paths: [{path: /etc/shadow}]}]", "paths[0].path", "outside /dev"),
        (
            "groups: [{paths: [{path: /dev/null, containerPath: /dev/../x}]}]",
            "paths[0].containerPath",
            "contains '..'",
        ),
        (
            "groups: [{paths: [{path: /dev/null}], mounts: [{hostPath: /opt/../etc}]}]",
            "mounts[0].hostPath",
            "contains '..'",
        ),
        (
            "groups: [{paths: [{path: /dev/null}], mounts: [{hostPath: /opt/*}]}]",
            "mounts[0].hostPath",
            "globs are not expanded",
        ),
        (
            "groups: [{paths: [{path: /dev/null}], mounts: [{hostPath: relative}]}]",
            "mounts[0].hostPath",
            "expected an absolute path",
        ),
    ],
)
def test_config_paths_are_checked(snippet: str, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(f"resources:\n  - name: example.com/a\n    {snippet}\n", "c.yaml")
    message = str(refused.value)
    assert message.startswith(f"c.yaml: resources[0].groups[0].{field}: "), message
    assert problem in message


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ("maxStreams: 0", "limits.maxStreams: expected a value from 1 to 1024, got 0"),
        ("maxRequestBytes: 10", "limits.maxRequestBytes: expected a value from 1024"),
        ("maxIdsPerRequest: 0", "limits.maxIdsPerRequest: expected a value from 1"),
        ("registerTimeoutSeconds: 0", "limits.registerTimeoutSeconds: expected a value"),
        ("maxStream: 3", "limits.maxStream: unknown key"),
    ],
)
def test_limits_out_of_range_are_refused(limits: str, message: str) -> None:
    text = f"resources: [{{name: example.com/a, virtual: 1}}]\nlimits: {{{limits}}}\n"
    with pytest.raises(ConfigError) as refused:
        parse_config(text, "c.yaml")
    assert str(refused.value).startswith(f"c.yaml: {message}")


def test_more_devices_than_the_limit_is_a_config_error() -> None:
    text = (
        "resources: [{name: example.com/a, virtual: 100, count: 200}]\n"
        "limits: {maxDevicesPerResource: 10000}\n"
    )
    with pytest.raises(ConfigError) as refused:
        parse_config(text, "c.yaml")
    assert str(refused.value) == (
        "c.yaml: resources[0]: 20000 devices (replicas included), more than "
        "limits.maxDevicesPerResource (10000)"
    )


SHELL_CALLS = {"system", "popen", "getoutput", "getstatusoutput", "create_subprocess_shell"}


def test_no_shell_anywhere_and_no_process_from_the_daemon() -> None:
    """No call in devplug passes shell=True or goes through a shell, and the modules of
    the serving daemon start no process at all: no config value reaches a shell."""
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    shell = keyword.arg == "shell"
                    assert not (shell and getattr(keyword.value, "value", None) is not False), (
                        f"{path}:{node.lineno}: shell="
                    )
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                assert name not in SHELL_CALLS, f"{path}:{node.lineno}: {name}()"
            if path.parent.name == "framework" and isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "subprocess" not in names, f"{path}:{node.lineno}: imports subprocess"


async def test_plugin_folder_is_watched_for_the_fix(short_tmp: Path) -> None:
    """A stale plain file at the socket path is left alone; once its owner removes it,
    the daemon serves at once (an inotify event, not a timer)."""

    plugin_dir = short_tmp / "plugins"
    plugin_dir.mkdir()
    socket_path = plugin_dir / default_socket_name(VIRT)
    socket_path.write_text("stale")
    async with serving(Serve(short_tmp, virt_config(2), plugin_dir)) as serve:
        await serve.wait_for_log("left alone")
        socket_path.unlink()
        await wait_for_path(socket_path, socket_path.is_socket, "the socket")
