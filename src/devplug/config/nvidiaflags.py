"""NVIDIA's device plugin command line and environment, as its chart sets them.

NVIDIA's plugin (`cmd/nvidia-device-plugin`) takes each setting as a flag, or from an
environment variable, or from its config file (`--config-file`/CONFIG_FILE), in that
order of precedence: a flag or variable that is set replaces the file's value. Its
chart sets the variables (MIG_STRATEGY, PASS_DEVICE_SPECS, DEVICE_LIST_STRATEGY, ...).
`resolve` reads both as NVIDIA does and gives the settings in the config file's shape
(`{"flags": {"migStrategy": ...}}`), laid over the file when it is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["str", "bool", "list", "ints"]


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # the first is the flag, the others its aliases
    env: tuple[str, ...]
    key: tuple[str, ...]  # where it goes in the config file ('' : not in the file)
    kind: Kind = "str"


# NVIDIA's flags (v0.20), their variables, and the config key each sets.
FLAGS = (
    Flag(("mig-strategy",), ("MIG_STRATEGY",), ("flags", "migStrategy")),
    Flag(("fail-on-init-error",), ("FAIL_ON_INIT_ERROR",), ("flags", "failOnInitError"), "bool"),
    Flag(
        ("driver-root", "nvidia-driver-root"),
        ("NVIDIA_DRIVER_ROOT",),
        ("flags", "nvidiaDriverRoot"),
    ),
    Flag(("dev-root", "nvidia-dev-root"), ("NVIDIA_DEV_ROOT",), ("flags", "nvidiaDevRoot")),
    Flag(
        ("pass-device-specs",),
        ("PASS_DEVICE_SPECS",),
        ("flags", "plugin", "passDeviceSpecs"),
        "bool",
    ),
    Flag(
        ("device-list-strategy",),
        ("DEVICE_LIST_STRATEGY",),
        ("flags", "plugin", "deviceListStrategy"),
        "list",
    ),
    Flag(("device-id-strategy",), ("DEVICE_ID_STRATEGY",), ("flags", "plugin", "deviceIDStrategy")),
    Flag(("gdrcopy-enabled",), ("GDRCOPY_ENABLED",), ("flags", "gdrcopyEnabled"), "bool"),
    Flag(("gds-enabled",), ("GDS_ENABLED",), ("flags", "gdsEnabled"), "bool"),
    Flag(("mofed-enabled",), ("MOFED_ENABLED",), ("flags", "mofedEnabled"), "bool"),
    Flag(
        ("cdi-annotation-prefix",),
        ("CDI_ANNOTATION_PREFIX",),
        ("flags", "plugin", "cdiAnnotationPrefix"),
    ),
    Flag(
        ("nvidia-cdi-hook-path", "nvidia-ctk-path"),
        ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
        ("flags", "plugin", "nvidiaCTKPath"),
    ),
    Flag(
        ("driver-root-ctr-path", "container-driver-root"),
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        ("flags", "plugin", "containerDriverRoot"),
    ),
    Flag(("mps-root",), ("MPS_ROOT",), ("flags", "mpsRoot")),
    Flag(
        ("shared-devices-allocation-policy",),
        ("SHARED_DEVICES_ALLOCATION_POLICY",),
        ("flags", "plugin", "sharedDevicesAllocationPolicy"),
    ),
    Flag(
        ("device-discovery-strategy",),
        ("DEVICE_DISCOVERY_STRATEGY",),
        ("flags", "deviceDiscoveryStrategy"),
    ),
    Flag(("imex-channel-ids",), ("IMEX_CHANNEL_IDS",), ("imex", "channelIDs"), "ints"),
    Flag(("imex-required",), ("IMEX_REQUIRED",), ("imex", "required"), "bool"),
    # Not in the file:
    Flag(("kubelet-socket",), ("KUBELET_SOCKET",), ()),
    Flag(("config-file",), ("CONFIG_FILE",), ()),
    Flag(("cdi-feature-flags",), ("CDI_FEATURE_FLAGS",), (), "list"),
    Flag(("cdi-disable-hooks",), ("CDI_DISABLE_HOOKS",), (), "list"),
)
KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"

# Go's strconv.ParseBool, which NVIDIA's flags library uses for flags and variables.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


class FlagError(ValueError):
    """A flag or variable NVIDIA's plugin would refuse; one line naming it."""


@dataclass
class Resolved:
    """What NVIDIA's command line and environment set."""

    overrides: dict[str, Any] = field(default_factory=dict)  # in the file's shape
    config_file: str = ""
    kubelet_socket: str = KUBELET_SOCKET


def _value(flag: Flag, raw: str, where: str) -> Any:
    if flag.kind == "bool":
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise FlagError(f"{where}: expected true or false, got {raw!r}")
    if flag.kind == "list":
        return [item for item in raw.split(",") if item]
    if flag.kind == "ints":
        try:
            return [int(item) for item in raw.split(",") if item]
        except ValueError:
            raise FlagError(
                f"{where}: expected integers separated by commas, got {raw!r}"
            ) from None
    return raw


def _by_name() -> dict[str, Flag]:
    return {name: flag for flag in FLAGS for name in flag.names}


def resolve(argv: Sequence[str], environ: Mapping[str, str]) -> Resolved:
    """NVIDIA's flags in `argv` (`--name value`, `--name=value`, a bare `--bool-flag`)
    over its variables in `environ`; FlagError for an unknown flag or a bad value."""
    by_name = _by_name()
    values: dict[Flag, Any] = {}
    for flag in FLAGS:  # the variables first: a flag replaces them
        for env in flag.env:
            if env in environ:
                values[flag] = _value(flag, environ[env], env)
                break
    words = list(argv)
    from_argv: set[Flag] = set()
    while words:
        word = words.pop(0)
        name, eq, raw = word.removeprefix("--").removeprefix("-").partition("=")
        if not word.startswith("-") or name not in by_name:
            raise FlagError(f"{word}: not a flag of NVIDIA's device plugin")
        flag = by_name[name]
        if not eq:
            if flag.kind == "bool":
                raw = "true"
            elif words:
                raw = words.pop(0)
            else:
                raise FlagError(f"--{name}: expected a value")
        value = _value(flag, raw, f"--{name}")
        if flag.kind in ("list", "ints") and flag in from_argv:
            value = [*values[flag], *value]  # a repeated list flag adds to it
        values[flag] = value
        from_argv.add(flag)
    resolved = Resolved()
    for flag, value in values.items():
        if flag.names[0] == "config-file":
            resolved.config_file = value
        elif flag.names[0] == "kubelet-socket":
            resolved.kubelet_socket = value
        elif flag.key:
            _put(resolved.overrides, flag.key, value)
    return resolved


def _put(tree: dict[str, Any], key: tuple[str, ...], value: Any) -> None:
    for part in key[:-1]:
        tree = tree.setdefault(part, {})
    tree[key[-1]] = value


def lay_over(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The file's data (keys as NVIDIA spells them) with the flags' values in place."""
    out = dict(data)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = lay_over(out[key], value)
        else:
            out[key] = value
    return out
