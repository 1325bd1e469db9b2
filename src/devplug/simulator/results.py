"""What the simulator reports: admission results, runtime options, node status.

Plain msgspec structs, so that the library, the control socket and `--output json`
share one typed form (encode with `msgspec.json.encode`, decode with
`msgspec.json.decode(data, type=...)`).
"""

from __future__ import annotations

import msgspec

# Pod admission reasons, as the kubelet (or, for Invalid, the API server) reports them.
REASON_UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"
REASON_TOPOLOGY_AFFINITY = "TopologyAffinityError"
REASON_INVALID = "Invalid"
REASON_ALREADY_EXISTS = "AlreadyExists"
# A claim of the pod could not be prepared by its DRA driver.
REASON_FAILED_PREPARE = "FailedPrepareDynamicResources"
# A claim's allocation (from a file) that the scheduler could never have made.
REASON_UNSCHEDULABLE = "Unschedulable"

# Container states in the simulator.
STARTED = "Started"
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
WAITING = "Waiting"


class DeviceSpec(msgspec.Struct, frozen=True):
    """A device node for the container (CRI Device)."""

    container_path: str
    host_path: str
    permissions: str


class Mount(msgspec.Struct, frozen=True):
    """A bind mount for the container (CRI Mount)."""

    container_path: str
    host_path: str
    read_only: bool


class KeyValue(msgspec.Struct, frozen=True):
    name: str
    value: str


class RuntimeOptions(msgspec.Struct, frozen=True):
    """What the kubelet adds to the CRI CreateContainer request for the container's devices,
    merged over its resources (the first value of an env var, annotation, device or mount
    path wins, as in the kubelet)."""

    devices: list[DeviceSpec] = msgspec.field(default_factory=list)
    mounts: list[Mount] = msgspec.field(default_factory=list)
    envs: list[KeyValue] = msgspec.field(default_factory=list)
    annotations: list[KeyValue] = msgspec.field(default_factory=list)
    cdi_devices: list[str] = msgspec.field(default_factory=list)


class ContainerResult(msgspec.Struct, frozen=True):
    name: str
    init: bool
    # STARTED, CREATE_CONTAINER_CONFIG_ERROR (PreStartContainer failed) or WAITING
    # (an init container before it did not start).
    state: str
    # resource -> device IDs allocated to the container
    devices: dict[str, list[str]]
    options: RuntimeOptions
    # resources whose plugin was sent PreStartContainer for this container
    pre_started: list[str] = msgspec.field(default_factory=list)
    message: str = ""


class PodResult(msgspec.Struct, frozen=True):
    name: str
    namespace: str
    uid: str
    admitted: bool
    reason: str = ""
    message: str = ""
    containers: list[ContainerResult] = msgspec.field(default_factory=list)
    # the same pod applied again: nothing done, as kubectl's "unchanged"
    unchanged: bool = False


class DeviceStatus(msgspec.Struct, frozen=True):
    id: str
    healthy: bool
    numa_nodes: list[int]
    # "namespace/pod/container" entries holding the device
    allocated_to: list[str] = msgspec.field(default_factory=list)


class AllocDuration(msgspec.Struct, frozen=True):
    """kubelet_device_plugin_alloc_duration_seconds for one resource."""

    count: int
    sum_seconds: float
    # upper bound -> cumulative count, the kubelet's (Prometheus default) buckets
    buckets: list[tuple[float, int]]


class ResourceStatus(msgspec.Struct, frozen=True):
    name: str
    capacity: int
    allocatable: int
    allocated: int
    # "connected", or "stopped" (its stream ended, or restored from the checkpoint and
    # not registered again yet: the grace period runs)
    endpoint: str
    devices: list[DeviceStatus]
    # whether the current endpoint has sent its device list
    listed: bool = False
    # seconds left before the resource is dropped, while stopped
    grace_left_s: float | None = None
    pre_start_required: bool = False
    preferred_allocation: bool = False


class PodSummary(msgspec.Struct, frozen=True):
    name: str
    namespace: str
    uid: str
    containers: list[ContainerResult]


class DraClaimStatus(msgspec.Struct, frozen=True):
    """A ResourceClaim prepared on the node: its CDI device IDs by driver."""

    namespace: str
    name: str
    uid: str
    cdi_devices: dict[str, list[str]]
    pods: list[str]


class NodeStatus(msgspec.Struct, frozen=True):
    resources: list[ResourceStatus]
    pods: list[PodSummary]
    # kubelet_device_plugin_registration_total: Register calls per resource, refused
    # ones included (the kubelet counts before it checks).
    registration_total: dict[str, int]
    # successful registrations per resource (the simulator's own count)
    registrations: dict[str, int]
    alloc_duration: dict[str, AllocDuration]
    topology_policy: str
    numa_nodes: list[int]
    checkpoint_problem: str | None = None
    # DRA: registered drivers (name -> version) and prepared claims.
    dra_drivers: dict[str, str] = msgspec.field(default_factory=dict)
    dra_claims: list[DraClaimStatus] = msgspec.field(default_factory=list)

    def resource(self, name: str) -> ResourceStatus | None:
        return next((r for r in self.resources if r.name == name), None)
