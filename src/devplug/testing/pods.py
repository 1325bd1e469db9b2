"""Pods for the synchronous harness: a manifest from a compact request, and the
kubelet's answer to one pod with shortcuts into its containers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug.simulator import ContainerResult, PodResult, RuntimeOptions


def pod_manifest(
    name: str,
    containers: Mapping[str, Mapping[str, int | str]] | None = None,
    *,
    init_containers: Mapping[str, Mapping[str, int | str]] | None = None,
    sidecars: Sequence[str] = (),
    namespace: str | None = None,
) -> dict[str, Any]:
    """A Pod manifest from container name -> {extended resource: count}; requests are set
    equal to limits, as the API server requires. `sidecars` names init containers that
    get `restartPolicy: Always`."""

    def container(cname: str, resources: Mapping[str, int | str], init: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": cname, "image": "busybox"}
        if resources:
            entry["resources"] = {"limits": dict(resources), "requests": dict(resources)}
        if init and cname in sidecars:
            entry["restartPolicy"] = "Always"
        return entry

    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {
        "containers": [container(n, r, False) for n, r in (containers or {}).items()]
    }
    if init_containers:
        spec["initContainers"] = [container(n, r, True) for n, r in init_containers.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def is_compact(value: Mapping[str, Any]) -> bool:
    """Whether `value` is a bare {extended resource: count} request."""
    return bool(value) and all(
        "/" in str(k) and isinstance(v, int | str) and not isinstance(v, bool)
        for k, v in value.items()
    )


@dataclass(frozen=True)
class PodAdmission:
    """The kubelet's answer to one pod, with shortcuts into its containers.

    The shortcuts take a container name; without one they read the pod's only app
    container (ValueError when it has several)."""

    result: PodResult

    @property
    def name(self) -> str:
        return self.result.name

    @property
    def namespace(self) -> str:
        return self.result.namespace

    @property
    def uid(self) -> str:
        return self.result.uid

    @property
    def admitted(self) -> bool:
        return self.result.admitted

    @property
    def reason(self) -> str:
        """The kubelet's reason for a rejection (`UnexpectedAdmissionError`,
        `TopologyAffinityError`, `Invalid`...); empty when admitted."""
        return self.result.reason

    @property
    def message(self) -> str:
        return self.result.message

    @property
    def containers(self) -> list[ContainerResult]:
        """Init containers first, then app containers; empty when rejected."""
        return self.result.containers

    def container(self, name: str | None = None) -> ContainerResult:
        if not self.admitted:
            raise ValueError(
                f"pod {self.namespace}/{self.name} was rejected: {self.reason}: {self.message}"
            )
        if name is not None:
            for container in self.containers:
                if container.name == name:
                    return container
            raise KeyError(f"pod {self.name} has no container {name!r}")
        app = [c for c in self.containers if not c.init]
        if len(app) != 1:
            names = ", ".join(c.name for c in app)
            raise ValueError(f"pod {self.name} has containers {names}: name one")
        return app[0]

    def devices(self, container: str | None = None) -> dict[str, list[str]]:
        """Resource -> device IDs allocated to the container."""
        return self.container(container).devices

    def options(self, container: str | None = None) -> RuntimeOptions:
        """What the kubelet adds to the container's CRI CreateContainer request."""
        return self.container(container).options

    def env(self, container: str | None = None) -> dict[str, str]:
        return {kv.name: kv.value for kv in self.options(container).envs}

    def annotations(self, container: str | None = None) -> dict[str, str]:
        return {kv.name: kv.value for kv in self.options(container).annotations}

    def device_nodes(self, container: str | None = None) -> dict[str, str]:
        """Container path -> host path of each device node."""
        return {d.container_path: d.host_path for d in self.options(container).devices}

    def mounts(self, container: str | None = None) -> dict[str, str]:
        """Container path -> host path of each mount."""
        return {m.container_path: m.host_path for m in self.options(container).mounts}

    def cdi_devices(self, container: str | None = None) -> list[str]:
        return list(self.options(container).cdi_devices)

    def __str__(self) -> str:
        from devplug.simulator.report import results_text

        return results_text([self.result])
