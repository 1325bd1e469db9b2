"""The kubelet's admission of one pod, written once for the simulated kubelet and the
fleet, in the kubelet's order:

1. the resource check of its admission handler (where the node counts CPU, memory
   and pods: the fleet's nodes do);
2. the topology manager and the device manager (`TopologyAffinityError`,
   `UnexpectedAdmissionError`), Allocate called through each plugin's endpoint;
3. DRA: the pod's claims prepared through their drivers' endpoints
   (`FailedPrepareDynamicResources`);
4. its containers started in order: PreStartContainer where a plugin asks for it, then
   the runtime options of the CRI CreateContainer request.

A step that refuses the pod undoes what the steps before it did, as the kubelet does
for a pod it does not run: its claims are released (unprepared where no other pod
uses them) and its devices freed. A container that fails to start does not refuse the
pod: it waits, with the kubelet's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from devplug.simulator.containers import start_containers
from devplug.simulator.draendpoint import PrepareError
from devplug.simulator.manager import DeviceManager
from devplug.simulator.podclaims import PodClaims
from devplug.simulator.pods import PodSpec
from devplug.simulator.results import ContainerResult

# The steps that can refuse a pod.
RESOURCES = "resources"
DEVICES = "devices"
DRA = "dra"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the pod does not run: the step that refused it, the kubelet's reason and
    message. A pod the resource check or the device manager refuses is rejected for
    good; one DRA could not prepare waits, as the kubelet retries it."""

    step: str
    reason: str
    message: str


# The resource check: None where the pod fits, else (reason, message).
ResourceCheck = Callable[[PodSpec], tuple[str, str] | None]


async def admit_pod(
    pod: PodSpec,
    devices: DeviceManager,
    claims: PodClaims | None = None,
    *,
    resource_check: ResourceCheck | None = None,
    runtime_options: bool = True,
) -> Refusal | list[ContainerResult]:
    """Admit `pod` and start its containers; or why it was refused, with nothing
    of it left on the node. `runtime_options=False` leaves the containers' runtime
    options out (where no container runtime takes them)."""
    if resource_check is not None and (refused := resource_check(pod)) is not None:
        return Refusal(RESOURCES, *refused)
    rejection = await devices.admit(pod)
    if rejection is not None:
        return Refusal(DEVICES, rejection.reason, rejection.message)
    cdi: dict[str, list[str]] = {}
    try:
        if claims is not None:
            cdi = await claims.prepare_pod(pod)
        return await start_containers(devices, pod, cdi, runtime_options=runtime_options)
    except PrepareError as error:
        await _undo(pod, devices, claims)
        return Refusal(DRA, error.reason, str(error))
    except BaseException:
        await _undo(pod, devices, claims)
        raise


async def _undo(pod: PodSpec, devices: DeviceManager, claims: PodClaims | None) -> None:
    """What the steps after the device manager did, undone in reverse order."""
    if claims is not None:
        await claims.unprepare_pod(pod.uid)
    devices.remove_pod(pod.uid)
