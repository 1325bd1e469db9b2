"""The generic device plugin's flags and file (squat/generic-device-plugin) as a devplug
config, so that its DaemonSet runs devplug with only the image changed.

Its `--device` blocks (YAML or JSON, repeatable), `--domain`, `--plugin-directory`,
`--listen`, `--log-level` and `--config` file are read with its defaults and precedence
(a flag given > its environment variable > its file > the default), its device specs
with its decoding (keys in any case, unknown keys ignored: each is named in a warning),
and translated into the one config model of devplug.config. Nothing here runs
anything: `devplug serve` serves the result, `devplug check` prints it.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from devplug.config.errors import ConfigError
from devplug.config.load import check_trusted, config_from_data
from devplug.config.root import Config
from devplug.ground import inputs
from devplug.kube.containers import permissions_problem
from devplug.kube.names import is_dns_subdomain

DEFAULT_DOMAIN = "squat.ai"
DEFAULT_PLUGIN_DIRECTORY = "/var/lib/kubelet/device-plugins/"
DEFAULT_LISTEN = ":8080"
# Where it looks for its file when --config is not given, in this order.
CONFIG_PLACES = ("/etc/generic-device-plugin/config.yaml", "config.yaml")
# Its log levels -> devplug's ('none': devplug still reports what stops it).
LOG_LEVELS = {
    "all": "debug",
    "debug": "debug",
    "info": "info",
    "warn": "warning",
    "error": "error",
    "none": "error",
}
# The settings its file and environment give, by key (the variable: upper case, '_').
SETTINGS = ("domain", "plugin-directory", "listen", "log-level")
FILE_KEYS = frozenset((*SETTINGS, "device", "devices", "config", "version"))
DEVICE_PATH = "Device"
MOUNT_PATH = "Mount"

_NAME = re.compile(r"^[a-z0-9][-a-z0-9]*[a-z0-9]$")
_LISTEN = re.compile(r"^(?P<host>\[[^\]]*\]|[^:]*):(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class Flags:
    """Its flags as given on the command line (None: not given)."""

    devices: Sequence[str] | None = None
    domain: str | None = None
    plugin_directory: str | None = None
    listen: str | None = None
    log_level: str | None = None
    config: str | None = None

    def given(self) -> bool:
        """Whether a flag only the generic device plugin has was given."""
        own = (self.devices, self.domain, self.plugin_directory, self.listen)
        return any(value is not None for value in own)


@dataclass(frozen=True)
class Settings:
    """What devplug serves, and how, for those flags."""

    config: Config
    data: dict[str, Any]  # the same config as YAML-ready data, for `devplug check`
    source: str  # where the device specs came from, for messages
    listen_host: str
    listen_port: int
    plugin_directory: str | None  # None: not set anywhere (devplug's default is the same)
    log_level: str | None  # devplug's level; None: not set anywhere
    warnings: list[str] = field(default_factory=list)


def is_gdp_data(data: object) -> bool:
    """Whether parsed YAML is the generic device plugin's file rather than devplug's."""
    if not isinstance(data, dict) or not data:
        return False
    keys = {str(k).lower() for k in data}
    return keys <= FILE_KEYS and bool(keys & {"device", "devices"})


def is_gdp_file(path: str) -> bool:
    """Whether the file at `path` is the generic device plugin's (False if unreadable:
    devplug's loader then says why)."""
    try:
        data = inputs.load_yaml(inputs.read_text(path), path)
    except inputs.InputError:
        return False
    return is_gdp_data(data)


