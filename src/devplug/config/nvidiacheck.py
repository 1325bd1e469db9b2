"""The meaning checks of an `nvidia:` block: NVIDIA's own config file (or folder) is
applied first, as its settings replace the block's, then every setting is checked;
`fail(field, problem)` raises the one-line error."""

from __future__ import annotations

import posixpath

from devplug.config.errors import Fail
from devplug.config.hardware import check_health
from devplug.config.nvidia import MAX_REPLICAS, MILLI, NvidiaSpec
from devplug.config.nvidiafile import apply_ref
from devplug.ground.trust import program_problem
from devplug.kube.names import resource_name_problem


def check_shares(spec: NvidiaSpec, at: str, fail: Fail) -> None:
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


def check_nvidia(spec: NvidiaSpec, name: str, at: str, fail: Fail) -> None:
    """Meaning checks of an `nvidia:` block; `fail(field, problem)` raises."""
    at = f"{at}.nvidia"
    shares = spec.replica_policy == "extender"
    if not shares and not 1 <= spec.replicas <= MAX_REPLICAS:
        fail(f"{at}.replicas", f"expected an integer from 1 to {MAX_REPLICAS}, got {spec.replicas}")
    if spec.nvidia_config is not None:
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
