"""The `nvidia:` block of a resource entry: schema, defaults, and what they mean for
the GPU source (its meaning checks are `nvidiacheck`'s, which apply NVIDIA's own file
first).

`nvidia: {}` serves every GPU once as `nvidia.com/gpu` (the entry's `name`, which
defaults to that), with NVIDIA_VISIBLE_DEVICES and the driver's device nodes.
No NVML import here: the config is checked on hosts without the driver too.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from devplug.config.hardware import HealthSpec

DEFAULT_RESOURCE = "nvidia.com/gpu"
MILLI = 1000  # milli-GPUs in a GPU (devplug.placement's unit)
MAX_REPLICAS = 256

MigStrategy = Literal["none", "single", "mixed"]
Sharing = Literal["timeSlicing", "mps"]


class MpsSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """MPS sharing: one control daemon per shared resource, its folders under `root`."""

    # <root>/<resource>/{pipe,log} and <root>/shm on the host, as NVIDIA's plugin lays
    # them out (a client container gets the pipe folder at /mps/<resource>/pipe).
    root: str = "/run/nvidia/mps"
    # The control daemon's program: a name looked up on PATH, or a path.
    control: str = "nvidia-cuda-mps-control"
    # Seconds between checks that each daemon still answers its control interface.
    check_seconds: float = 5.0


ListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")
FALLBACKS = ("named", "single", "empty")
NODE_CONFIG_LABEL = "nvidia.com/device-plugin.config"


class NvidiaConfigRef(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """NVIDIA's device plugin config file (`file`), or a folder of named ones (a
    ConfigMap's keys, `folder`) of which the node label `nodeLabel` picks one, as
    NVIDIA's config manager does: `default` when the label is unset, else the
    `fallbackStrategies` in order (`named`: the one named 'default', `single`: the only
    one, `empty`: none, NVIDIA's defaults)."""

    file: str | None = None
    folder: str | None = None
    default: str = ""
    fallback_strategies: list[Literal["named", "single", "empty"]] = msgspec.field(
        default_factory=lambda: ["named", "single"]
    )
    node_label: str = NODE_CONFIG_LABEL
    # NVIDIA's command-line flags and environment (`nvidia-device-plugin`), in the
    # file's shape: they replace what the file says, as in NVIDIA's plugin.
    flags: dict[str, Any] = {}


class NvidiaSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    # MIG: `none` serves whole GPUs, `single` serves every MIG device under the
    # resource's name, `mixed` serves each profile as '<domain>/mig-<profile>'.
    mig_strategy: MigStrategy = "none"
    # Sharing: each GPU (or MIG device) is advertised `replicas` times, time-sliced or
    # through MPS (a memory and compute limit per replica).
    replicas: int = 1
    # Per resource of the entry (as NVIDIA's sharing lists them): replicas of its GPUs or
    # MIG devices, instead of `replicas`.
    resource_replicas: dict[str, int] = {}
    # Shared resources served as '<name>.shared' (NVIDIA's renameByDefault).
    rename_shared: bool = False
    sharing: Sharing = "timeSlicing"
    mps: MpsSpec = msgspec.field(default_factory=MpsSpec)
    # Which replica a pod gets on a shared GPU: NVIDIA's `distributed` (the GPU with the
    # fewest replicas in use) or `packed` (the most), or devplug's topology-aware
    # `spread` (best-connected GPUs, one replica each first) or `pack`; or `extender`:
    # replicas are shares of one GPU (1000 / replicas milli-GPUs each) and a pod gets
    # those of the GPU the scheduler extender chose for it (docs/placement.md).
    replica_policy: Literal["distributed", "packed", "spread", "pack", "extender"] = "distributed"
    # Refuse a container asking for more than one replica (unset: only with MPS).
    fail_requests_greater_than_one: bool | None = None
    # How the container learns its GPUs: NVIDIA_VISIBLE_DEVICES with their IDs
    # (`envvar`), the same as mounts under /var/run/nvidia-container-devices
    # (`volume-mounts`), CDI names 'k8s.device-plugin.nvidia.com/gpu=<ID>' in an
    # annotation (`cdi-annotations`) or in the CDI devices field (`cdi-cri`).
    device_list_strategy: list[ListStrategy] = msgspec.field(default_factory=lambda: ["envvar"])
    # The IDs given to the container: UUIDs, or indexes ('0', '0:1' for a MIG device).
    device_id_strategy: Literal["uuid", "index"] = msgspec.field(
        default="uuid", name="deviceIDStrategy"
    )
    # Device specs for /dev/nvidiaN and the driver's shared nodes.
    pass_device_specs: bool = True
    # The host folder the driver's /dev is under ('/run/nvidia/driver' with NVIDIA's
    # driver container): the host side of the device specs.
    driver_root: str = "/"
    # NVIDIA_GDS / NVIDIA_MOFED / NVIDIA_GDRCOPY=enabled for the container toolkit.
    gds_enabled: bool = False
    mofed_enabled: bool = False
    gdrcopy_enabled: bool = False
    # CDI: the annotation key prefix, where devplug's spec goes, and where the host's
    # NVIDIA spec (`nvidia-ctk cdi generate`) is looked for.
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    cdi_dir: str = "/var/run/cdi"
    cdi_spec_dirs: list[str] = msgspec.field(default_factory=lambda: ["/etc/cdi", "/var/run/cdi"])
    # IMEX channels every container of the resource gets (NVIDIA's imex.channelIDs: [0]
    # or none): /dev/nvidia-caps-imex-channels/channel<ID>, NVIDIA_IMEX_CHANNELS; a
    # channel missing on the host is skipped with a warning, or, `imexRequired`, is a
    # start problem.
    imex_channels: list[int] = msgspec.field(default_factory=list, name="imexChannelIDs")
    imex_required: bool = False
    # Exit when NVML cannot start (NVIDIA's failOnInitError), instead of retrying.
    fail_on_init_error: bool = False
    # The machine type of the gpu.machine label.
    machine_type_file: str = "/sys/class/dmi/id/product_name"
    # NVIDIA's own config file (or per-node ones): its settings replace these.
    nvidia_config: NvidiaConfigRef | None = None
    # Per-model names: 'nvidia.com/gpu-<model>' for every model, and/or an explicit
    # model -> resource name map (the map wins).
    per_model_names: bool = False
    resource_names: dict[str, str] = {}
    # Health: critical Xid and double-bit ECC events turn a GPU Unhealthy, except the
    # Xids ignored: NVIDIA's defaults (devplug.sources.nvidia.xids), plus these, minus
    # `enabledXids`.
    health_checks: bool = True
    ignored_xids: list[int] = []
    enabled_xids: list[int] = []
    # After a transient Xid a GPU turns Healthy again once it answers NVML and has had
    # no critical event for this long; after one that needs a reset, once it was reset.
    recovery_seconds: float = 60.0
    # Checks that say a GPU awaiting a reset was reset (a file a reset tool writes, a
    # command): when they all pass for it, it is Healthy again.
    reset_check: HealthSpec | None = None
    # How often each GPU is asked whether it is still there (GpuIsLost).
    probe_seconds: float = 5.0
    # The longest an NVML call may take before it counts as hung.
    nvml_timeout_seconds: float = 10.0
    # Retries of a failed NVML start: 1 s, doubling up to this.
    retry_max_seconds: float = 60.0
    # Where the host's /dev, /proc and /sys are seen (a container mounts them elsewhere).
    host_root: str = "/"


def replicas_of(spec: NvidiaSpec, resource: str) -> int:
    """How many times each GPU (or MIG device) of `resource` is advertised."""
    return spec.resource_replicas.get(resource, spec.replicas)


def served_name(spec: NvidiaSpec, resource: str) -> str:
    """The name `resource` registers under: '<name>.shared' when shared and
    `renameShared` (NVIDIA's renameByDefault)."""
    if spec.rename_shared and replicas_of(spec, resource) > 1:
        return resource + ".shared"
    return resource


def fails_requests_greater_than_one(spec: NvidiaSpec) -> bool:
    """Unset, only MPS refuses a container more than one replica (as NVIDIA's plugin)."""
    if spec.fail_requests_greater_than_one is None:
        return spec.sharing == "mps"
    return spec.fail_requests_greater_than_one


def cdi_only(spec: NvidiaSpec) -> bool:
    """Only CDI strategies: no env and no device specs are sent, as NVIDIA's plugin."""
    return all(s in CDI_STRATEGIES for s in spec.device_list_strategy)


def share_milli(spec: NvidiaSpec, resource: str) -> int:
    """With `replicaPolicy: extender`, the milli-GPUs one replica of `resource` is."""
    return MILLI // replicas_of(spec, resource)