def load(flags: Flags, env: Mapping[str, str], places: Sequence[str] = CONFIG_PLACES) -> Settings:
    """The devplug config and settings of the generic device plugin's flags, environment
    and file; ConfigError with one line naming the flag or file, field and problem."""
    file_name, file_data = _read_file(flags.config, places)
    warnings: list[str] = []

    def setting(key: str, flag: str | None) -> tuple[str | None, str]:
        variable = key.upper().replace("-", "_")
        if flag is not None:
            return flag, f"--{key}"
        if env.get(variable):
            return env[variable], f"--{key} (from ${variable})"
        if key in file_data:
            value = file_data[key]
            if not isinstance(value, str | int):
                _fail(f"{file_name}: {key}", f"expected a string, got {_kind(value)}")
            return str(value), f"{file_name}: {key}"
        return None, f"--{key}"

    domain, domain_from = setting("domain", flags.domain)
    domain = DEFAULT_DOMAIN if domain is None else domain
    if not is_dns_subdomain(domain):
        _fail(domain_from, f"{domain!r} is not a lower-case DNS subdomain")
    listen, listen_from = setting("listen", flags.listen)
    host, port = _listen(DEFAULT_LISTEN if listen is None else listen, listen_from)
    level, level_from = setting("log-level", flags.log_level)
    if level is not None and level not in LOG_LEVELS:
        _fail(level_from, f"log level {level!r} unknown; expected one of {', '.join(LOG_LEVELS)}")
    directory, directory_from = setting("plugin-directory", flags.plugin_directory)
    if directory is not None and not directory.startswith("/"):
        _fail(directory_from, f"expected an absolute path, got {directory!r}")

    specs: list[tuple[str, object, bool]] = []  # (where, spec, from a flag)
    if flags.devices:
        for i, text in enumerate(flags.devices):
            specs.append((f"--device #{i + 1}", _flag_spec(text, f"--device #{i + 1}"), True))
        source = "--device flags"
    else:
        key = "device" if "device" in file_data else "devices"
        listed = file_data.get(key)
        if listed is not None and not isinstance(listed, list):
            _fail(f"{file_name}: {key}", f"expected a list of devices, got {_kind(listed)}")
        specs = [(f"{file_name}: {key}[{i}]", spec, False) for i, spec in enumerate(listed or [])]
        source = file_name or "--device flags"
    if not specs:
        _fail("--device", "at least one device must be specified")
    resources = [
        _resource(spec, where, domain, is_flag, warnings) for where, spec, is_flag in specs
    ]
    seen: dict[str, str] = {}
    for (where, _, _), resource in zip(specs, resources, strict=True):
        if resource["name"] in seen:
            _fail(f"{where}: name", f"{resource['name']} is already {seen[resource['name']]}")
        seen[resource["name"]] = where
    data: dict[str, Any] = {"resources": resources}
    try:
        config = config_from_data(data, f"{source} as a devplug config")
    except ConfigError as error:
        raise ConfigError(str(error)) from None
    return Settings(
        config=config,
        data=data,
        source=source,
        listen_host=host,
        listen_port=port,
        plugin_directory=directory,
        log_level=LOG_LEVELS[level] if level is not None else None,
        warnings=warnings,
    )


def to_yaml(settings: Settings) -> str:
    """The devplug config file of these settings, with how to serve it."""
    options = [f"--metrics-port {settings.listen_port}"]
    if settings.listen_host:
        options.append(f"--metrics-address {settings.listen_host}")
    if settings.plugin_directory is not None:
        options.append(f"--plugin-dir {settings.plugin_directory}")
    if settings.log_level is not None:
        options.append(f"--log-level {settings.log_level}")
    head = (
        f"# devplug's config for the generic device plugin's {settings.source}.\n"
        f"# Serve it with: devplug serve --config FILE {' '.join(options)}\n"
    )
    import yaml

    return head + yaml.safe_dump(settings.data, sort_keys=False, default_flow_style=False)


# -- reading ------------------------------------------------------------------------------


def _fail(where: str, problem: str) -> NoReturn:
    raise ConfigError(f"{where}: {' '.join(problem.split())}")


def _kind(value: object) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "a mapping", type(None): "nothing (null)"}
    return names.get(type(value), type(value).__name__)


