"""CDI (Container Device Interface) specs from any plugin's devices, and CDI names in
Allocate.

A spec file per resource describes each physical device's container edits (device
nodes, mounts, env); a runtime with CDI support (containerd 1.7+, CRI-O 1.23+) applies
them when Allocate names the device as `<kind>=<name>`. The file is replaced
atomically whenever the device list changes and removed on shutdown.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from devplug.framework.device import ContainerEdits, Device, merge_edits
from devplug.framework.plugin import Plugin
from devplug.framework.preferred import physical_id
from devplug.ground.files import FileKeeper, NotOurs, OwnedElsewhere, OwnedFile, write_atomic
from devplug.outputs.follow import follow

if TYPE_CHECKING:
    from devplug.framework.daemon import Daemon

log = logging.getLogger("devplug.outputs.cdi")

CDI_VERSION = "0.6.0"
DEFAULT_CDI_DIR = "/var/run/cdi"
CdiMode = Literal["deviceSpecs", "cdi", "both"]
CDI_MODES: tuple[CdiMode, ...] = ("deviceSpecs", "cdi", "both")

# The CDI parser's rules for the two parts of a kind and for device names.
_VENDOR = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def kind_problem(kind: str) -> str | None:
    """Why `kind` is not a CDI kind ('vendor.com/class'), or None."""
    vendor, slash, cls = kind.partition("/")
    if not slash or not _VENDOR.match(vendor) or not _CLASS.match(cls):
        return (
            f"CDI kind {kind!r} must be 'vendor/class': a vendor of [A-Za-z0-9_.-] and a class "
            "of [A-Za-z0-9_-], each starting and ending with a letter or digit"
        )
    return None


def default_kind(resource_name: str) -> str:
    """The CDI kind of a resource: its name, with the class made valid
    ('example.com/u280.v2' -> 'example.com/u280-v2')."""
    vendor, _, name = resource_name.partition("/")
    return f"{vendor}/{re.sub(r'[^A-Za-z0-9_-]', '-', name)}"


def device_name(device_id: str) -> str:
    """The CDI device name of a device (its physical ID, made valid): replicas of one
    device share it."""
    name = _NAME_UNSAFE.sub("_", physical_id(device_id)).strip("_.:-")
    return name or "device"


def qualified_name(kind: str, device_id: str) -> str:
    return f"{kind}={device_name(device_id)}"


def edits_json(edits: ContainerEdits) -> dict[str, Any]:
    """A CDI `containerEdits` object: env as NAME=value, device nodes, bind mounts."""
    body: dict[str, Any] = {}
    if edits.env:
        body["env"] = [f"{k}={v}" for k, v in edits.env.items()]
    if edits.nodes:
        body["deviceNodes"] = [
            {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions}
            for n in edits.nodes
        ]
    if edits.mounts:
        body["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in edits.mounts
        ]
    return body


def spec(
    kind: str,
    devices: Mapping[str, ContainerEdits],
    common: ContainerEdits | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A CDI spec of `kind` with one entry per device name (and edits common to all)."""
    body: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind}
    if annotations:
        body["annotations"] = dict(annotations)
    body["devices"] = [
        {"name": name, "containerEdits": edits_json(edits)} for name, edits in devices.items()
    ]
    if common is not None and (common_edits := edits_json(common)):
        body["containerEdits"] = common_edits
    return body


def spec_document(kind: str, devices: Iterable[Device]) -> dict[str, Any]:
    """The CDI spec of `devices`: one entry per physical device (replicas folded) with
    its nodes, mounts and env."""
    entries: dict[str, ContainerEdits] = {}
    for device in devices:
        entries.setdefault(device_name(device.id), merge_edits([device]))
    return spec(kind, entries)


def _spec_text(body: Mapping[str, Any]) -> str:
    """A spec as JSON, which every CDI version reads."""
    import json  # only where specs are written: the default daemon does without it

    return json.dumps(body, indent=2) + "\n"


def write_spec(path: Path | str, body: Mapping[str, Any]) -> bool:
    """Write a spec file atomically."""
    return write_atomic(path, _spec_text(body))


def spec_file_name(kind: str) -> str:
    return "devplug-" + kind.replace("/", "_") + ".json"


