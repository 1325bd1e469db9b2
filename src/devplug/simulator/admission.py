"""Pod admission on the simulated node, in the kubelet's order: a pod that runs again
is unchanged, a clash of name or UID is refused, then the kubelet's admission
(`pipeline.admit_pod`, which the fleet shares): the device and topology managers admit
it, DRA prepares its claims, and its containers start.

An admitted pod is kept in the pod manager; a rejected one holds no devices and is not
kept. Each outcome is an event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from devplug.simulator.events import POD_ADMITTED, POD_REJECTED
from devplug.simulator.manager import DeviceManager
from devplug.simulator.pipeline import Refusal, admit_pod
from devplug.simulator.podmanager import PodManager, same_pod
from devplug.simulator.pods import InvalidPod, PodSpec
from devplug.simulator.results import REASON_ALREADY_EXISTS, REASON_INVALID, PodResult

if TYPE_CHECKING:
    from devplug.simulator.dra import DraManager

log = logging.getLogger("devplug.simulator.kubelet")

# emit(kind, pod "namespace/name", detail)
Emit = Callable[[str, str, str], None]


async def admit(
    item: PodSpec | InvalidPod,
    manager: DeviceManager,
    dra: DraManager | None,
    pods: PodManager,
    emit: Emit,
) -> PodResult:
    """Admit one pod (or refuse a manifest that is not one) and start its containers."""

    def rejected(name: str, namespace: str, uid: str, reason: str, message: str) -> PodResult:
        log.warning("pod %s/%s rejected: %s: %s", namespace, name, reason, message)
        emit(POD_REJECTED, f"{namespace}/{name}", f"{reason}: {message}")
        return PodResult(name, namespace, uid, False, reason, message)

    if isinstance(item, InvalidPod):
        return rejected(item.name, item.namespace, "", REASON_INVALID, item.message)
    existing = pods.get(item.namespace, item.name)
    if existing is not None and same_pod(existing.spec, item):
        return msgspec.structs.replace(existing.result, unchanged=True)
    if existing is not None or pods.has_uid(item.uid):
        return rejected(
            item.name,
            item.namespace,
            item.uid,
            REASON_ALREADY_EXISTS,
            f'pods "{item.name}" already exists with another spec (or uid); delete it '
            "to apply this one",
        )
    admitted = await admit_pod(item, manager, dra.pod_claims if dra is not None else None)
    if isinstance(admitted, Refusal):
        return rejected(item.name, item.namespace, item.uid, admitted.reason, admitted.message)
    containers = admitted
    result = PodResult(item.name, item.namespace, item.uid, True, containers=containers)
    pods.add(item, result)
    log.info("pod %s/%s admitted", item.namespace, item.name)
    emit(POD_ADMITTED, f"{item.namespace}/{item.name}", "")
    return result
