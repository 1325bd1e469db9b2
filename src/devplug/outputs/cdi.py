"""CDI (Container Device Interface) spec files from any plugin's devices (the format
itself is devplug.framework.cdi).

A spec file per resource describes each physical device's container edits (device
nodes, mounts, env); a runtime with CDI support (containerd 1.7+, CRI-O 1.23+) applies
them when Allocate names the device as `<kind>=<name>`. The file is replaced
atomically whenever the device list changes and removed on shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from devplug.framework.cdi import spec_document, spec_file_name, spec_text
from devplug.framework.plugin import Plugin
from devplug.ground.files import FileKeeper, NotOurs, OwnedElsewhere, OwnedFile
from devplug.kube.cdi import DEFAULT_CDI_DIR, kind_problem
from devplug.outputs.follow import follow

if TYPE_CHECKING:
    from devplug.framework.daemon import Daemon

log = logging.getLogger("devplug.outputs.cdi")

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
                    if spec.write(spec_text(document)):
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
