"""Nothing devplug did not create is removed, replaced or truncated: one test per place
where devplug removes, replaces or truncates a file or socket (the simulator's start and
restart, its control socket, checkpoint and pod list, a daemon's sockets, the CDI and NFD
outputs, the demo's folder, `devplug status`), against real sockets that answer."""

from __future__ import annotations

import ast
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

from devplug.ground.unixserver import SocketPathTaken, UnixServer, socket_identity
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

    def listing() -> list[str]:
        """Each entry's inode, type and path: what a start that touched them would change.

        Link counts and times are left out, because the kubelet itself adds and removes pod folders
        meanwhile; the checkpoint's inode too, because the kubelet rewrites it by rename.
        """
        found = ("find", folder, "/var/lib/kubelet", "-maxdepth", "1", "-printf", "%i %y %p\\n")
        out = real_node.exec(*found)
        lines = []
        for line in out.stdout.splitlines():
            _inode, kind, path = line.split(" ", 2)
            lines.append(f"{kind} {path}" if path.endswith("_checkpoint") else line)
        return sorted(set(lines))

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


async def test_simulator_start_removes_only_sockets_nobody_serves(short_tmp: Path) -> None:
    plugins = short_tmp / "plugins"
    plugins.mkdir()
    stale(plugins / "dead.sock")
    (plugins / "notes.sock").write_text("a file, not a socket")
    (plugins / "folder.sock").mkdir()
    (plugins / "link.sock").symlink_to(plugins / "notes.sock")

    with listening(plugins / "alive.sock"):
        async with Kubelet(plugins, short_tmp / "state", control_socket=False):
            assert not (plugins / "dead.sock").exists()
            assert answers(plugins / "alive.sock")
            assert (plugins / "notes.sock").read_text() == "a file, not a socket"
            assert (plugins / "folder.sock").is_dir()
            assert (plugins / "link.sock").is_symlink()


async def test_simulator_restart_removes_its_plugins_sockets_only(short_tmp: Path) -> None:
    plugins = short_tmp / "plugins"

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


async def test_control_socket_never_replaces_a_file_or_a_live_socket(short_tmp: Path) -> None:
    plugins, state = short_tmp / "plugins", short_tmp / "state"
    state.mkdir()
    control = state / "control.sock"

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


async def test_a_daemon_socket_replaced_while_serving_is_left_at_stop(short_tmp: Path) -> None:
    path = short_tmp / "plugin.sock"

    server = UnixServer(path, lambda _server: None)
    await server.start()
    path.unlink()
    with listening(path):
        await server.stop(0)
        assert answers(path)


async def test_unusable_checkpoint_and_pod_list_are_kept_aside(short_tmp: Path) -> None:
    plugins, state = short_tmp / "plugins", short_tmp / "state"
    state.mkdir()
    (state / "kubelet_internal_checkpoint").write_bytes(b"not a checkpoint")
    (state / "simulator_pods.json").write_text("{broken")

    async with Kubelet(plugins, state, control_socket=False) as kubelet:
        assert kubelet.checkpoint_problem
        assert "kept as" in kubelet.checkpoint_problem
        await kubelet.apply({"metadata": {"name": "p"}, "spec": {"containers": [{}]}})
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


async def test_a_feature_file_rewritten_by_someone_is_left_at_stop(short_tmp: Path) -> None:
    from hw_helpers import wait_for_file

    from devplug.framework.daemon import Daemon
    from devplug.framework.device import Device
    from devplug.framework.plugin import Plugin
    from devplug.outputs.nfd import HEADER, FeatureFile

    features = short_tmp / "features"

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


# -- ownership: what another live devplug owns --------------------------------------------


class Served:
    """A real `devplug serve` whose log (stderr) goes to a file, stopped with SIGTERM."""

    def __init__(self, folder: Path, config: Path, name: str, *extra: str) -> None:
        self.log = folder / f"{name}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                cli_command(
                    "serve", "--config", str(config), "--plugin-dir", str(folder / name), *extra
                ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def wait_log(self, text: str) -> str:
        """The log once it holds `text`, woken by inotify on it."""
        from serve_helpers import wait_for_log

        assert self.proc.poll() is None, self.log.read_text()
        return wait_for_log(self.log, text, timeout=WAIT_S)

    def stop(self, sig: int = 15) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=WAIT_S)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(9)


def _shared_output(short_tmp: Path, kind: str) -> tuple[Path, Path, tuple[str, ...]]:
    """(config, the shared file, extra serve flags) of one output class."""
    cdi = short_tmp / "cdi"
    config = short_tmp / "config.yaml"
    config.write_text(
        "resources:\n  - name: example.com/fake\n    groups: [{paths: [{path: /dev/null}]}]\n"
        f"    cdi: {{dir: {cdi}}}\n"
    )
    if kind == "CDI spec":
        return config, cdi / "devplug-example.com_fake.json", ()
    features = short_tmp / "features.d" / "devplug"
    return config, features, ("--feature-file", str(features))


