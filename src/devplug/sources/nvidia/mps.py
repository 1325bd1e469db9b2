"""MPS sharing as NVIDIA's plugin lays it out: one CUDA MPS control daemon per shared
resource, started and supervised here.

Each resource served with `sharing: mps` gets `nvidia-cuda-mps-control -d` with its
pipe and log folders under `mps.root` at NVIDIA's paths (`<root>/<resource>/pipe`,
`<root>/<resource>/log`, the resource name's '/' a folder: `nvidia.com/gpu/pipe`) and
its GPUs visible; through its control interface (commands on the program's stdin, as
NVIDIA's plugin sends them) it is told the limits of one replica on each GPU: the GPU's
memory and 100 % of its SMs divided by the replicas (`set_default_device_pinned_mem_limit`,
`set_default_active_thread_percentage`). A container gets what NVIDIA's plugin gives it:
the pipe folder at `/mps/<resource>/pipe` (CUDA_MPS_PIPE_DIRECTORY) and `<root>/shm`
as /dev/shm, so a workload written for NVIDIA's MPS runs unchanged. The GPUs are put
in EXCLUSIVE_PROCESS compute mode first, as NVIDIA's plugin does, and given back the
mode they had when the daemon is stopped.
Every `mps.checkSeconds` each daemon is asked `get_default_active_thread_percentage`;
one that does not answer has its resource's replicas Unhealthy and is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from devplug.config.nvidia import NvidiaSpec, replicas_of
from devplug.framework.device import Mount
from devplug.ground.trust import program_problem

log = logging.getLogger("devplug.sources.nvidia.mps")

SHM = "shm"  # <root>/shm: the /dev/shm clients and the daemons share
CONTAINER_ROOT = "/mps"  # where a container finds the pipe folder (NVIDIA's)


@dataclass(frozen=True, slots=True)
class MpsGpu:
    """One GPU of a shared resource."""

    uuid: str
    index: int
    memory: int  # bytes


@dataclass(frozen=True, slots=True)
class MpsResource:
    """One shared resource, its GPUs, and where its daemon's folders are."""

    name: str
    gpus: tuple[MpsGpu, ...]
    replicas: int
    pipe: Path
    log: Path

    def memory_limits(self) -> list[str]:
        """Pinned memory per replica on each GPU, in the daemon's device order."""
        return [f"{g.memory // self.replicas // (1024 * 1024)}M" for g in self.gpus]

    def percentage(self) -> str:
        return f"{100 // self.replicas}"


def folder(root: str, resource: str) -> Path:
    return Path(root, *PurePosixPath(resource).parts)


def mps_resource(spec: NvidiaSpec, resource: str, gpus: Iterable[MpsGpu]) -> MpsResource:
    base = folder(spec.mps.root, resource)
    ordered = tuple(sorted(gpus, key=lambda g: g.index))
    return MpsResource(resource, ordered, replicas_of(spec, resource), base / "pipe", base / "log")


def client_edits(resource: str, spec: NvidiaSpec) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """What a container using a replica needs, as from NVIDIA's plugin: the daemon's
    pipe folder (where CUDA finds it) and the shared /dev/shm."""
    pipe = folder(spec.mps.root, resource) / "pipe"
    in_container = str(PurePosixPath(CONTAINER_ROOT, resource, "pipe"))
    env = {"CUDA_MPS_PIPE_DIRECTORY": in_container}
    mounts = (Mount(str(pipe), in_container), Mount(str(Path(spec.mps.root) / SHM), "/dev/shm"))
    return env, mounts


# Sets GPU `index`'s NVML compute mode (None: EXCLUSIVE_PROCESS); returns the one it had.
ComputeMode = Callable[[int, int | None], Awaitable[int]]


