"""Starting a pod's containers, as the kubelet does once the pod is admitted: per
container in order, PreStartContainer where the plugin asks for it, then the runtime
options of the CRI CreateContainer request (with the CDI devices of the container's
prepared DRA claims). An init container that fails to start blocks those after it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import msgspec

from devplug.simulator.manager import AdmissionError, DeviceManager
from devplug.simulator.pods import PodSpec
from devplug.simulator.results import (
    CREATE_CONTAINER_CONFIG_ERROR,
    STARTED,
    WAITING,
    ContainerResult,
    PodResult,
    RuntimeOptions,
)

log = logging.getLogger("devplug.simulator.kubelet")


# The options of a container whose runtime options are not asked for.
NO_OPTIONS = RuntimeOptions()


async def start_containers(
    manager: DeviceManager,
    pod: PodSpec,
    cdi: Mapping[str, list[str]],
    *,
    runtime_options: bool = True,
) -> list[ContainerResult]:
    """Start the containers in order: PreStartContainer where the plugin asks for it,
    then the runtime options of the CRI CreateContainer request (left empty where
    `runtime_options` is false: no container runtime takes them)."""
    results = []
    blocked = False
    for container in pod.all_containers:
        devices = container_devices(manager, pod.uid, container.name)
        options = (
            with_cdi(manager.run_options(pod.uid, container.name), cdi.get(container.name, []))
            if runtime_options
            else NO_OPTIONS
        )
        if blocked:
            results.append(
                ContainerResult(
                    container.name,
                    container.init,
                    WAITING,
                    devices,
                    options,
                    message="an init container before it did not start",
                )
            )
            continue
        try:
            called = await manager.pre_start(pod, container)
        except AdmissionError as error:
            log.warning(
                "pod %s/%s container %s: %s", pod.namespace, pod.name, container.name, error
            )
            results.append(
                ContainerResult(
                    container.name,
                    container.init,
                    CREATE_CONTAINER_CONFIG_ERROR,
                    devices,
                    options,
                    message=str(error),
                )
            )
            blocked = blocked or container.init
            continue
        results.append(
            ContainerResult(
                container.name, container.init, STARTED, devices, options, pre_started=called
            )
        )
    return results


def restored_result(
    manager: DeviceManager, spec: PodSpec, cdi: Mapping[str, list[str]]
) -> PodResult:
    """A running pod's result after a restart: its containers started, their devices
    and options read back from the checkpoint (and `cdi`, the prepared claims)."""
    containers = [
        ContainerResult(
            c.name,
            c.init,
            STARTED,
            container_devices(manager, spec.uid, c.name),
            with_cdi(manager.run_options(spec.uid, c.name), cdi.get(c.name, [])),
        )
        for c in spec.all_containers
    ]
    return PodResult(spec.name, spec.namespace, spec.uid, True, containers=containers)


def container_devices(manager: DeviceManager, pod_uid: str, container: str) -> dict[str, list[str]]:
    """The device IDs a container holds, by resource."""
    held = manager.container_devices(pod_uid, container)
    return {resource: held[resource].ids() for resource in sorted(held)}


def with_cdi(options: RuntimeOptions, cdi: Sequence[str]) -> RuntimeOptions:
    """The options with the CDI devices of the container's prepared claims added."""
    if not cdi:
        return options
    merged = list(dict.fromkeys([*options.cdi_devices, *cdi]))
    return msgspec.structs.replace(options, cdi_devices=merged)
