"""The `nvidia:` block of a resource entry: schema, defaults and meaning checks.

`nvidia: {}` serves every GPU once as `nvidia.com/gpu` (the entry's `name`, which
defaults to that), with NVIDIA_VISIBLE_DEVICES and the driver's device nodes.
No NVML import here: the config is checked on hosts without the driver too.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any, Literal, NoReturn

import msgspec

from devplug.ground.trust import program_problem
from devplug.kube.names import resource_name_problem
from devplug.sources.hardware import HealthSpec, check_health

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


_Fail = Callable[[str, str], NoReturn]


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


def check_shares(spec: NvidiaSpec, at: str, fail: _Fail) -> None:
    """`replicaPolicy: extender`: every replica count divides a GPU's 1000 milli-GPUs,
    time-sliced (a share of memory and SMs through MPS is not a milli count)."""
    counts = {f"{at}.replicas": spec.replicas}
    counts |= {f"{at}.resourceReplicas[{r!r}]": n for r, n in spec.resource_replicas.items()}
    for key, count in counts.items():
        if not 2 <= count <= MILLI or MILLI % count:
            fail(
                key,
                f"replicaPolicy extender: expected a divisor of {MILLI} from 2 to {MILLI} "
                f"(each replica is {MILLI} / replicas milli-GPUs), got {count}",
            )
    if spec.sharing != "timeSlicing":
        fail(f"{at}.sharing", "replicaPolicy extender shares GPUs by time-slicing only")


def check_nvidia(spec: NvidiaSpec, name: str, at: str, fail: _Fail) -> None:
    """Meaning checks of an `nvidia:` block; `fail(field, problem)` raises."""
    at = f"{at}.nvidia"
    shares = spec.replica_policy == "extender"
    if not shares and not 1 <= spec.replicas <= MAX_REPLICAS:
        fail(f"{at}.replicas", f"expected an integer from 1 to {MAX_REPLICAS}, got {spec.replicas}")
    if spec.nvidia_config is not None:
        from devplug.sources.nvidia.nvidiafile import apply_ref

        apply_ref(spec, spec.nvidia_config, f"{at}.nvidiaConfig", fail)
    for resource, count in spec.resource_replicas.items():
        key = f"{at}.resourceReplicas[{resource!r}]"
        if problem := resource_name_problem(resource):
            fail(key, problem)
        if not shares and not 1 <= count <= MAX_REPLICAS:
            fail(key, f"expected an integer from 1 to {MAX_REPLICAS}, got {count}")
    if shares:
        check_shares(spec, at, fail)
    if spec.sharing == "mps":
        if spec.resource_replicas:
            if min(spec.resource_replicas.values()) < 2:
                fail(f"{at}.resourceReplicas", "MPS sharing needs at least 2 replicas per GPU")
        elif spec.replicas < 2:
            fail(f"{at}.replicas", "MPS sharing needs at least 2 replicas per GPU")
        if spec.mig_strategy == "mixed":  # NVIDIA's: single is checked on the GPUs
            fail(f"{at}.migStrategy", "migStrategy mixed is not supported with MPS")
        if not spec.mps.root.startswith("/"):
            fail(f"{at}.mps.root", f"expected an absolute path, got {spec.mps.root!r}")
        if not spec.mps.control:
            fail(f"{at}.mps.control", "expected a program name or path")
        if problem := program_problem(spec.mps.control):
            fail(f"{at}.mps.control", problem)
        if not spec.mps.check_seconds > 0:
            fail(f"{at}.mps.checkSeconds", f"expected a number > 0, got {spec.mps.check_seconds}")
    strategies = spec.device_list_strategy
    if not strategies:
        fail(f"{at}.deviceListStrategy", "expected at least one of envvar, volume-mounts, cdi")
    if len(set(strategies)) != len(strategies):
        fail(f"{at}.deviceListStrategy", "a strategy is listed twice")
    if spec.imex_channels not in ([], [0]):
        fail(f"{at}.imexChannelIDs", f"channelIDs must be [] or [0]; found {spec.imex_channels}")
    if not spec.cdi_annotation_prefix.endswith("/"):
        fail(
            f"{at}.cdiAnnotationPrefix",
            f"expected a prefix ending in '/', got {spec.cdi_annotation_prefix!r}",
        )
    for key, path in (
        ("driverRoot", spec.driver_root),
        ("cdiDir", spec.cdi_dir),
        ("machineTypeFile", spec.machine_type_file),
        *(("cdiSpecDirs", d) for d in spec.cdi_spec_dirs),
    ):
        if not path.startswith("/"):
            fail(f"{at}.{key}", f"expected an absolute path, got {path!r}")
    for key in ("recovery_seconds", "probe_seconds", "nvml_timeout_seconds", "retry_max_seconds"):
        value = getattr(spec, key)
        if not value > 0:
            camel = key.split("_")[0] + "".join(w.title() for w in key.split("_")[1:])
            fail(f"{at}.{camel}", f"expected a number > 0, got {value}")
    for key, xids in (("ignoredXids", spec.ignored_xids), ("enabledXids", spec.enabled_xids)):
        for xid in xids:
            if xid < 0:
                fail(f"{at}.{key}", f"expected Xid numbers >= 0, got {xid}")
    if spec.reset_check is not None:
        check_health(spec.reset_check, f"{at}.resetCheck", True, fail)
    domain = name.partition("/")[0]
    for model, resource in spec.resource_names.items():
        if problem := resource_name_problem(resource):
            fail(f"{at}.resourceNames[{model!r}]", problem)
        if resource.partition("/")[0] != domain:
            fail(
                f"{at}.resourceNames[{model!r}]",
                f"{resource!r} is outside the resource's domain {domain!r}",
            )
    if not spec.host_root.startswith("/"):
        fail(f"{at}.hostRoot", f"expected an absolute path, got {spec.host_root!r}")
    spec.host_root = posixpath.normpath(spec.host_root)
    spec.driver_root = posixpath.normpath(spec.driver_root)