class MpsDaemons:
    """The control daemons of an entry's shared resources, kept running."""

    def __init__(
        self,
        spec: NvidiaSpec,
        compute_mode: ComputeMode,
        changed: Callable[[], None],
    ) -> None:
        self.spec = spec
        self.compute_mode = compute_mode
        self.changed = changed
        self.resources: dict[str, MpsResource] = {}
        self._running: set[str] = set()  # resources whose daemon answered last time
        self._started: dict[str, MpsResource] = {}  # daemons started (or tried) here
        self._failing: set[str] = set()  # resources whose daemon cannot start (said once)
        self._modes: dict[int, int] = {}  # the compute mode each GPU had, given back on stop
        self._lock = asyncio.Lock()  # one round (start, check or stop) at a time
        self._closed = False

    def healthy(self, resource: str) -> bool:
        return resource in self._running

    async def update(self, resources: Iterable[MpsResource]) -> None:
        """Serve these resources: stop the daemons of resources gone or changed, start
        those missing (all at once, so that the first device list has them running)."""
        async with self._lock:
            if self._closed:
                return
            self.resources = {r.name: r for r in resources if r.gpus}
            gone = [r for n, r in self._started.items() if self.resources.get(n) != r]
            await asyncio.gather(*(self._stop(r) for r in gone))
            await asyncio.gather(*(self._keep(r) for r in self.resources.values()))

    async def supervise(self) -> None:
        """Every `mps.checkSeconds`, ask each daemon; start again those that do not answer."""
        while True:
            await asyncio.sleep(self.spec.mps.check_seconds)
            async with self._lock:
                if self._closed:
                    return
                await asyncio.gather(*(self._keep(r) for r in self.resources.values()))

    async def stop(self) -> None:
        """Stop every daemon started here and give its GPUs back the modes they had."""
        async with self._lock:
            self._closed = True
            await asyncio.gather(*(self._stop(r) for r in list(self._started.values())))

    async def _keep(self, resource: MpsResource) -> None:
        name = resource.name
        answers = await self._answers(resource)
        if answers and name in self._started:
            if name not in self._running:
                self._running.add(name)
                self.changed()
            return
        if name in self._running:
            log.warning("MPS control daemon of %s does not answer: starting it again", name)
            self._running.discard(name)
            self.changed()
        self._started[name] = resource  # the compute modes may change: put back on stop
        try:
            # One already answering in this resource's folder was left by an earlier run
            # of devplug (or NVIDIA's daemon): it is kept and told the limits again.
            await self._start(resource, launch=not answers)
        except (OSError, RuntimeError) as error:
            if name not in self._failing:
                log.warning("MPS control daemon of %s cannot start: %s", name, error)
            self._failing.add(name)
            return
        self._failing.discard(name)
        self._running.add(name)
        self.changed()

    async def _stop(self, resource: MpsResource) -> None:
        code, _ = await self._control(resource, [], "quit\n")
        if code == 0:
            log.info("MPS control daemon of %s stopped", resource.name)
        for gpu in resource.gpus:
            if (mode := self._modes.pop(gpu.index, None)) is not None:
                with contextlib.suppress(Exception):
                    await self.compute_mode(gpu.index, mode)
        self._started.pop(resource.name, None)
        self._running.discard(resource.name)

    async def _start(self, resource: MpsResource, *, launch: bool) -> None:
        for path in (resource.pipe, resource.log, Path(self.spec.mps.root) / SHM):
            path.mkdir(parents=True, exist_ok=True)
        for gpu in resource.gpus:
            with contextlib.suppress(Exception):  # not allowed everywhere: MPS works without
                before = await self.compute_mode(gpu.index, None)
                self._modes.setdefault(gpu.index, before)
        if launch:
            code, output = await self._control(resource, ["-d"], None)
            if code != 0:
                raise RuntimeError(f"{self.spec.mps.control} -d exited {code}: {output.strip()}")
        memory = resource.memory_limits()
        commands = [
            *(f"set_default_device_pinned_mem_limit {i} {m}" for i, m in enumerate(memory)),
            f"set_default_active_thread_percentage {resource.percentage()}",
        ]
        code, output = await self._control(resource, [], "\n".join(commands) + "\n")
        if code != 0:
            raise RuntimeError(f"setting the limits failed ({code}): {output.strip()}")
        log.info(
            "MPS control daemon of %s %s on %d GPU(s): %s pinned memory, %s %% of the SMs "
            "per replica",
            resource.name,
            "started" if launch else "kept from before",
            len(resource.gpus),
            ", ".join(memory),
            resource.percentage(),
        )

    async def _answers(self, resource: MpsResource) -> bool:
        code, _ = await self._control(resource, [], "get_default_active_thread_percentage\n")
        return code == 0

    async def _control(
        self, resource: MpsResource, args: list[str], stdin: str | None
    ) -> tuple[int, str]:
        """Run the control program for `resource`: (exit status, what it printed)."""
        env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(resource.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(resource.log),
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in resource.gpus),
        }
        if problem := program_problem(self.spec.mps.control):  # changed since load?
            return 126, f"not run: {problem}"
        try:
            process = await asyncio.create_subprocess_exec(
                self.spec.mps.control,
                *args,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
            )
        except OSError as error:
            return 127, f"{self.spec.mps.control}: {error.strerror or error}"
        try:
            async with asyncio.timeout(self.spec.nvml_timeout_seconds):
                output, _ = await process.communicate(stdin.encode() if stdin else None)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return 124, "timed out"
        return process.returncode or 0, output.decode(errors="replace")