def _read_file(path: str | None, places: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Its config file (--config, else the first of `places` there) as a mapping with
    lower-case keys; ('', {}) when none is given and none is there."""
    if path is None:
        path = next((p for p in places if os.path.isfile(p)), None)
        if path is None:
            return "", {}
    check_trusted(path)
    try:
        data = inputs.load_yaml(inputs.read_text(path, what="the config file"), path)
    except inputs.InputError as e:
        raise ConfigError(str(e)) from None
    if data is None:
        return path, {}
    if not isinstance(data, dict):
        _fail(path, f"expected a mapping of settings, got {_kind(data)}")
    return path, {str(k).lower(): v for k, v in data.items()}


def _flag_spec(text: str, where: str) -> object:
    """One `--device` value: YAML, or JSON (which is YAML)."""
    try:
        return inputs.load_yaml(text, where)
    except inputs.InputError as e:
        raise ConfigError(str(e)) from None


def _listen(value: str, where: str) -> tuple[str, int]:
    m = _LISTEN.match(value)
    if m is None or int(m["port"]) > 65535:
        _fail(where, f"expected [HOST]:PORT (e.g. ':8080'), got {value!r}")
    return m["host"].strip("[]"), int(m["port"])


class _Fields:
    """A mapping of the spec read as encoding/json reads it into a struct: keys in any
    case, unknown ones ignored (each named in a warning). `origin` names the flag or
    file entry, `path` the field in it ('' for the spec itself)."""

    def __init__(
        self, data: object, origin: str, path: str, known: Sequence[str], warnings: list[str]
    ) -> None:
        self.origin, self.path = origin, path
        self.where = f"{origin}: {path}" if path else origin
        if not isinstance(data, dict):
            _fail(self.where, f"expected a mapping, got {_kind(data)}")
        self.values: dict[str, object] = {}
        lower = {k.lower(): k for k in known}
        for key, value in data.items():
            name = lower.get(str(key).lower())
            if name is None:
                warnings.append(f"{self.at(str(key))}: unknown key ignored")
            else:
                self.values.setdefault(name, value)

    def at(self, key: str) -> str:
        return f"{self.origin}: {self.path}.{key}" if self.path else f"{self.origin}: {key}"

    def sub(self, key: str) -> str:
        """The path of a field in this mapping ('groups[0]' + '.paths[1]')."""
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type, default: Any) -> Any:
        value = self.values.get(key)
        if value is None:
            return default
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            _fail(self.at(key), f"expected {_kind(kind())}, got {_kind(value)}")
        return value

    def count(self, key: str) -> int:
        value: int = self.get(key, int, 0)
        if value < 0:
            _fail(self.at(key), f"expected an integer >= 0, got {value}")
        return value

    def items(self, key: str) -> list[object]:
        value: list[object] = self.get(key, list, [])
        return value


def _resource(
    data: object, where: str, domain: str, is_flag: bool, warnings: list[str]
) -> dict[str, Any]:
    spec = _Fields(data, where, "", ("name", "groups"), warnings)
    name = spec.get("name", str, "").strip()
    if not _NAME.match(name):
        _fail(spec.at("name"), f"{name!r} must match {_NAME.pattern} (lower case, 2+ characters)")
    where = spec.origin = f"{where} ({name})"
    groups: list[dict[str, Any]] = []
    counts: list[int] = []
    any_path = False
    for j, raw in enumerate(spec.items("groups")):
        group = _Fields(raw, where, f"groups[{j}]", ("paths", "usb", "count"), warnings)
        count = group.count("count") or 1
        paths, usb = group.items("paths"), group.items("usb")
        if paths and usb:
            _fail(group.where, "cannot define both paths and usb in one group")
        if not paths and not usb:
            warnings.append(f"{group.where}: neither paths nor usb: it serves no device")
            continue
        if paths:
            made = [_paths_group(paths, group, warnings)]
        else:
            made = [_usb_group(u, group, k, is_flag, warnings) for k, u in enumerate(usb)]
        for entry in made:
            any_path = any_path or any(
                not os.path.normpath(p["path"]).startswith("/dev/") for p in entry.get("paths", [])
            )
            groups.append(entry)
            counts.append(count)
    if not groups:
        _fail(f"{where}: groups", "no group with paths or usb: nothing to serve")
    resource: dict[str, Any] = {"name": f"{domain}/{name}"}
    if len(set(counts)) == 1:
        if counts[0] != 1:
            resource["count"] = counts[0]
    else:
        for entry, count in zip(groups, counts, strict=True):
            entry["count"] = count
    if any_path:
        resource["allowAnyPath"] = True
    resource["groups"] = groups
    return resource


def _paths_group(items: list[object], group: _Fields, warnings: list[str]) -> dict[str, Any]:
    """A group of paths: device nodes ('Device') and bind mounts ('Mount')."""
    known = ("path", "mountPath", "permissions", "readOnly", "type", "limit", "optional")
    nodes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    globs = 0
    for k, raw in enumerate(items):
        item = _Fields(raw, group.origin, group.sub(f"paths[{k}]"), known, warnings)
        path = item.get("path", str, "").strip()
        if not path.startswith("/"):
            _fail(item.at("path"), f"expected an absolute path, got {path!r}")
        mount_path = item.get("mountPath", str, "").strip()
        if mount_path and not mount_path.startswith("/"):
            _fail(item.at("mountPath"), f"expected an absolute path, got {mount_path!r}")
        kind = item.get("type", str, "") or DEVICE_PATH
        item.count("limit")  # checked as it checks it; see docs/migrate.md
        optional = item.get("optional", bool, False)
        is_glob = glob.has_magic(path)
        if kind == MOUNT_PATH:
            if is_glob:
                _fail(item.at("path"), "a glob on a Mount path: devplug mounts name one path")
            mount: dict[str, Any] = {"hostPath": path}
            if mount_path:
                mount["containerPath"] = _in_folder(mount_path, path)
            if item.get("readOnly", bool, False):
                mount["readOnly"] = True
            mount["optional" if optional else "required"] = True
            mounts.append(mount)
            continue
        if kind != DEVICE_PATH:
            _fail(item.at("type"), f"expected {DEVICE_PATH} or {MOUNT_PATH}, got {kind!r}")
        permissions = item.get("permissions", str, "") or "mrw"
        if problem := permissions_problem(permissions):
            _fail(item.at("permissions"), problem)
        globs += is_glob
        if globs > 1:
            _fail(
                item.at("path"),
                "a second glob in one group: the generic device plugin pairs their matches by "
                "index; devplug serves each glob's matches apart: give each glob a group",
            )
        node: dict[str, Any] = {"path": path}
        if mount_path:
            node["containerPath"] = mount_path
        node["permissions"] = permissions
        if optional:
            node["optional"] = True
        nodes.append(node)
    made: dict[str, Any] = {"paths": nodes}
    if mounts:
        made["mounts"] = mounts
    return made


def _in_folder(container_path: str, host_path: str) -> str:
    """A Mount's container path: a folder ('/x/') gets the host path's name in it."""
    if container_path.endswith("/"):
        return container_path + os.path.basename(host_path)
    return container_path


def _usb_group(
    raw: object, group: _Fields, k: int, is_flag: bool, warnings: list[str]
) -> dict[str, Any]:
    """One `usb` entry as a devplug USB selector: vendor and product IDs in hex."""
    item = _Fields(
        raw, group.origin, group.sub(f"usb[{k}]"), ("vendor", "product", "serial"), warnings
    )
    selector: dict[str, Any] = {}
    for key in ("vendor", "product"):
        selector[key] = f"{_usb_id(item, key, is_flag):04x}"
    serial = item.values.get("serial")
    if serial is not None and serial != "":
        selector["serial"] = str(serial)
    return {"usb": selector}


def _usb_id(item: _Fields, key: str, is_flag: bool) -> int:
    """Its USB ID decoding: a string is hex; a number in a `--device` value is read as
    hex digits too, in its file as the number it is."""
    value = item.values.get(key)
    if value is None or value == "":
        _fail(item.at(key), "expected a USB ID in hex (e.g. '1a86')")
    if isinstance(value, bool) or not isinstance(value, str | int):
        _fail(item.at(key), f"expected a USB ID in hex, got {_kind(value)}")
    if isinstance(value, int) and not is_flag:
        number = value
    else:
        try:
            number = int(str(value).replace("\n", "").replace('"', ""), 16)
        except ValueError:
            _fail(item.at(key), f"malformed USB ID {value!r}: expected hex (e.g. '1a86')")
    if not 0 <= number <= 0xFFFF:
        _fail(item.at(key), f"USB ID {value!r} is out of range (at most ffff)")
    return number