def apply_mode(
    edits: ContainerEdits, devices: Sequence[Device], kind: str, mode: CdiMode
) -> ContainerEdits:
    """Allocate's answer for a CDI `mode`: 'deviceSpecs' leaves `edits` as they are,
    'both' adds the devices' CDI names, 'cdi' adds them and leaves the device nodes and
    mounts to the runtime's CDI injection (env and annotations stay, joined per device)."""
    if mode == "deviceSpecs":
        return edits
    names = dict.fromkeys([*edits.cdi_devices, *(qualified_name(kind, d.id) for d in devices)])
    if mode == "cdi":
        return replace(edits, nodes=[], mounts=[], cdi_devices=list(names))
    return replace(edits, cdi_devices=list(names))


# Where a plugin's CDI spec goes: (kind, folder), or None for no spec.
SpecPlace = Callable[[Plugin], "tuple[str, Path] | None"]


@runtime_checkable
class WritesCdiSpec(Protocol):
    """A plugin whose spec is not made of its own devices' edits (one spec for several
    resources, edits from elsewhere): it says where the spec goes and what it holds."""

    def cdi_spec_place(self) -> tuple[str, Path] | None: ...

    def cdi_spec_document(self) -> dict[str, Any]: ...


class CdiSpecs:
    """A daemon service writing one CDI spec per resource, kept in step with each
    plugin's device list and with the served plugins (a spec whose plugin is no longer
    served is removed), removed on shutdown.

    `kinds` maps the resource names to serve to their CDI kinds (specs in `folder`), or
    is a function giving a plugin's kind and folder, asked again whenever the plugin set
    changes (a reload may add resources with specs of their own).
    """

    def __init__(
        self, kinds: Mapping[str, str] | SpecPlace, folder: Path | str = DEFAULT_CDI_DIR
    ) -> None:
        if callable(kinds):
            self.place: SpecPlace = kinds
        else:
            for kind in kinds.values():
                if problem := kind_problem(kind):
                    raise ValueError(problem)
            fixed, where = dict(kinds), Path(folder)
            self.place = lambda p: (
                (fixed[p.resource_name], where) if p.resource_name in fixed else None
            )
        self.written: dict[Path, OwnedFile] = {}

    async def run(self, daemon: Daemon) -> None:
        import asyncio

        from devplug.framework.daemon import ServiceFailed

        keeper = FileKeeper(lambda: list(self.written.values()))
        elsewhere: set[Path] = set()  # said once each

        def update(plugins: Sequence[Plugin]) -> None:
            wanted: dict[Path, tuple[Plugin, str]] = {}
            for plugin in plugins:
                if (place := self.place(plugin)) is not None:
                    kind, folder = place
                    wanted[Path(folder) / spec_file_name(kind)] = (plugin, kind)
            for path in self.written.keys() - wanted.keys():
                self.written.pop(path).remove()
            for path, (plugin, kind) in wanted.items():
                if isinstance(plugin, WritesCdiSpec):
                    document = plugin.cdi_spec_document()
                else:
                    document = spec_document(kind, plugin.devices.values())
                spec = self.written.setdefault(path, OwnedFile(path, _spec_of(kind)))
                try:  # logged, not fatal: the next change tries again
                    if spec.write(_spec_text(document)):
                        log.info("%s: CDI spec written to %s", plugin.resource_name, path)
                except NotOurs as e:  # another's spec: never replaced
                    raise ServiceFailed(f"{plugin.resource_name}: CDI spec: {e}") from None
                except OwnedElsewhere as e:  # another live devplug's: its spec serves
                    if path not in elsewhere:
                        elsewhere.add(path)
                        log.warning("%s: CDI spec: %s", plugin.resource_name, e)
                except OSError as e:
                    log.warning(
                        "%s: cannot write the CDI spec %s: %s", plugin.resource_name, path, e
                    )

        def update_and_keep(plugins: Sequence[Plugin]) -> None:
            update(plugins)
            keeper.refresh()

        keeping = asyncio.create_task(keeper.run(), name="keep CDI specs")
        try:
            await follow(daemon, update_and_keep, lambda p: self.place(p) is not None)
        finally:
            keeping.cancel()
            await asyncio.gather(keeping, return_exceptions=True)
            for spec in self.written.values():
                spec.remove()
            self.written.clear()


def _spec_of(kind: str) -> Callable[[bytes], bool]:
    """Whether a file's content is a spec devplug wrote for `kind` (a JSON object of that
    kind, from this or an earlier run)."""

    def ours(data: bytes) -> bool:
        import json

        try:
            body = json.loads(data)
        except ValueError:
            return False
        return isinstance(body, dict) and body.get("kind") == kind

    return ours
