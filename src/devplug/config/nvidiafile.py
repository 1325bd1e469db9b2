"""NVIDIA's device plugin config file (`version: v1`) as an `nvidia:` block's settings.

The file is read as NVIDIA's plugin reads it (api/config/v1 of NVIDIA/k8s-device-plugin):
its defaults where a key is left out (passDeviceSpecs false, failOnInitError true,
deviceListStrategy envvar, deviceIDStrategy uuid), a `deviceListStrategy` string or
list, resource names without a domain taken as `nvidia.com/<name>`, replicas of at
least 2, `rename` and `devices` of a shared resource, and the `resources` section,
ignored with the warnings NVIDIA's plugin logs, and MPS refusing a container more than
one replica. Keys match as NVIDIA's decoder matches them (`filekeys`): a key NVIDIA's
plugin does not know is ignored as there, with one warning line naming file and key. A
folder of such files (a ConfigMap's keys) is chosen from by the node label as NVIDIA's
config manager does (`choose`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from devplug.config.errors import ConfigError, Fail, shape_message
from devplug.ground.trust import write_problem
from devplug.kube.names import is_dns_subdomain, resource_name_problem

if TYPE_CHECKING:
    from devplug.config.nvidia import NvidiaConfigRef, NvidiaSpec

log = logging.getLogger("devplug.sources.nvidia")

VERSION = "v1"
DOMAIN = "nvidia.com"
MAX_NAME = 63  # NVIDIA's MaxResourceNameLength
NAMED_FALLBACK = "default"  # the config the `named` fallback looks for

ALLOCATION_POLICIES = ("distributed", "packed")  # NVIDIA's sharedDevicesAllocationPolicy

_GPU_INDEX = re.compile(r"[0-9]+")
_MIG_INDEX = re.compile(r"[0-9]+:[0-9]+")
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID = re.compile(rf"GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/[0-9]+/[0-9]+")


class PluginFlags(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass_device_specs: bool | None = None
    device_list_strategy: str | list[str] | None = None
    device_id_strategy: str | None = msgspec.field(default=None, name="deviceIDStrategy")
    cdi_annotation_prefix: str | None = None
    nvidia_ctk_path: str | None = msgspec.field(default=None, name="nvidiaCTKPath")
    container_driver_root: str | None = None
    kubelet_socket: str | None = None
    cdi_feature_flags: str | list[str] | None = None
    shared_devices_allocation_policy: str | None = None


class GfdFlags(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    oneshot: bool | None = None
    no_timestamp: bool | None = None
    sleep_interval: str | int | None = None
    output_file: str | None = None
    machine_type_file: str | None = None


class Flags(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    mig_strategy: str | None = None
    fail_on_init_error: bool | None = None
    mps_root: str | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None
    gdrcopy_enabled: bool | None = None
    gds_enabled: bool | None = None
    mofed_enabled: bool | None = None
    use_node_feature_api: bool | None = msgspec.field(default=None, name="useNodeFeatureAPI")
    device_discovery_strategy: str | None = None
    plugin: PluginFlags | None = None
    gfd: GfdFlags | None = None


class Replicated(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    name: str
    replicas: int
    rename: str | None = None
    devices: str | int | list[str | int] | None = None


class Shared(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    resources: list[Replicated]
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool | None = None


class Sharing(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    time_slicing: Shared | None = None
    mps: Shared | None = None


class Resources(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    gpus: list[dict[str, Any]] | None = None
    mig: list[dict[str, Any]] | None = None


class Imex(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    channel_ids: list[int] | None = msgspec.field(default=None, name="channelIDs")
    required: bool | None = None


class NvidiaFile(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    version: str = VERSION
    flags: Flags = msgspec.field(default_factory=Flags)
    resources: Resources | None = None
    sharing: Sharing | None = None
    imex: Imex | None = None


def parse(text: str, source: str, flags: Mapping[str, Any] | None = None) -> NvidiaFile:
    """Check NVIDIA config text (YAML or JSON), with NVIDIA's command-line `flags`
    laid over it; ConfigError with one line naming `source` and the key when it is not
    a config NVIDIA's plugin would start with."""
    from devplug.config.filekeys import match
    from devplug.ground import inputs

    try:
        data = inputs.load_yaml(text, source)
    except inputs.InputError as e:
        raise ConfigError(str(e)) from None
    if data is None:  # an empty file (NVIDIA's "empty" config, /dev/null): the defaults
        data = {}
    ignored: list[str] = []
    data = match(data, NvidiaFile, "", ignored)
    for key in ignored:
        log.warning("%s: %s: unknown key, ignored (as NVIDIA's plugin ignores it)", source, key)
    if flags and isinstance(data, dict):
        from devplug.config.nvidiaflags import lay_over

        data = lay_over(data, flags)
        source = f"{source} (with NVIDIA's flags and environment)"
    try:
        config = msgspec.convert(data, NvidiaFile)
    except msgspec.ValidationError as e:
        raise ConfigError(shape_message(source, str(e))) from None

    def fail(field: str, problem: str) -> NoReturn:
        raise ConfigError(f"{source}: {field}: {problem}")

    _check(config, fail)
    return config


