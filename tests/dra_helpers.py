"""Helpers for the DRA tests: a node's folders, the daemon as a process, claims."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.sim_helpers import cli_command, stop_process

if TYPE_CHECKING:
    from devplug.simulator import Kubelet

DRIVER = "acc.example.com"
RESOURCE = "example.com/acc"
NODE = "node-a"


@dataclass(frozen=True)
class NodeDirs:
    """The folders of one simulated node (short paths: sockets live there)."""

    root: Path

    @property
    def plugin_dir(self) -> Path:
        return self.root / "dp"

    @property
    def state_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def registry(self) -> Path:
        return self.root / "reg"

    @property
    def plugins(self) -> Path:
        return self.root / "pl"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def claims(self) -> Path:
        return self.root / "claims"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    def make_device(self, name: str) -> Path:
        self.dev.mkdir(exist_ok=True)
        path = self.dev / name
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return path


def kubelet_for(dirs: NodeDirs) -> Any:
    """The simulator's kubelet of the node, claims from its claims folder."""
    from devplug.framework.dra.claims import FileClaims
    from devplug.simulator import Kubelet

    return Kubelet(
        dirs.plugin_dir,
        dirs.state_dir,
        control_socket=False,
        dra_registry_dir=dirs.registry,
        claims=FileClaims(dirs.claims),
    )


def accelerator_config(
    dirs: NodeDirs, models: Mapping[str, str], mode: str = "dra", **extra: Any
) -> Path:
    """A config with one host device per entry of `models` (id -> model)."""
    groups = []
    for device_id, model in models.items():
        path = dirs.dev / device_id
        if not path.exists():
            dirs.make_device(device_id)
        groups.append(
            {
                "id": device_id,
                "paths": [{"path": str(path)}],
                "attributes": {"model": model, "memory": 8 << 30},
            }
        )
    resource = {
        "name": RESOURCE,
        "allowAnyPath": True,
        "mode": mode,
        # In `both` mode the counted name cannot also be the DeviceClass's extended
        # resource: claims only.
        "dra": {
            "driver": DRIVER,
            "attributes": {"vendor": "xilinx"},
            **({"extendedResourceName": ""} if mode == "both" else {}),
        },
        "groups": groups,
        **extra,
    }
    config = dirs.root / "config.yaml"
    config.write_text(yaml.safe_dump({"resources": [resource]}))
    return config


def serve_command(
    dirs: NodeDirs, config: Path, *extra: str, kubeconfig: str | None = None
) -> list[str]:
    args = cli_command(
        "serve",
        "--config",
        str(config),
        "--plugin-dir",
        str(dirs.plugin_dir),
        "--registry-dir",
        str(dirs.registry),
        "--dra-socket-dir",
        str(dirs.plugins),
        "--cdi-dir",
        str(dirs.cdi),
        "--node-name",
        NODE,
    )
    if kubeconfig is None:
        args += ["--claims-dir", str(dirs.claims)]
    else:
        args += ["--kubeconfig", kubeconfig]
    return args + list(extra)


def kubelet_process(dirs: NodeDirs, *args: str) -> subprocess.Popen[str]:
    """`devplug kubelet` on the node's folders with JSON results on stdout; `args` say
    where pods and claims come from."""
    return subprocess.Popen(
        cli_command(
            "kubelet",
            "--plugin-dir",
            str(dirs.plugin_dir),
            "--state-dir",
            str(dirs.state_dir),
            "--registry-dir",
            str(dirs.registry),
            *args,
            "--output",
            "json",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def first_result(kubelet: subprocess.Popen[str]) -> dict[str, Any]:
    """The first pod result the kubelet process prints."""
    assert kubelet.stdout is not None
    lines = iter(kubelet.stdout.readline, "")
    result: dict[str, Any] = json.loads(next(line for line in lines if line.startswith("{")))
    return result


class Daemon:
    """`devplug serve` as a process; stderr goes to a file read at the end."""

    def __init__(
        self,
        command: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        popen: Callable[..., subprocess.Popen[Any]] = subprocess.Popen,
    ) -> None:
        self.log = log
        self._file = log.open("a")
        self.proc = popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=self._file,
            stderr=self._file,
            env={**os.environ, **(env or {})},
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        try:
            return stop_process(self.proc, sig, timeout=15)
        finally:
            self._file.close()

    def output(self) -> str:
        return self.log.read_text()


def allocated_claim(
    name: str, uid: str, devices: Sequence[str], *, request: str = "acc", namespace: str = "default"
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: allocated to `devices` of our pool."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": DRIVER, "pool": NODE, "device": d}
                        for d in devices
                    ]
                }
            }
        },
    }


def claim_pod(name: str, claim: str, *, pod_claim: str = "acc") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": pod_claim, "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"claims": [{"name": pod_claim}]},
                }
            ],
        },
    }


@contextlib.asynccontextmanager
async def serving(dirs: NodeDirs, config: Path, *drivers: str) -> AsyncIterator[Kubelet]:
    """The simulated kubelet with the real daemon serving `config`, its `drivers` (by
    default DRIVER) registered."""
    async with kubelet_for(dirs) as kubelet:
        daemon = Daemon(serve_command(dirs, config), dirs.root / "daemon.log")
        try:
            for driver in drivers or (DRIVER,):
                await kubelet.wait_for_registration(driver)
            yield kubelet
        finally:
            daemon.stop()


def write_claim(dirs: NodeDirs, name: str, uid: str, devices: list[str]) -> None:
    dirs.claims.mkdir(exist_ok=True)
    (dirs.claims / f"{name}.yaml").write_text(yaml.safe_dump(allocated_claim(name, uid, devices)))
