"""The node-feature-discovery feature file: node labels from every plugin.

NFD's local source reads `name=value` lines from files in its `features.d` folder and
turns them into node labels, so a pod can ask for a node with a given device model
through nodeAffinity. The file is replaced atomically on every change of a device list
and removed on shutdown, so a node that stops serving stops advertising. Its first line,
a comment (NFD skips `#` lines), marks it as devplug's: a file at the path without it is
another's, never replaced or removed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from devplug.config.hardware import DEFAULT_FEATURE_FILE
from devplug.config.ids import physical_id
from devplug.framework.device import Device
from devplug.framework.plugin import Plugin
from devplug.ground.files import FileKeeper, NotOurs, OwnedElsewhere, OwnedFile
from devplug.kube.names import label_name_problem, label_value
from devplug.outputs.follow import follow

if TYPE_CHECKING:
    from devplug.framework.daemon import Daemon

log = logging.getLogger("devplug.outputs.nfd")

HEADER = "# devplug: node labels of the resources it serves; removed when it stops\n"


def device_labels(resource_name: str, devices: Iterable[Device]) -> dict[str, str]:
    """The labels of one resource from its devices' attributes: `<resource>.count`
    (healthy physical devices; replicas of one device count once), `.model` and
    `.vendor` (distinct values joined by '.'), `.numa-nodes` (joined by '_')."""
    devices = list(devices)
    healthy = {physical_id(d.id) for d in devices if d.healthy}
    labels = {f"{resource_name}.count": str(len(healthy))}
    for key in ("model", "vendor"):
        values = sorted(
            {label_value(str(d.attributes[key])) for d in devices if key in d.attributes}
        )
        if values and (joined := label_value(".".join(v for v in values if v))):
            labels[f"{resource_name}.{key}"] = joined
    numa = sorted({n for d in devices for n in d.numa_nodes})
    if numa:
        labels[f"{resource_name}.numa-nodes"] = label_value("_".join(map(str, numa)))
    return labels


def feature_labels(plugins: Sequence[Plugin]) -> dict[str, str]:
    """Every plugin's `node_labels()`, sorted by name."""
    labels: dict[str, str] = {}
    for plugin in plugins:
        found = plugin.node_labels()
        if not isinstance(found, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in found.items()
        ):
            log.error(
                "%s: %s.node_labels returned %s, expected a mapping of strings: its labels "
                "are left out",
                plugin.resource_name,
                type(plugin).__name__,
                type(found).__name__,
            )
            continue
        labels.update(found)
    return dict(sorted(labels.items()))


def parse_features(text: str) -> Mapping[str, str]:
    """The labels of a feature file (the reading side, for `check` and tests)."""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            labels[name.strip()] = value.strip()
    return labels


class FeatureFile:
    """A daemon service keeping the feature file at `path` in step with the plugins
    (`path` None: no file until `move` names one)."""

    def __init__(self, path: Path | str | None = DEFAULT_FEATURE_FILE) -> None:
        self.path: Path | None = None
        self.file: OwnedFile | None = None
        self._moved: asyncio.Event | None = None
        self.move(path)

    def move(self, path: Path | str | None) -> None:
        """Keep the file at `path` from now on (None: keep none), removing the one
        written so far: what a config reload that changes `nodeFeatures` asks."""
        new = Path(path) if path is not None else None
        if new == self.path:
            return
        if self.file is not None:
            self.file.remove()
            log.info("node features moved from %s to %s", self.path, new or "nowhere")
        self.path = new
        self.file = None if new is None else OwnedFile(new, _ours)
        if self._moved is not None:
            self._moved.set()

    async def run(self, daemon: Daemon) -> None:
        self._moved = moved = asyncio.Event()
        try:
            while True:
                moved.clear()
                waits: set[asyncio.Future[object]] = {asyncio.ensure_future(moved.wait())}
                if self.file is not None:
                    waits.add(asyncio.ensure_future(self._follow(daemon, self.file)))
                try:
                    done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in waits:
                        task.cancel()
                    await asyncio.gather(*waits, return_exceptions=True)
                for task in done:
                    task.result()  # a failure of the file's service stops the daemon
        finally:
            if self.file is not None:
                self.file.remove()

    async def _follow(self, daemon: Daemon, file: OwnedFile) -> None:
        from devplug.framework.daemon import ServiceFailed

        refused: set[str] = set()
        elsewhere: list[str] = []  # said once
        keeper = FileKeeper(lambda: [file])

        def update(plugins: Sequence[Plugin]) -> None:
            lines = []
            for name, value in feature_labels(plugins).items():
                if problem := label_name_problem(name):
                    if name not in refused:  # said once
                        refused.add(name)
                        log.warning("label left out of the node features: %s", problem)
                    continue
                lines.append(f"{name}={value}\n")
            text = HEADER + "".join(lines)
            # A file that cannot be written is logged, not fatal: the devices are still
            # served, and the next change tries again. Another's file there stops the
            # daemon: it is never replaced.
            try:
                if file.write(text):
                    log.info("node features written to %s", file.path)
            except NotOurs as e:
                raise ServiceFailed(f"node features: {e}; name another --feature-file") from None
            except OwnedElsewhere as e:  # another live devplug's: its labels stand
                if not elsewhere:
                    elsewhere.append(str(e))
                    log.warning("node features: %s", e)
            except OSError as e:
                log.warning("cannot write node features to %s: %s", file.path, e)
            keeper.refresh()

        keeping = asyncio.create_task(keeper.run(), name="keep node features")
        try:
            await follow(daemon, update)
        finally:
            keeping.cancel()
            await asyncio.gather(keeping, return_exceptions=True)


def _ours(data: bytes) -> bool:
    return data.startswith(HEADER.encode())