def _check(config: NvidiaFile, fail: Fail) -> None:
    if config.version not in ("", VERSION):
        fail("version", f"unknown version {config.version!r}: expected {VERSION}")
    flags = config.flags
    if flags.mig_strategy not in (None, "none", "single", "mixed"):
        fail("flags.migStrategy", f"expected none, single or mixed, got {flags.mig_strategy!r}")
    plugin = flags.plugin or PluginFlags()
    for strategy in strategies(plugin):
        if strategy not in ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"):
            fail(
                "flags.plugin.deviceListStrategy",
                f"invalid strategy {strategy!r}: expected envvar, volume-mounts, "
                "cdi-annotations or cdi-cri",
            )
    if plugin.device_id_strategy not in (None, "uuid", "index"):
        fail(
            "flags.plugin.deviceIDStrategy",
            f"expected uuid or index, got {plugin.device_id_strategy!r}",
        )
    if flags.device_discovery_strategy not in (None, "auto", "nvml"):
        fail(
            "flags.deviceDiscoveryStrategy",
            f"{flags.device_discovery_strategy!r} is not served here: devplug finds GPUs "
            "through NVML (auto or nvml)",
        )
    if plugin.shared_devices_allocation_policy not in (None, *ALLOCATION_POLICIES):
        fail(
            "flags.plugin.sharedDevicesAllocationPolicy",
            f"expected distributed or packed, got {plugin.shared_devices_allocation_policy!r}",
        )
    imex = config.imex or Imex()
    if imex.channel_ids not in (None, [], [0]):
        fail("imex.channelIDs", f"channelIDs must be [] or [0]; found {imex.channel_ids}")
    resources = config.resources or Resources()
    for key, entries in (("gpus", resources.gpus), ("mig", resources.mig)):
        for i, entry in enumerate(entries or []):
            at = f"resources.{key}[{i}]"
            for needed in ("pattern", "name"):  # NVIDIA reads these two keys as spelled
                if needed not in entry:
                    fail(at, f"resources must have a '{needed}' field set")
            _check_name(str(entry["name"]), f"{at}.name", fail)
    sharing = config.sharing or Sharing()
    for key, shared in (("timeSlicing", sharing.time_slicing), ("mps", sharing.mps)):
        if shared is None:
            continue
        if not shared.resources:
            fail(f"sharing.{key}.resources", "no resources specified")
        for i, resource in enumerate(shared.resources):
            at = f"sharing.{key}.resources[{i}]"
            _check_name(resource.name, f"{at}.name", fail)
            if isinstance(resource.devices, list):
                for j, ref in enumerate(resource.devices):
                    if not _device_ref(ref):
                        fail(
                            f"{at}.devices[{j}]",
                            f"unsupported device {ref!r}: expected a GPU index, a MIG index "
                            "(GPU:MIG) or a GPU or MIG UUID",
                        )
            if resource.replicas < 2:
                fail(f"{at}.replicas", "number of replicas must be >= 2")
            if isinstance(resource.devices, str) and resource.devices != "all":
                fail(
                    f"{at}.devices",
                    f"devices set as {resource.devices!r} but the only valid string input is 'all'",
                )
            if isinstance(resource.devices, int) and resource.devices <= 0:
                fail(f"{at}.devices", "a count of devices must be > 0")


def _check_name(raw: str, at: str, fail: Fail) -> None:
    """NVIDIA's NewResourceName: 'nvidia.com/' added where missing, at most 63
    characters, the name a DNS subdomain (lower case)."""
    name = resource_name(raw)
    if len(name) > MAX_NAME:
        fail(at, f"fully-qualified resource name must be {MAX_NAME} characters or less: {name}")
    if problem := resource_name_problem(name):
        fail(at, problem)
    if not is_dns_subdomain(name.partition("/")[2]):
        fail(
            at,
            f"incorrect format for resource name {name!r}: after '{DOMAIN}/' a lower-case "
            "DNS subdomain (a-z, 0-9, '-', '.')",
        )


