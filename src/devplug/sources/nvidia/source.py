"""The GPUs of one `nvidia:` resource entry: NVML start with retries, discovery, and
the health thread whose reports say each GPU's health (devplug.sources.nvidia.gpuhealth).

One source feeds every plugin of the entry (the GPUs' resource, the per-profile MIG
and per-model resources). NVML missing or failing never stops the daemon: the
resources serve zero devices, one line says why, and NVML is tried again with
backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from devplug.config.hardware import DEFAULT_DEV_ROOT
from devplug.config.nvidia import NvidiaSpec
from devplug.config.resource import ResourceSpec
from devplug.sources.nvidia import blocking
from devplug.sources.nvidia.discovery import Unit, layout_problem, units
from devplug.sources.nvidia.gpuhealth import GpuHealth
from devplug.sources.nvidia.health import HealthThread, Report
from devplug.sources.nvidia.mps import MpsDaemons, MpsGpu, mps_resource
from devplug.sources.nvidia.nvml import Nvml, NvmlView

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
        self.health = GpuHealth(self.name, self.spec, self, self._bump)
        self._task: asyncio.Task[None] | None = None
        self._users = 0
        self._nvml: Nvml | None = None  # NVML while it is usable (for MPS compute modes)
        self.mps: MpsDaemons | None = None
        self._mps_task: asyncio.Task[None] | None = None
        if self.spec.sharing == "mps":
            self.mps = MpsDaemons(self.spec, self._compute_mode, self.health.recheck)
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
        return not self.health.reason(unit)

    def health_reason(self, unit: Unit) -> str:
        """Why `unit` is unhealthy ('Xid 79, needs a reset'), "" when it is healthy: the
        value of its DRA taint and the message of the DRA health stream."""
        return self.health.reason(unit)

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
                self.health.recheck()
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
                _log_view(self, view, unwatched)
            self.health.watching_again()
            self._nvml = nvml
            await self._follow_mps()
            self.health.recheck()
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
        checks = asyncio.create_task(self.health.reset_checks(), name=f"reset checks {self.name}")
        try:
            while True:
                try:
                    # Not wait_for: on Python 3.11 it can swallow the cancellation of a
                    # stop that comes as a report arrives, and the stop would hang.
                    async with asyncio.timeout(silence):
                        report = await queue.get()
                except TimeoutError:
                    self.health.silent(silence)
                    continue
                self.health.on_report(report)
        finally:
            checks.cancel()
            await asyncio.gather(checks, return_exceptions=True)
            thread.stop()
            # NVML is shut down next: no event wait of the thread may outlive it
            # (unless NVML hangs: then neither would return).
            if not self.health.hung:
                with contextlib.suppress(blocking.Hung):
                    await blocking.call(
                        thread.join, self.spec.nvml_timeout_seconds, "health thread"
                    )

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


def _log_view(source: GpuSource, view: NvmlView, unwatched: list[int]) -> None:
    """What NVML shows, once per new view: the driver, the devices served, the problems."""
    log.info(
        "%s: NVML driver %s, CUDA %s: %d GPU(s), %d device(s) to serve",
        source.name,
        view.driver_version,
        view.cuda_version,
        len(view.gpus),
        len(source.units),
    )
    for unit in source.units:
        log.info(
            "%s: %s %s (%s) numa %s -> %s",
            source.name,
            unit.uuid,
            unit.gpu.model,
            unit.mig.profile if unit.mig else f"GPU {unit.gpu.index}",
            "-" if unit.numa is None else unit.numa,
            unit.resource,
        )
    if not view.gpus and not view.missing:
        log.warning("%s: NVML sees no GPU: serving none, looking again", source.name)
    for warning in source.warnings:
        log.warning("%s: %s", source.name, warning)
    for index, problem in view.missing:
        log.warning(
            "%s: GPU %d cannot be used now (%s): looking again", source.name, index, problem
        )
    if unwatched:
        log.warning(
            "%s: GPU(s) %s do not report Xid events: only probed",
            source.name,
            ", ".join(map(str, unwatched)),
        )
