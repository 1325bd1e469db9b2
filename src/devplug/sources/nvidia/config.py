"""The `nvidia:` block of a resource entry: schema, defaults and meaning checks.

`nvidia: {}` serves every GPU once as `nvidia.com/gpu` (the entry's `name`, which
defaults to that), with NVIDIA_VISIBLE_DEVICES and the driver's device nodes.
No NVML import here: the config is checked on hosts without the driver too.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Literal, NoReturn

import msgspec

from devplug.framework.names import resource_name_problem
from devplug.sources.hardware import HealthSpec, check_health

DEFAULT_RESOURCE = "nvidia.com/gpu"
MAX_REPLICAS = 256

MigStrategy = Literal["none", "single", "mixed"]
ListStrategy = Literal["envvar", "volume-mounts", "cdi"]


class NvidiaSpec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    # MIG: `none` serves whole GPUs, `single` serves every MIG device under the
    # resource's name, `mixed` serves each profile as '<domain>/mig-<profile>'.
    mig_strategy: MigStrategy = "none"
    # Time-slicing: each GPU (or MIG device) is advertised `replicas` times.
    replicas: int = 1
    replica_policy: Literal["spread", "pack"] = "spread"
    fail_requests_greater_than_one: bool = False
    # How the container learns its GPUs: NVIDIA_VISIBLE_DEVICES with UUIDs (`envvar`),
    # the same as mounts under /var/run/nvidia-container-devices (`volume-mounts`),
    # and/or CDI names 'nvidia.com/gpu=<UUID>' (`cdi`).
    device_list_strategy: list[ListStrategy] = msgspec.field(default_factory=lambda: ["envvar"])
    # Device specs for /dev/nvidiaN and the driver's shared nodes.
    pass_device_specs: bool = True
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


def check_nvidia(spec: NvidiaSpec, name: str, at: str, fail: _Fail) -> None:
    """Meaning checks of an `nvidia:` block; `fail(field, problem)` raises."""
    at = f"{at}.nvidia"
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        fail(f"{at}.replicas", f"expected an integer from 1 to {MAX_REPLICAS}, got {spec.replicas}")
    strategies = spec.device_list_strategy
    if not strategies:
        fail(f"{at}.deviceListStrategy", "expected at least one of envvar, volume-mounts, cdi")
    if len(set(strategies)) != len(strategies):
        fail(f"{at}.deviceListStrategy", "a strategy is listed twice")
    if "envvar" in strategies and "volume-mounts" in strategies:
        fail(
            f"{at}.deviceListStrategy",
            "envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES: choose one",
        )
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
