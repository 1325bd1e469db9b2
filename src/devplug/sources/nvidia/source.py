"""The GPUs of one `nvidia:` resource entry: NVML start with retries, discovery, health.

One source feeds every plugin of the entry (the GPUs' resource, the per-profile MIG
and per-model resources). NVML missing or failing never stops the daemon: the
resources serve zero devices, one line says why, and NVML is tried again with
backoff. Health: a critical Xid, a double-bit ECC error or a GPU that stops answering
turns its devices Unhealthy at once. After a transient Xid (devplug.sources.nvidia.xids)
a GPU that answers and has had no critical event for `recoverySeconds` turns Healthy
again; after one that needs a reset it stays Unhealthy until it was reset, seen as one
of: the GPU lost and back (a reset takes it off the bus), the driver's recovery action
going back to none after it asked for one, or the entry's `resetCheck` passing. The
state lives in the daemon: a node reboot (which resets every GPU) starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from devplug.config.hardware import DEFAULT_DEV_ROOT
from devplug.config.nvidia import NvidiaSpec
from devplug.config.resource import ResourceSpec
from devplug.framework import observe
from devplug.sources.health import check_problem
from devplug.sources.nvidia import blocking
from devplug.sources.nvidia.discovery import Unit, host_path, layout_problem, units
from devplug.sources.nvidia.health import (
    HealthThread,
    Probe,
    Report,
    Rewatched,
    Round,
    WaitFailed,
)
from devplug.sources.nvidia.mps import MpsDaemons, MpsGpu, mps_resource
from devplug.sources.nvidia.nvml import ALL_INSTANCES, RECOVERY_NONE, Nvml, NvmlView, XidEvent
from devplug.sources.nvidia.xids import ignored_xids, xid_action

log = logging.getLogger("devplug.sources.nvidia")

FIRST_RETRY_S = 1.0


class GpuSource:
    def __init__(self, resource: ResourceSpec, dev_root: str = DEFAULT_DEV_ROOT) -> None:
        assert resource.nvidia is not None
        self.resource = resource
        self.name = resource.name
        self.spec: NvidiaSpec = resource.nvidia
        self.dev_root = dev_root  # the host path of the driver's nodes (the config's devRoot)
        self.view: NvmlView | None = None
        self.units: list[Unit] = []
        self.warnings: list[str] = []
        self.problem = ""  # why NVML is not usable now; empty when it is
        self.layout_problem = ""  # why the MIG layout is not served; empty when it is
        self.ready = asyncio.Event()  # the first attempt is over, success or not
        self._generation = 0
        self._changed = asyncio.Event()
        self._lost: dict[int, str] = {}  # GPU index -> why it does not answer
        self._critical: dict[
            str, tuple[float, int]
        ] = {}  # UUID -> (time, Xid) of its last transient Xid
        self._awaiting_reset: dict[str, int] = {}  # UUID -> the Xid that needs a reset
        self._recovery: dict[int, int] = {}  # GPU index -> the driver's recovery action
        self._asked_recovery: set[int] = set()  # GPUs whose driver asked for an action
        self._blind = ""  # why no event can be seen now (the wait failed); empty: fine
        self._ignored = ignored_xids(self.spec.ignored_xids, self.spec.enabled_xids)
        self._hung = False
        self._health: dict[str, str] = {}  # UUID -> why it is unhealthy ("": healthy)
        self._task: asyncio.Task[None] | None = None
        self._users = 0
        self._nvml: Nvml | None = None  # NVML while it is usable (for MPS compute modes)
        self.mps: MpsDaemons | None = None
        self._mps_task: asyncio.Task[None] | None = None
        if self.spec.sharing == "mps":
            self.mps = MpsDaemons(self.spec, self._compute_mode, self._recheck)
        self._logged = ""  # the NVML problem last logged (one line per new problem)
        self._logged_view: NvmlView | None = None
        self._started: Nvml | None = None  # started by read_now, taken over by run

    # -- for plugins ---------------------------------------------------------------------

    def read_now(self) -> None:
        """Discover synchronously, once (start-up and `devplug check`); a failure is kept
        in `problem`. NVML stays started for `run` to carry on with."""
        timeout = self.spec.nvml_timeout_seconds

        def read() -> tuple[Nvml, NvmlView]:
            nvml = Nvml()
            nvml.start()
            try:
                return nvml, nvml.read()
            except BaseException:
                nvml.stop()
                raise

        try:
            self._started, view = blocking.call_sync(read, timeout, "NVML discovery")
        except Exception as error:
            self.problem = _describe(error)
        else:
            self._set_view(view)

    def release(self) -> None:
        """Stop the NVML that `read_now` started, when no `run` will take it over (a
        one-shot read: the devices of a simulated fleet's pool)."""
        nvml, self._started = self._started, None
        if nvml is not None:
            nvml.stop()

    def healthy(self, unit: Unit) -> bool:
        return not self._health.get(unit.uuid, "")

    def health_reason(self, unit: Unit) -> str:
        """Why `unit` is unhealthy ('Xid 79, needs a reset'), "" when it is healthy: the
        value of its DRA taint and the message of the DRA health stream."""
        return self._health.get(unit.uuid, "")

    @property
    def generation(self) -> int:
        return self._generation

    async def wait_changed(self, generation: int) -> int:
        """The next generation; raises what stopped the source if it failed."""
        while self._generation == generation:
            await self._changed.wait()
        task = self._task
        if task is not None and task.done() and not task.cancelled():
            task.result()
        return self._generation

    async def attach(self) -> None:
        """Start the source with its first plugin; wait for the first attempt."""
        self._users += 1
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"nvml {self.name}")
            self._task.add_done_callback(lambda _: self._bump())  # plugins see a failure
        await self.ready.wait()

    async def detach(self) -> None:
        self._users -= 1
        if self._users == 0 and self._task is not None:
            await self._stop_mps()  # first: putting the compute modes back needs NVML
            task, self._task = self._task, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _compute_mode(self, index: int, mode: int | None) -> int:
        """Set GPU `index`'s compute mode (None: EXCLUSIVE_PROCESS); the one it had."""
        nvml = self._nvml
        if nvml is None:
            raise RuntimeError("NVML is not usable")

        def swap() -> int:
            before = nvml.compute_mode(index)
            nvml.set_compute_mode(index, mode)
            return before

        return await blocking.call(swap, self.spec.nvml_timeout_seconds, "nvmlDeviceSetComputeMode")

    async def _follow_mps(self) -> None:
        """Have a running MPS daemon for each GPU served, before the devices are listed."""
        if self.mps is None:
            return
        gpus: dict[str, list[MpsGpu]] = {}
        for u in self.units:
            if u.mig is None:
                gpus.setdefault(u.resource, []).append(MpsGpu(u.uuid, u.gpu.index, u.gpu.memory))
        await self.mps.update(mps_resource(self.spec, r, found) for r, found in gpus.items())
        if self._mps_task is None:
            self._mps_task = asyncio.create_task(self.mps.supervise(), name=f"mps {self.name}")

    async def _stop_mps(self) -> None:
        task, self._mps_task = self._mps_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.mps is not None:
            await self.mps.stop()

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        delay = min(FIRST_RETRY_S, self.spec.retry_max_seconds)
        timeout = self.spec.nvml_timeout_seconds
        while True:
            nvml, self._started = self._started, None
            try:
                if nvml is not None and self.view is not None:
                    view = self.view  # read at start-up: no second discovery
                else:
                    nvml = await blocking.call(Nvml, timeout, "loading NVML")
                    await blocking.call(nvml.start, timeout, "nvmlInit")
                    view = await blocking.call(nvml.read, timeout, "NVML discovery")
                events: Any = None
                unwatched: list[int] = []
                if self.spec.health_checks:
                    events, unwatched = await blocking.call(
                        nvml.watch_events, timeout, "registering Xid events"
                    )
            except Exception as error:
                problem = _describe(error)
                if problem != self._logged:
                    log.warning(
                        "%s: NVML is not usable (%s): serving no GPUs, retrying with backoff",
                        self.name,
                        problem,
                    )
                else:
                    log.debug("%s: NVML still not usable (%s)", self.name, problem)
                self.problem = self._logged = problem
                self._set_view(None)
                self._recheck()
                self.ready.set()
                if nvml is not None:
                    await _quietly(nvml.stop, timeout)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.spec.retry_max_seconds)
                continue
            if self._logged:
                log.info("%s: NVML is usable again", self.name)
            self.problem = self._logged = ""
            self._set_view(view)
            if view != self._logged_view:  # a view is described once, not per retry
                self._logged_view = view
                self._log_view(view, unwatched)
            self._lost = {}
            self._blind = ""
            self._nvml = nvml
            await self._follow_mps()
            self._recheck()
            self.ready.set()
            try:
                if view.gpus and not view.missing:
                    delay = min(FIRST_RETRY_S, self.spec.retry_max_seconds)
                    await self._watch(nvml, events)
                # Serve the GPUs that answer; look for the others (or any, when NVML
                # sees none: a driver still coming up) again after a while.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._watch(nvml, events)
                delay = min(delay * 2, self.spec.retry_max_seconds)
            finally:
                self._nvml = None
                await _quietly(nvml.stop, timeout)

    async def _watch(self, nvml: Nvml, events: Any) -> None:
        if not self.spec.health_checks:
            await asyncio.Future()  # discovery only: nothing more to do
        assert self.view is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Report] = asyncio.Queue()
        thread = HealthThread(
            nvml,
            events,
            [g.index for g in self.view.gpus],
            self.spec.probe_seconds,
            lambda report: _post(loop, queue, report),
        )
        # NVML that stops answering: no probe round for this long.
        silence = self.spec.probe_seconds + self.spec.nvml_timeout_seconds
        thread.start()
        checks = asyncio.create_task(self._reset_checks(), name=f"reset checks {self.name}")
        try:
            while True:
                try:
                    # Not wait_for: on Python 3.11 it can swallow the cancellation of a
                    # stop that comes as a report arrives, and the stop would hang.
                    async with asyncio.timeout(silence):
                        report = await queue.get()
                except TimeoutError:
                    if not self._hung:
                        log.warning(
                            "%s: NVML has not answered for %g s: every GPU is Unhealthy",
                            self.name,
                            silence,
                        )
                    self._hung = True
                    self._recheck()
                    continue
                self._on_report(report)
        finally:
            checks.cancel()
            await asyncio.gather(checks, return_exceptions=True)
            thread.stop()
            # NVML is shut down next: no event wait of the thread may outlive it
            # (unless NVML hangs: then neither would return).
            if not self._hung:
                with contextlib.suppress(blocking.Hung):
                    await blocking.call(
                        thread.join, self.spec.nvml_timeout_seconds, "health thread"
                    )

    def _on_report(self, report: Report) -> None:
        assert self.view is not None
        if isinstance(report, Round):
            if self._hung:
                log.info("%s: NVML answers again", self.name)
            self._hung = False
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
        self._recheck()

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
        assert self.view is not None
        gpu = next((g for g in self.view.gpus if g.index == index), None)
        if gpu is None:
            return
        uuids = {gpu.uuid, *(m.uuid for m in gpu.migs)}
        cleared = [u for u in uuids if self._awaiting_reset.pop(u, None) is not None]
        if cleared:
            log.info("%s: GPU %d was reset (%s)", self.name, index, why)

    def reset_pending(self) -> list[Unit]:
        """The units awaiting a reset (for the reset check)."""
        gpus = {u.gpu.uuid for u in self.units if u.uuid in self._awaiting_reset}
        return [
            u
            for u in self.units
            if u.uuid in self._awaiting_reset or (u.mig is None and u.gpu.uuid in gpus)
        ]

    async def _reset_checks(self) -> None:
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
                    self._recheck()

    def _on_xid(self, event: XidEvent) -> None:
        assert self.view is not None
        gpu = next((g for g in self.view.gpus if g.index == event.index), None)
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
            if mig is not None and any(u.uuid == mig.uuid for u in self.units):
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
        asyncio.get_running_loop().call_later(self.spec.recovery_seconds + 0.001, self._recheck)

    def _recheck(self) -> None:
        """Recompute every unit's health; tell the plugins when it changed."""
        now = time.monotonic()
        health: dict[str, str] = {}
        for unit in self.units:
            reason = self._unhealthy_because(unit, now)
            health[unit.uuid] = reason
            before = self._health.get(unit.uuid)
            if before is not None and bool(before) != bool(reason):
                state = "Unhealthy" if reason else "Healthy again"
                log.info("%s: %s (%s) is %s", self.name, unit.uuid, unit.resource, state)
        self._health = health
        self._bump()

    def _unhealthy_because(self, unit: Unit, now: float) -> str:
        """Why `unit` is unhealthy now, in a few words; "" when it is healthy."""
        index = unit.gpu.index
        if self._hung:
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
        if self.mps is not None and unit.mig is None and not self.mps.healthy(unit.resource):
            return "MPS control daemon down"
        return ""

    def _set_view(self, view: NvmlView | None) -> None:
        self.view = view
        self.layout_problem = ""
        if view is None:
            self.units, self.warnings = [], []
            return
        self.units, self.warnings = units(view, self.name, self.spec, self.dev_root)
        if problem := layout_problem(view, self.spec):  # as NVIDIA's plugin: nothing served
            self.layout_problem = problem
            self.units, self.warnings = [], [f"invalid MIG configuration: {problem}: serving none"]

    def _bump(self) -> None:
        self._generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _log_view(self, view: NvmlView, unwatched: list[int]) -> None:
        log.info(
            "%s: NVML driver %s, CUDA %s: %d GPU(s), %d device(s) to serve",
            self.name,
            view.driver_version,
            view.cuda_version,
            len(view.gpus),
            len(self.units),
        )
        for unit in self.units:
            log.info(
                "%s: %s %s (%s) numa %s -> %s",
                self.name,
                unit.uuid,
                unit.gpu.model,
                unit.mig.profile if unit.mig else f"GPU {unit.gpu.index}",
                "-" if unit.numa is None else unit.numa,
                unit.resource,
            )
        if not view.gpus and not view.missing:
            log.warning("%s: NVML sees no GPU: serving none, looking again", self.name)
        for warning in self.warnings:
            log.warning("%s: %s", self.name, warning)
        for index, problem in view.missing:
            log.warning(
                "%s: GPU %d cannot be used now (%s): looking again", self.name, index, problem
            )
        if unwatched:
            log.warning(
                "%s: GPU(s) %s do not report Xid events: only probed",
                self.name,
                ", ".join(map(str, unwatched)),
            )


class _GpuChecked:
    """A GPU as the reset checks see it: '{id}' is its UUID, sysfs its PCI folder."""

    def __init__(self, unit: Unit, root: str) -> None:
        self.id = unit.gpu.uuid
        self.attributes = unit.attributes
        self.sysfs: Path | None = Path(host_path(root, f"/sys/bus/pci/devices/{unit.gpu.bus_id}"))


def _post(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Report], report: Report) -> None:
    """Hand a report from the health thread to the loop (thread-safe)."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon stopped
        loop.call_soon_threadsafe(queue.put_nowait, report)


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    if isinstance(error, ImportError):
        return f"the NVML binding cannot be imported: {text}"
    return f"{type(error).__name__}: {text}" if type(error).__name__ not in text else text


async def _quietly(fn: Any, timeout: float) -> None:
    try:
        await blocking.call(fn, timeout, "nvmlShutdown")
    except Exception as error:
        log.debug("nvmlShutdown: %s", error)
