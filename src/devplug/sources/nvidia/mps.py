"""MPS sharing: one CUDA MPS control daemon per shared GPU, started and supervised here.

Each GPU served with `sharing: mps` gets `nvidia-cuda-mps-control -d` with its own pipe
and log folders (`<mps.root>/<resource>/<GPU UUID>/{pipe,log}`) and only that GPU
visible; through its control interface (commands on the program's stdin, as NVIDIA's
device plugin sends them) it is told the limits of one replica: the GPU's memory and
100 % of its SMs divided by the replicas (`set_default_device_pinned_mem_limit`,
`set_default_active_thread_percentage`). The GPU is put in EXCLUSIVE_PROCESS compute
mode first, as NVIDIA's plugin does, and given back the mode it had when the daemon is
stopped.
Every `mps.checkSeconds` each daemon is asked `get_default_active_thread_percentage`;
one that does not answer has its replicas Unhealthy and is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from devplug.framework.device import Mount
from devplug.sources.nvidia.config import NvidiaSpec, replicas_of
from devplug.trust import program_problem

log = logging.getLogger("devplug.sources.nvidia.mps")

SHM = "shm"  # <root>/shm: the /dev/shm clients and the daemon share


@dataclass(frozen=True, slots=True)
class MpsGpu:
    """One shared GPU and where its daemon's folders are."""

    uuid: str
    index: int
    memory: int  # bytes
    replicas: int
    pipe: Path
    log: Path

    def limits(self) -> tuple[str, str]:
        """(pinned memory per replica as MPS writes it, SM percentage per replica)."""
        memory = f"{self.memory // self.replicas // (1024 * 1024)}M"
        return memory, f"{100 // self.replicas}"


def folder(root: str, resource: str, uuid: str) -> Path:
    return Path(root) / resource.replace("/", "_") / uuid


def mps_gpu(spec: NvidiaSpec, resource: str, uuid: str, index: int, memory: int) -> MpsGpu:
    base = folder(spec.mps.root, resource, uuid)
    return MpsGpu(uuid, index, memory, replicas_of(spec, resource), base / "pipe", base / "log")


def client_edits(gpu: MpsGpu, spec: NvidiaSpec) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """What a container using a replica needs: the daemon's pipe folder (where CUDA
    finds it), its log folder, the shared /dev/shm, and its replica's limits."""
    memory, percentage = gpu.limits()
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(gpu.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(gpu.log),
        # Client-side limits: at most the daemon's defaults, for a client that asks.
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory}",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percentage,
    }
    mounts = (
        Mount(str(gpu.pipe)),
        Mount(str(gpu.log)),
        Mount(str(Path(spec.mps.root) / SHM), "/dev/shm"),
    )
    return env, mounts


# Sets GPU `index`'s NVML compute mode (None: EXCLUSIVE_PROCESS); returns the one it had.
ComputeMode = Callable[[int, int | None], Awaitable[int]]