def _device_ref(ref: object) -> bool:
    """A `devices` list entry NVIDIA takes: a GPU index, 'GPU:MIG' indexes, a UUID."""
    if isinstance(ref, bool):
        return False
    if isinstance(ref, int):
        return ref >= 0
    if not isinstance(ref, str):
        return False
    return bool(_GPU_INDEX.fullmatch(ref) or _MIG_INDEX.fullmatch(ref) or _UUID.fullmatch(ref))


def strategies(plugin: PluginFlags) -> list[str]:
    value = plugin.device_list_strategy
    if value is None:
        return ["envvar"]
    return [value] if isinstance(value, str) else list(value)


def resource_name(name: str) -> str:
    """NVIDIA's ResourceName: 'gpu' -> 'nvidia.com/gpu'."""
    return name if name.startswith(DOMAIN + "/") else f"{DOMAIN}/{name}"


def apply(spec: NvidiaSpec, config: NvidiaFile, source: str) -> None:
    """Set `spec` from an NVIDIA config, NVIDIA's defaults where it leaves a key out;
    what NVIDIA's plugin ignores is ignored with its warning."""
    flags = config.flags
    plugin = flags.plugin or PluginFlags()
    gfd = flags.gfd or GfdFlags()
    spec.mig_strategy = flags.mig_strategy or "none"  # type: ignore[assignment]
    spec.fail_on_init_error = True if flags.fail_on_init_error is None else flags.fail_on_init_error
    spec.driver_root = flags.nvidia_dev_root or flags.nvidia_driver_root or "/"
    spec.gds_enabled = bool(flags.gds_enabled)
    spec.mofed_enabled = bool(flags.mofed_enabled)
    spec.gdrcopy_enabled = bool(flags.gdrcopy_enabled)
    if flags.mps_root:
        spec.mps = msgspec.structs.replace(spec.mps, root=flags.mps_root)
    spec.pass_device_specs = bool(plugin.pass_device_specs)
    spec.device_list_strategy = strategies(plugin)  # type: ignore[assignment]
    spec.device_id_strategy = plugin.device_id_strategy or "uuid"  # type: ignore[assignment]
    if plugin.cdi_annotation_prefix:
        spec.cdi_annotation_prefix = plugin.cdi_annotation_prefix
    if gfd.machine_type_file:
        spec.machine_type_file = gfd.machine_type_file
    if config.resources is not None and (config.resources.gpus or config.resources.mig):
        log.warning(
            "%s: customizing the 'resources' field is not supported (nor by NVIDIA's "
            "plugin): ignored",
            source,
        )
    spec.replica_policy = plugin.shared_devices_allocation_policy or "distributed"  # type: ignore[assignment]
    imex = config.imex or Imex()
    spec.imex_channels = list(imex.channel_ids or [])
    spec.imex_required = bool(imex.required)
    sharing = config.sharing or Sharing()
    # NVIDIA's plugin: MPS when it lists resources, else time-slicing.
    shared, spec.sharing = (
        (sharing.mps, "mps") if sharing.mps else (sharing.time_slicing, "timeSlicing")
    )
    spec.replicas = 1
    spec.resource_replicas = {}
    spec.rename_shared = False
    spec.fail_requests_greater_than_one = None
    if shared is None:
        spec.sharing = "timeSlicing"
        return
    key = "mps" if spec.sharing == "mps" else "timeSlicing"
    spec.rename_shared = shared.rename_by_default
    spec.fail_requests_greater_than_one = shared.fail_requests_greater_than_one
    if spec.sharing == "mps" and shared.fail_requests_greater_than_one is None:
        spec.fail_requests_greater_than_one = True  # NVIDIA's default with MPS
    renamed = devices = False
    for resource in shared.resources:
        spec.resource_replicas[resource_name(resource.name)] = resource.replicas
        renamed |= bool(resource.rename) and resource.rename != _default_rename(
            resource.name, shared.rename_by_default
        )
        devices |= resource.devices not in (None, "all")
    if renamed:
        log.warning(
            "%s: setting the 'rename' field in sharing.%s.resources is not supported "
            "(nor by NVIDIA's plugin): ignored",
            source,
            key,
        )
    if devices:
        log.warning(
            "%s: customizing the 'devices' field in sharing.%s.resources is not supported "
            "(nor by NVIDIA's plugin): all devices are shared",
            source,
            key,
        )


def _default_rename(name: str, by_default: bool) -> str:
    return resource_name(name) + ".shared" if by_default else ""


# -- a file, or a folder chosen from by the node label ---------------------------------------

