"""Helpers for the simulator tests: plugin processes, pod manifests, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from devplug.testing import pod_manifest

FOO = "example.com/foo"
BAR = "example.com/bar"

# A plugin process built from a JSON spec: {"plugin_dir": ..., "plugins": [{"resource",
# "socket", "devices": [{"id", "numa", "healthy", "env", "nodes", "mounts", "cdi",
# "annotations"}], "preferred": "reverse" | "fail" | null, "pre_start_log": path | null,
# "pre_start_fail": bool, "allocate_fail": message | null}]}.
PLUGIN_SCRIPT = """
import json
import sys
from pathlib import Path

import devplug
from devplug import AllocationError, Device, DeviceNode, Mount, Plugin

spec = json.loads(Path(sys.argv[1]).read_text())


class SimPlugin(Plugin):
    def __init__(self, p):
        devices = [
            Device(
                d["id"],
                healthy=d.get("healthy", True),
                numa_nodes=d.get("numa", []),
                nodes=[DeviceNode(n) for n in d.get("nodes", [])],
                mounts=[Mount(m, read_only=True) for m in d.get("mounts", [])],
                env=d.get("env", {}),
                annotations=d.get("annotations", {}),
                cdi_devices=d.get("cdi", []),
            )
            for d in p["devices"]
        ]
        super().__init__(p["resource"], devices, socket_name=p.get("socket"))
        self.mode = p.get("preferred")
        self.preferred_allocation = self.mode is not None
        self.log = p.get("pre_start_log")
        self.fail = p.get("pre_start_fail", False)
        self.allocate_fail = p.get("allocate_fail")

    async def allocate(self, devices):
        if self.allocate_fail:
            raise AllocationError(self.allocate_fail)
        return await super().allocate(devices)

    async def preferred(self, available, must_include, size):
        if self.mode == "fail":
            raise AllocationError("no opinion today")
        if self.mode == "reverse":
            picked = [d.id for d in must_include]
            for device in reversed(available):
                if len(picked) == size:
                    break
                if device.id not in picked:
                    picked.append(device.id)
            return picked
        return await super().preferred(available, must_include, size)


class PreStartPlugin(SimPlugin):
    async def pre_start(self, devices):
        with open(self.log, "a") as handle:
            handle.write(",".join(d.id for d in devices) + "\\n")
        if self.fail:
            raise AllocationError("device is still resetting")


plugins = [
    (PreStartPlugin if p.get("pre_start_log") else SimPlugin)(p) for p in spec["plugins"]
]
devplug.run(*plugins, plugin_dir=spec["plugin_dir"])
"""


def device(
    device_id: str, numa: Sequence[int] = (), healthy: bool = True, **extra: Any
) -> dict[str, Any]:
    return {"id": device_id, "numa": list(numa), "healthy": healthy, **extra}


def plugin(resource: str, devices: Sequence[Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"resource": resource, "devices": list(devices), **extra}


def stop_process(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10
) -> int:
    """Signal a process and reap it; killed if it outlives `timeout` (then the
    TimeoutExpired goes on, failing the test)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class PluginProcess:
    """Device plugins served by a real `devplug.run` process."""

    def __init__(self, tmp: Path, plugin_dir: Path, plugins: Sequence[Mapping[str, Any]]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        script = tmp / "sim_plugin.py"
        script.write_text(PLUGIN_SCRIPT)
        index = len(list(tmp.glob("plugin-spec-*.json")))
        spec = tmp / f"plugin-spec-{index}.json"
        spec.write_text(json.dumps({"plugin_dir": str(plugin_dir), "plugins": list(plugins)}))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(spec)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return stop_process(self.proc, sig)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def close(self) -> str:
        self.stop()
        assert self.proc.stderr is not None
        errors = self.proc.stderr.read()
        self.proc.stderr.close()
        return errors

    def __enter__(self) -> PluginProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pod(
    name: str,
    containers: Mapping[str, Mapping[str, int | str]],
    init: Mapping[str, Mapping[str, int | str]] | None = None,
    *,
    namespace: str | None = None,
    sidecars: Sequence[str] = (),
    requests: Mapping[str, Mapping[str, int | str]] | None = None,
) -> dict[str, Any]:
    """`pod_manifest` with limits only (the API server defaults requests to them);
    `requests` sets a container's requests explicitly."""
    manifest = pod_manifest(
        name, containers, init_containers=init, sidecars=sidecars, namespace=namespace
    )
    spec = manifest["spec"]
    for entry in [*spec["containers"], *spec.get("initContainers", [])]:
        resources = entry.setdefault("resources", {})
        resources.pop("requests", None)
        if requests and entry["name"] in requests:
            resources["requests"] = dict(requests[entry["name"]])
    return manifest


def pods_yaml(*manifests: Mapping[str, Any]) -> str:
    return yaml.safe_dump_all([dict(m) for m in manifests], sort_keys=False)


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "devplug.cli.main", *args]


def devplug(
    *args: str,
    stdin: str | None = None,
    timeout: float = 30,
    cwd: Path | None = None,
    user: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`devplug ARGS` (as `user` and its group, nothing more, when given: setpriv)."""
    become = []
    if user is not None:
        become = ["setpriv", f"--reuid={user}", f"--regid={user_group(user)}", "--clear-groups"]
    return subprocess.run(
        [*become, *cli_command(*args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
        cwd=cwd,
    )


def user_group(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid


@contextmanager
def kubelet_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`devplug kubelet ARGS`, once it said it is ready; yields it and its ready line."""
    proc = subprocess.Popen(
        cli_command("kubelet", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        if not ready.startswith("kubelet simulator ready"):
            proc.kill()
            _, errors = proc.communicate()
            raise AssertionError(f"devplug kubelet did not start: {ready!r} {errors}")
        yield proc, ready
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
