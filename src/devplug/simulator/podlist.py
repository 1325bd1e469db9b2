"""The pods a simulated node runs, on disk: its stand-in for the API server.

`simulator_pods.json` holds JSON lines: `{"uid": ..., "manifest": {...}}` for a pod
admitted, `{"deleted": uid}` for a pod deleted. Admitting or deleting a pod appends one
line, so its cost does not grow with the pods the node holds; the file is rewritten
with the running pods only when the deleted ones make up most of it, and at start.
A line cut short by a crash is skipped. A file of the earlier layout, one document
`{"pods": [...]}`, is read as well. A file with lines that cannot be read is renamed
aside before it is rewritten (`simulator_pods.json.unusable-1`): nothing is lost.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from devplug.ground.files import keep_aside, write_atomic

log = logging.getLogger("devplug.simulator.kubelet")

# Rewrite once the lines exceed twice the running pods by this much.
_SLACK_LINES = 64


def _line(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str) + "\n"


class PodList:
    """The running pods' lines, and the file they are appended to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lines: dict[str, str] = {}  # pod UID -> its line, in admission order
        self._written = 0  # lines in the file

    def load(self) -> list[dict[str, Any]]:
        """The stored pods (`{"uid", "manifest"}`), in admission order."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as error:
            log.error(
                "cannot read the pod list %s: %s; starting without pods%s",
                self.path,
                error,
                self._kept_aside(),
            )
            return []
        pods: dict[str, dict[str, Any]] = {}
        skipped = False
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line)
            except ValueError:
                log.error("the pod list %s: line %d is not JSON; skipped", self.path, number)
                skipped = True
                continue
            if not isinstance(record, dict):
                continue
            if "deleted" in record:
                pods.pop(str(record["deleted"]), None)
                continue
            items = record["pods"] if isinstance(record.get("pods"), list) else [record]
            for item in items:
                if isinstance(item, dict):
                    pods.pop(str(item.get("uid")), None)  # admitted again: now last
                    pods[str(item.get("uid"))] = item
        if skipped and (where := self._kept_aside()):
            log.error("the pod list %s: its lines are kept%s", self.path, where)
        return list(pods.values())

    def _kept_aside(self) -> str:
        """Rename the file aside before it is rewritten: ', the file kept as X'."""
        try:
            return f", the file kept as {keep_aside(self.path)}"
        except OSError as error:
            log.error("cannot keep the pod list %s aside: %s", self.path, error)
            return ""

    def reset(self, pods: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """Start over with these pods (UID, item), rewriting the file with them only."""
        self._lines = {uid: _line(item) for uid, item in pods}
        self._rewrite()

    def add(self, uid: str, item: Mapping[str, Any]) -> None:
        line = _line(item)
        self._lines[uid] = line
        self._append(line)

    def remove(self, uid: str) -> None:
        if self._lines.pop(uid, None) is None:
            return
        if self._written + 1 > 2 * len(self._lines) + _SLACK_LINES:
            self._rewrite()
        else:
            self._append(_line({"deleted": uid}))

    def _append(self, line: str) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as error:
            log.error("cannot write the pod list %s: %s", self.path, error)
            return
        self._written += 1

    def _rewrite(self) -> None:
        try:
            write_atomic(self.path, "".join(self._lines.values()), mode=0o600, durable=False)
        except OSError as error:
            log.error("cannot write the pod list %s: %s", self.path, error)
            return
        self._written = len(self._lines)