# The node's labels as last seen (kept by `devplug serve`'s watch); None: not read yet.
node_labels: Mapping[str, str] | None = None
# How to read them the first time a folder needs them (`devplug serve`: from the API
# server, before any config is chosen); None: unknown, as for `devplug check`, which
# chooses as for a node without the label.
read_node_labels: Callable[[], Mapping[str, str]] | None = None


class NodeLabelsUnreadable(ValueError):
    """The node's labels could not be read: a problem of the cluster, not of the config."""


def current_node_labels(label: str) -> Mapping[str, str]:
    """The node's labels, read now if they never were; NodeLabelsUnreadable, naming
    `label`, when they cannot be."""
    global node_labels
    if node_labels is None and read_node_labels is not None:
        try:
            node_labels = read_node_labels()
        except ValueError as error:
            raise NodeLabelsUnreadable(f"{label}: {error}") from None
    return node_labels or {}


def named_configs(folder: Path) -> dict[str, Path]:
    """The configs of a folder: its files, except a ConfigMap volume's '..' entries."""
    found = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith("..") or entry.is_dir():
            continue
        found[entry.name] = Path(entry.path)
    return found


def choose(names: list[str], label: str, default: str, fallbacks: list[str]) -> tuple[str, str]:
    """(the config to use, '' for the empty one; why) as NVIDIA's config manager chooses
    it; ValueError when none can be."""
    if label:
        if label not in names:
            raise ValueError(f"the node label names config {label!r}, which does not exist")
        return label, "named by the node label"
    if default:
        if default not in names:
            raise ValueError(f"the default config {default!r} does not exist")
        return default, "the default"
    for fallback in fallbacks:
        if fallback == "named" and NAMED_FALLBACK in names:
            return NAMED_FALLBACK, f"the one named {NAMED_FALLBACK!r}"
        if fallback == "single" and len(names) == 1:
            return names[0], "the only one"
        if fallback == "empty":
            return "", "none (NVIDIA's defaults)"
    raise ValueError(
        "no config was set, no default was provided, and all fallbacks "
        f"({', '.join(fallbacks) or 'none'}) failed"
    )


def inputs(ref: NvidiaConfigRef) -> list[Path]:
    """The files a reference reads, for a reload to watch."""
    if ref.file:
        return [Path(ref.file)]
    if ref.folder:
        try:
            return list(named_configs(Path(ref.folder)).values())
        except OSError:
            return []
    return []


def apply_ref(spec: NvidiaSpec, ref: NvidiaConfigRef, at: str, fail: Fail) -> None:
    """Read the file (or every file of the folder, the chosen one applied) into `spec`."""
    if ref.file is None and ref.folder is None and ref.flags:
        apply(spec, parse("", "<no config file>", ref.flags), "<no config file>")
        return
    if (ref.file is None) == (ref.folder is None):
        fail(at, "set one of file (one config) or folder (named configs, one per node)")
    path = ref.file or ref.folder or ""
    key = f"{at}.file" if ref.file else f"{at}.folder"
    if not path.startswith("/"):
        fail(key, f"expected an absolute path, got {path!r}")
    if ref.file:
        apply(spec, parse(_read(ref.file, key, fail), ref.file, ref.flags), ref.file)
        return
    if problem := write_problem(path, folder_read=True):
        fail(key, problem)
    try:
        files = named_configs(Path(path))
    except OSError as error:
        fail(key, f"cannot read {path}: {error.strerror or error}")
    if not files:
        fail(key, f"no configuration files in {path}")
    parsed = {name: parse(_read(str(p), key, fail), str(p), ref.flags) for name, p in files.items()}
    label = current_node_labels(ref.node_label).get(ref.node_label, "")
    try:
        name, why = choose(list(parsed), label, ref.default, list(ref.fallback_strategies))
    except ValueError as error:
        fail(at, f"{ref.node_label}={label!r}: {error}" if label else str(error))
    log.info(  # what an operator looks for after labelling the node: which config, why
        "NVIDIA config %s: %s",
        f"{name!r} ({files[name]})" if name else "(empty)",
        f"{why} {ref.node_label}" if label else why,
        extra={"nvidia_config": name},
    )
    apply(spec, parsed[name] if name else NvidiaFile(), str(files[name]) if name else path)


def _read(path: str, key: str, fail: Fail) -> str:
    from devplug.ground import inputs

    if problem := write_problem(path):
        fail(key, problem)
    try:
        return inputs.read_text(path, what=path)
    except inputs.InputError as error:
        fail(key, error.problem)