@pytest.mark.parametrize("kind", ["CDI spec", "feature file"])
def test_a_second_devplug_never_removes_the_first_s_live_file_and_the_owner_restores_it(
    short_tmp: Path, kind: str
) -> None:
    """Two devplugs on one node (a DaemonSet and `devplug serve --plugin-dir ...`, or two
    pods of a rolling update) want the same file: the first owns it, the second leaves it
    alone and stops without removing it; the owner writes it again when someone removes
    it, and when the owner dies (SIGKILL: no clean-up) the other takes the file over."""
    from hw_helpers import wait_file

    config, shared, extra = _shared_output(short_tmp, kind)
    lock = shared.with_name(f".{shared.name}.owner")
    with Served(short_tmp, config, "first", *extra) as first:
        written = wait_file(shared, lambda t: t is not None and "example.com" in t)
        assert f"pid {first.proc.pid} " in lock.read_text()
        with Served(short_tmp, config, "second", *extra) as second:
            said = second.wait_log(f"{shared} is kept by a live devplug (pid {first.proc.pid} ")
            assert "written here when that one stops" in said
            second.stop()
        assert second.proc.returncode == 0
        assert shared.read_text() == written  # the first one's, still there
        shared.unlink()  # someone removes it: the owner writes it again
        assert wait_file(shared, lambda t: t is not None) == written
        with Served(short_tmp, config, "third", *extra) as third:
            third.wait_log("is kept by a live devplug")
            first.stop(9)  # the owner dies: its lock goes with it
            third.wait_log(f"{shared} written again")
            assert shared.read_text() == written
            assert f"pid {third.proc.pid} " in lock.read_text()
            third.stop()
        assert not shared.exists()  # the owner's own, removed at stop
        assert not lock.exists()


def test_the_config_manager_replaces_only_its_link_never_a_file(tmp_path: Path) -> None:
    import argparse

    from devplug.cli.nvidia_config_manager import update

    available = tmp_path / "available"
    available.mkdir()
    (available / "a").write_text("version: v1\n")
    destination = tmp_path / "config.yaml"
    destination.write_text("someone's own config\n")
    args = argparse.Namespace(
        config_file_srcdir=str(available),
        config_file_dst=str(destination),
        default_config="a",
        fallback_strategies="",
    )
    with pytest.raises(ValueError, match="is not a link the config manager made: left alone"):
        update(args, "")
    assert destination.read_text() == "someone's own config\n"
    destination.unlink()
    assert update(args, "")  # its own link, then replaced as the label changes
    assert os.readlink(destination) == str(available / "a")


