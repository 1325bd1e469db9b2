"""The health of one entry's GPUs, from what the health thread reports: a critical Xid,
a double-bit ECC error or a GPU that stops answering turns its devices Unhealthy at
once. After a transient Xid (devplug.sources.nvidia.xids) a GPU that answers and has
had no critical event for `recoverySeconds` turns Healthy again; after one that needs
a reset it stays Unhealthy until it was reset, seen as one of: the GPU lost and back (a
reset takes it off the bus), the driver's recovery action going back to none after it
asked for one, or the entry's `resetCheck` passing. The state lives in the daemon: a
node reboot (which resets every GPU) starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from devplug.framework import observe
from devplug.sources.health import check_problem
from devplug.sources.nvidia.discovery import Unit, host_path
from devplug.sources.nvidia.health import Probe, Report, Rewatched, Round, WaitFailed
from devplug.sources.nvidia.nvml import ALL_INSTANCES, RECOVERY_NONE, NvmlView, XidEvent
from devplug.sources.nvidia.xids import ignored_xids, xid_action

if TYPE_CHECKING:
    from devplug.config.nvidia import NvidiaSpec
    from devplug.sources.nvidia.mps import MpsDaemons

log = logging.getLogger("devplug.sources.nvidia")


class Served(Protocol):
    """What the health of a source's GPUs reads of the source: what NVML shows now,
    the units served, and the MPS daemons (a unit is down with its daemon)."""

    @property
    def view(self) -> NvmlView | None: ...

    @property
    def units(self) -> list[Unit]: ...

    @property
    def mps(self) -> MpsDaemons | None: ...


class GpuHealth:
    """Why each unit of `served` is unhealthy ("": it is healthy); `changed` is called
    after each look."""

    def __init__(
        self, name: str, spec: NvidiaSpec, served: Served, changed: Callable[[], None]
    ) -> None:
        self.name = name
        self.spec = spec
        self.served = served
        self.changed = changed
        self.hung = False  # NVML stopped answering (no probe round for too long)
        self._lost: dict[int, str] = {}  # GPU index -> why it does not answer
        # UUID -> (time, Xid) of its last transient Xid
        self._critical: dict[str, tuple[float, int]] = {}
        self._awaiting_reset: dict[str, int] = {}  # UUID -> the Xid that needs a reset
        self._recovery: dict[int, int] = {}  # GPU index -> the driver's recovery action
        self._asked_recovery: set[int] = set()  # GPUs whose driver asked for an action
        self._blind = ""  # why no event can be seen now (the wait failed); empty: fine
        self._ignored = ignored_xids(spec.ignored_xids, spec.enabled_xids)
        self._health: dict[str, str] = {}  # UUID -> why it is unhealthy ("": healthy)

    def reason(self, unit: Unit) -> str:
        return self._health.get(unit.uuid, "")

    def watching_again(self) -> None:
        """NVML (re)started: every GPU answers and events are seen until told otherwise."""
        self._lost = {}
        self._blind = ""

    def silent(self, seconds: float) -> None:
        """No probe round for `seconds`: NVML hangs, every GPU is Unhealthy."""
        if not self.hung:
            log.warning(
                "%s: NVML has not answered for %g s: every GPU is Unhealthy", self.name, seconds
            )
        self.hung = True
        self.recheck()

    def on_report(self, report: Report) -> None:
        assert self.served.view is not None
        if isinstance(report, Round):
            if self.hung:
                log.info("%s: NVML answers again", self.name)
            self.hung = False
        elif isinstance(report, Probe):
            self._on_probe(report)
        elif isinstance(report, WaitFailed):
            if not self._blind:
                log.warning(
                    "%s: NVML's event wait failed (%s): every GPU is Unhealthy until the "
                    "ones that answer are watched again",
                    self.name,
                    report.error,
                )
            self._blind = report.error
        elif isinstance(report, Rewatched):
            log.info(
                "%s: watching Xid events again%s",
                self.name,
                f" without GPU(s) {', '.join(map(str, report.unwatched))}"
                if report.unwatched
                else "",
            )
            self._blind = ""
        else:
            self._on_xid(report)
        self.recheck()

    def _on_probe(self, report: Probe) -> None:
        index = report.index
        if report.error:
            if index not in self._lost:
                log.warning("%s: GPU %d does not answer: %s", self.name, index, report.error)
            self._lost[index] = report.error
            return
        if self._lost.pop(index, None) is not None:
            log.info("%s: GPU %d answers again", self.name, index)
            self._reset_seen(index, "it was lost and is back")
        before = self._recovery.get(index, RECOVERY_NONE)
        self._recovery[index] = report.recovery_action
        if report.recovery_action != RECOVERY_NONE:
            if before == RECOVERY_NONE:
                log.warning(
                    "%s: GPU %d: the driver asks for recovery action %d",
                    self.name,
                    index,
                    report.recovery_action,
                )
            self._asked_recovery.add(index)
        elif index in self._asked_recovery:
            self._asked_recovery.discard(index)
            self._reset_seen(index, "the driver no longer asks for a recovery action")

    def _reset_seen(self, index: int, why: str) -> None:
        """GPU `index` was reset: it and its MIG devices no longer await one."""
        view = self.served.view
        assert view is not None
        gpu = next((g for g in view.gpus if g.index == index), None)
        if gpu is None:
            return
        uuids = {gpu.uuid, *(m.uuid for m in gpu.migs)}
        cleared = [u for u in uuids if self._awaiting_reset.pop(u, None) is not None]
        if cleared:
            log.info("%s: GPU %d was reset (%s)", self.name, index, why)

    def reset_pending(self) -> list[Unit]:
        """The units awaiting a reset (for the reset check)."""
        units = self.served.units
        gpus = {u.gpu.uuid for u in units if u.uuid in self._awaiting_reset}
        return [
            u
            for u in units
            if u.uuid in self._awaiting_reset or (u.mig is None and u.gpu.uuid in gpus)
        ]

    async def reset_checks(self) -> None:
        """Every `resetCheck.interval` seconds, the checks of each GPU awaiting a reset;
        passing, it was reset."""
        spec = self.spec.reset_check
        if spec is None:
            return
        while True:
            await asyncio.sleep(spec.interval)
            waiting = {u.gpu.index: u for u in self.reset_pending()}
            for index, unit in waiting.items():
                checked = _GpuChecked(unit, self.spec.host_root)
                values = {"id": checked.id, **{k: str(v) for k, v in unit.attributes.items()}}
                problems = [await check_problem(c, checked, values) for c in spec.checks]
                if not any(problems):
                    self._reset_seen(index, "its reset check passed")
                    self.recheck()

    def _on_xid(self, event: XidEvent) -> None:
        view = self.served.view
        assert view is not None
        gpu = next((g for g in view.gpus if g.index == event.index), None)
        if gpu is None:
            log.warning("%s: Xid %d on an unknown GPU", self.name, event.xid)
            return
        action = xid_action(event.xid, self._ignored)
        observe.emit(
            observe.XID,
            self.name,
            f"{gpu.uuid}: Xid {event.xid} ({action})",
            logging.DEBUG,
            gpu=gpu.uuid,
            xid=event.xid,
            action=action,
        )
        if action == "ignore":
            log.info("%s: GPU %d: Xid %d (ignored)", self.name, gpu.index, event.xid)
            return
        uuid = gpu.uuid
        if event.gpu_instance != ALL_INSTANCES:
            mig = next(
                (
                    m
                    for m in gpu.migs
                    if m.gpu_instance == event.gpu_instance
                    and event.compute_instance in (ALL_INSTANCES, m.compute_instance)
                ),
                None,
            )
            # Only that MIG device when it is served as one; a GPU served whole
            # (migStrategy none) is what the Xid concerns.
            if mig is not None and any(u.uuid == mig.uuid for u in self.served.units):
                uuid = mig.uuid
        if action == "reset":
            log.warning(
                "%s: %s: critical Xid %d: Unhealthy until the GPU is reset",
                self.name,
                uuid,
                event.xid,
            )
            self._awaiting_reset[uuid] = event.xid
            return
        log.warning("%s: %s: critical Xid %d", self.name, uuid, event.xid)
        self._critical[uuid] = (time.monotonic(), event.xid)
        # Look again once the quiet time is over (recovery).
        asyncio.get_running_loop().call_later(self.spec.recovery_seconds + 0.001, self.recheck)

    def recheck(self) -> None:
        """Recompute every unit's health; tell the plugins when it changed."""
        now = time.monotonic()
        health: dict[str, str] = {}
        for unit in self.served.units:
            reason = self._unhealthy_because(unit, now)
            health[unit.uuid] = reason
            before = self._health.get(unit.uuid)
            if before is not None and bool(before) != bool(reason):
                state = "Unhealthy" if reason else "Healthy again"
                log.info("%s: %s (%s) is %s", self.name, unit.uuid, unit.resource, state)
        self._health = health
        self.changed()

    def _unhealthy_because(self, unit: Unit, now: float) -> str:
        """Why `unit` is unhealthy now, in a few words; "" when it is healthy."""
        index = unit.gpu.index
        if self.hung:
            return "NVML does not answer"
        if self._blind:
            return "Xid events cannot be watched"
        if index in self._lost:
            return "GPU does not answer"
        for uuid in (unit.uuid, unit.gpu.uuid):
            if (xid := self._awaiting_reset.get(uuid)) is not None:
                return f"Xid {xid}, needs a reset"
        when, xid = max(
            self._critical.get(unit.uuid, (-1e18, 0)), self._critical.get(unit.gpu.uuid, (-1e18, 0))
        )
        if now - when < self.spec.recovery_seconds:
            return f"Xid {xid}"
        if (action := self._recovery.get(index, RECOVERY_NONE)) != RECOVERY_NONE:
            return f"the driver asks for recovery action {action}"
        mps = self.served.mps
        if mps is not None and unit.mig is None and not mps.healthy(unit.resource):
            return "MPS control daemon down"
        return ""


class _GpuChecked:
    """A GPU as the reset checks see it: '{id}' is its UUID, sysfs its PCI folder."""

    def __init__(self, unit: Unit, root: str) -> None:
        self.id = unit.gpu.uuid
        self.attributes = unit.attributes
        self.sysfs: Path | None = Path(host_path(root, f"/sys/bus/pci/devices/{unit.gpu.bus_id}"))
