"""The pods a simulated node runs, kept as the kubelet's pod manager keeps them: by
namespace and name, with their UIDs, and on disk in the pod list (the simulator's
stand-in for the API server) so that they come back after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.simulator.podlist import PodList
from devplug.simulator.pods import InvalidPod, PodSpec, parse_pod
from devplug.simulator.results import PodResult

log = logging.getLogger("devplug.simulator.kubelet")


@dataclass(slots=True)
class PodEntry:
    """A pod the node runs, and what its admission gave."""

    spec: PodSpec
    result: PodResult


class PodManager:
    """The node's pods by (namespace, name), written through to the pod list at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pods: dict[tuple[str, str], PodEntry] = {}
        self._uids: set[str] = set()  # the UIDs of `_pods`
        self._list = PodList(path)

    def __len__(self) -> int:
        return len(self._pods)

    def __iter__(self) -> Iterator[PodEntry]:
        return iter(list(self._pods.values()))

    def get(self, namespace: str, name: str) -> PodEntry | None:
        return self._pods.get((namespace, name))

    def active_pods(self) -> list[PodSpec]:
        return [p.spec for p in self._pods.values()]

    def find_pod(self, name: str, namespace: str) -> PodSpec | None:
        entry = self._pods.get((namespace, name))
        return entry.spec if entry is not None else None

    def has_uid(self, uid: str) -> bool:
        return uid in self._uids

    def add(self, spec: PodSpec, result: PodResult) -> None:
        """Keep an admitted pod, on disk too."""
        self._pods[spec.key] = PodEntry(spec, result)
        self._uids.add(spec.uid)
        self._list.add(spec.uid, stored(spec))

    def pop(self, namespace: str, name: str) -> PodEntry | None:
        """Forget a pod, on disk too; None when there is no such pod."""
        entry = self._pods.pop((namespace, name), None)
        if entry is not None:
            self._uids.discard(entry.spec.uid)
            self._list.remove(entry.spec.uid)
        return entry

    def load(self) -> None:
        """Read the pods the list holds (admitted, their containers not yet restored)."""
        for item in self._list.load():
            manifest = dict(item.get("manifest") or {})
            meta = dict(manifest.get("metadata") or {})
            meta["uid"] = item.get("uid")
            manifest["metadata"] = meta
            spec = parse_pod(manifest)
            if isinstance(spec, InvalidPod):
                log.error("skipping a stored pod: %s", spec.message)
                continue
            self._pods[spec.key] = PodEntry(
                spec, PodResult(spec.name, spec.namespace, spec.uid, True, containers=[])
            )
            self._uids.add(spec.uid)
        self._list.reset((p.spec.uid, stored(p.spec)) for p in self._pods.values())
        if self._pods:
            log.info("%d pods restored from %s", len(self._pods), self.path)


def stored(spec: PodSpec) -> dict[str, Any]:
    """The pod as the pod list keeps it."""
    return {"uid": spec.uid, "manifest": spec.manifest}


def same_pod(running: PodSpec, applied: PodSpec) -> bool:
    """Whether `applied` is the pod that runs again: the same containers and requests,
    and the same uid when the manifest gives one (without one, a uid is made up)."""
    meta = applied.manifest.get("metadata") if isinstance(applied.manifest, Mapping) else None
    uid_given = isinstance(meta, Mapping) and bool(meta.get("uid"))
    return (
        running.init_containers == applied.init_containers
        and running.containers == applied.containers
        and (not uid_given or running.uid == applied.uid)
    )