# Every place in devplug that removes, renames over, truncates or atomically replaces a
# file, and what makes it touch only what it owns. A new place fails the test below until
# it is added here with its rule (and a test of its own above).
OWNED_PLACES = {
    "cli/fleet.py:_check:rmtree": "its own mkdtemp folder",
    "cli/nvidia_config_manager.py:update:replace": "only a link (test_the_config_manager...)",
    "cli/fleet.py:_run_up:rmtree": "its own mkdtemp folder",
    "cli/plan.py:run:rmtree": "its own mkdtemp folder",
    "cluster/cluster.py:Cluster.kill_now:rmtree": "its own mkdtemp folder (_own_root)",
    "demo/script.py:_make_workdir:rmdir": "the empty folder it made (test_the_demo_removes...)",
    "demo/script.py:run_demo:rmtree": "the folder it made",
    "framework/debug.py:DebugState.dump:write_atomic": "the dump file its env var names",
    "framework/dra/metadata.py:remove:rmtree": "a claim's folder, under serialize.lock",
    "framework/dra/metadata.py:write:write_atomic": "a claim's file, under serialize.lock",
    "framework/dra/prepare.py:Preparer._save:write_atomic": "checkpoint under serialize.lock",
    "framework/dra/prepare.py:Preparer.unprepare:remove_quietly": "claim spec, checkpointed",
    "framework/dra/publisher.py:FolderSlicePublisher._sync:remove_quietly": "its slices",
    "framework/dra/publisher.py:FolderSlicePublisher._sync:write_atomic": "its slices",
    "ground/unixserver.py:UnixServer.start:unlink": "a stale socket (connect refused)",
    "ground/unixserver.py:UnixServer.stop:unlink": "its socket, same identity",
    "ground/unixserver.py:_link_into_place:unlink": "its hidden temporary socket",
    "ground/unixserver.py:bind_problem:unlink": "its probe socket",
    "ground/unixserver.py:clear_stale_socket:unlink": "a stale socket (connect refused)",
    "fakes/gpus.py:FakeGpuHost.write:write_atomic": "the description of the host it made",
    "fakes/mps.py:_Daemon.serve:unlink": "its control endpoint, in its pipe folder",
    "fakes/nvml/driver.py:_save:write_atomic": "the fake host's description, MIG written back",
    "fakes/sysfs.py:FakeSysfs._link:unlink": "a link of the tree it built",
    "fakes/sysfs.py:FakeSysfs.remove:rmtree": "a device folder of the tree it built",
    "fakes/sysfs.py:FakeSysfs.remove:unlink": "links and nodes of the tree it built",
    "framework/cdi.py:write_spec:write_atomic": "a DRA claim spec, under serialize.lock",
    "ground/files.py:OwnedFile.remove:remove_quietly": "owner lock held, same identity",
    "ground/files.py:OwnedFile.write:write_atomic": "owner lock held, content devplug's",
    "ground/files.py:OwnerLock.acquire:ftruncate": "the lock file it holds",
    "ground/files.py:OwnerLock.release:unlink": "the lock file it holds",
    "ground/files.py:keep_aside:unlink": "after a hard link keeps the file",
    "ground/files.py:remove_quietly:unlink": "the helper above",
    "ground/files.py:write_atomic:replace": "the helper above",
    "ground/files.py:write_atomic:unlink": "its own temporary file",
    "simulator/checkpoint.py:CheckpointWriter.write:write_atomic": "state dir, control lock",
    "simulator/checkpoint.py:write:write_atomic": "state dir, control lock",
    "simulator/control.py:ControlServer.stop:unlink": "its socket, same identity",
    "simulator/dra.py:DraManager._save:write_atomic": "state dir, control lock",
    "simulator/plugindir.py:cleanup_plugin_dir:unlink": "stale sockets only",
    "simulator/plugindir.py:kept_aside:keep_aside": "kept aside, never lost",
    "simulator/plugindir.py:leave_dead_socket:unlink": "its own socket",
    "simulator/podlist.py:PodList._kept_aside:keep_aside": "kept aside, never lost",
    "simulator/podlist.py:PodList._rewrite:write_atomic": "state dir, control lock",
}
_REMOVING = {"unlink", "remove_quietly", "rmtree", "rmdir", "write_atomic", "keep_aside",
             "truncate", "ftruncate", "rename", "renames"}  # fmt: skip


class _RemovingCalls(ast.NodeVisitor):
    """The calls of one module that can remove or replace a file, with their scope."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.found: set[str] = set()

    def visit_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_scope

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        on_os = isinstance(func, ast.Attribute) and ast.unparse(func.value) in ("os", "shutil")
        if name in _REMOVING or (name in ("replace", "remove") and on_os):
            self.found.add(f"{self.module}:{'.'.join(self.scope)}:{name}")
        self.generic_visit(node)


def removing_places() -> set[str]:
    """'module:Class.function:call' of each call in src/devplug (testing/ aside) that can
    remove or replace a file: os/shutil/Path calls and devplug's own helpers."""
    import devplug

    root = Path(devplug.__file__).parent
    found: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if "testing" not in path.relative_to(root).parts:
            visitor = _RemovingCalls(str(path.relative_to(root)))
            visitor.visit(ast.parse(path.read_text()))
            found |= visitor.found
    return found


def test_every_place_that_removes_or_replaces_a_file_is_one_that_checks_ownership() -> None:
    found = removing_places()
    new = sorted(found - OWNED_PLACES.keys())
    assert not new, (
        f"new places that remove or replace files: {new}; make each touch only what this "
        "process owns (outputs.files.OwnedFile for a file others share) and list it here"
    )
    assert not OWNED_PLACES.keys() - found, "listed places that no longer exist"


def test_an_owner_whose_lock_file_is_removed_takes_the_lock_anew(short_tmp: Path) -> None:
    """Someone removes the hidden lock file of a live owner: the owner makes it again and
    holds it, so a second devplug cannot become a second owner of the same file."""
    from devplug.ground.files import OwnedElsewhere, OwnedFile

    path = short_tmp / "cdi" / "devplug-example.com_x.json"
    first = OwnedFile(path, lambda _data: True)
    assert first.write('{"kind": "example.com/x"}\n')
    first.lock.path.unlink()
    assert first.lock.acquire()  # what its keeper does on the folder event
    assert first.lock.path.exists()
    # A second owner, as another process would be (flock is per open file, not per pid).
    second = OwnedFile(path, lambda _data: True)
    with pytest.raises(OwnedElsewhere, match="is kept by a live devplug"):
        second.write('{"kind": "example.com/x", "other": 1}\n')
    second.remove()
    assert path.read_text() == '{"kind": "example.com/x"}\n'
    first.remove()
    assert not path.exists()
    assert not first.lock.path.exists()