class MpsDaemons:
    """The control daemons of one resource's shared GPUs, kept running."""

    def __init__(
        self,
        spec: NvidiaSpec,
        compute_mode: ComputeMode,
        changed: Callable[[], None],
    ) -> None:
        self.spec = spec
        self.compute_mode = compute_mode
        self.changed = changed
        self.gpus: dict[str, MpsGpu] = {}
        self._running: set[str] = set()  # UUIDs whose daemon answered last time
        self._started: dict[str, MpsGpu] = {}  # daemons started (or tried) here, to stop
        self._failing: set[str] = set()  # UUIDs whose daemon cannot start (said once)
        self._modes: dict[str, int] = {}  # the compute mode each GPU had, given back on stop
        self._lock = asyncio.Lock()  # one round (start, check or stop) at a time
        self._closed = False

    def healthy(self, uuid: str) -> bool:
        return uuid in self._running

    async def update(self, gpus: Iterable[MpsGpu]) -> None:
        """Serve these GPUs: stop the daemons of GPUs gone, start those missing (all at
        once, so that the first device list already has them running)."""
        async with self._lock:
            if self._closed:
                return
            self.gpus = {g.uuid: g for g in gpus}
            gone = [g for u, g in self._started.items() if u not in self.gpus]
            await asyncio.gather(*(self._stop(g) for g in gone))
            await asyncio.gather(*(self._keep(g) for g in self.gpus.values()))

    async def supervise(self) -> None:
        """Every `mps.checkSeconds`, ask each daemon; start again those that do not answer."""
        while True:
            await asyncio.sleep(self.spec.mps.check_seconds)
            async with self._lock:
                if self._closed:
                    return
                await asyncio.gather(*(self._keep(g) for g in self.gpus.values()))

    async def stop(self) -> None:
        """Stop every daemon started here and give its GPU back the mode it had."""
        async with self._lock:
            self._closed = True
            await asyncio.gather(*(self._stop(g) for g in list(self._started.values())))

    async def _keep(self, gpu: MpsGpu) -> None:
        answers = await self._answers(gpu)
        if answers and gpu.uuid in self._started:
            if gpu.uuid not in self._running:
                self._running.add(gpu.uuid)
                self.changed()
            return
        if gpu.uuid in self._running:
            log.warning("MPS control daemon of %s does not answer: starting it again", gpu.uuid)
            self._running.discard(gpu.uuid)
            self.changed()
        self._started[gpu.uuid] = gpu  # the compute mode may change: put back on stop
        try:
            # One already answering in this GPU's folder was left by an earlier run of
            # devplug: it is kept and told the limits again.
            await self._start(gpu, launch=not answers)
        except (OSError, RuntimeError) as error:
            if gpu.uuid not in self._failing:
                log.warning("MPS control daemon of %s cannot start: %s", gpu.uuid, error)
            self._failing.add(gpu.uuid)
            return
        self._failing.discard(gpu.uuid)
        self._running.add(gpu.uuid)
        self.changed()

    async def _stop(self, gpu: MpsGpu) -> None:
        code, _ = await self._control(gpu, [], "quit\n")
        if code == 0:
            log.info("MPS control daemon of %s stopped", gpu.uuid)
        if (mode := self._modes.pop(gpu.uuid, None)) is not None:
            with contextlib.suppress(Exception):
                await self.compute_mode(gpu.index, mode)
        self._started.pop(gpu.uuid, None)
        self._running.discard(gpu.uuid)

    async def _start(self, gpu: MpsGpu, *, launch: bool) -> None:
        for path in (gpu.pipe, gpu.log, Path(self.spec.mps.root) / SHM):
            path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):  # not allowed everywhere: MPS works without
            before = await self.compute_mode(gpu.index, None)
            self._modes.setdefault(gpu.uuid, before)
        if launch:
            code, output = await self._control(gpu, ["-d"], None)
            if code != 0:
                raise RuntimeError(f"{self.spec.mps.control} -d exited {code}: {output.strip()}")
        memory, percentage = gpu.limits()
        commands = [
            f"set_default_device_pinned_mem_limit 0 {memory}",
            f"set_default_active_thread_percentage {percentage}",
        ]
        code, output = await self._control(gpu, [], "\n".join(commands) + "\n")
        if code != 0:
            raise RuntimeError(f"setting the limits failed ({code}): {output.strip()}")
        log.info(
            "MPS control daemon of %s %s: %s pinned memory, %s %% of the SMs per replica",
            gpu.uuid,
            "started" if launch else "kept from before",
            memory,
            percentage,
        )

    async def _answers(self, gpu: MpsGpu) -> bool:
        code, _ = await self._control(gpu, [], "get_default_active_thread_percentage\n")
        return code == 0

    async def _control(self, gpu: MpsGpu, args: list[str], stdin: str | None) -> tuple[int, str]:
        """Run the control program for `gpu`: (exit status, what it printed)."""
        env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(gpu.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(gpu.log),
            "CUDA_VISIBLE_DEVICES": gpu.uuid,
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
