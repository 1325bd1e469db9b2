"""Health checks of a resource's devices, run only when the config has `health`.

Each check is one of: a sysfs attribute of the device that must have a value, a file
that must exist, a command (an argument list, never a shell) that must exit 0 within
its timeout. Every `interval` seconds each device seen and present is checked, and a
device that comes is checked before it is listed; a failing check turns it Unhealthy,
a passing round Healthy again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from devplug.config import hardware
from devplug.framework.device import Attribute
from devplug.ground.trust import program_problem
from devplug.sources.sysfs.select import fill

log = logging.getLogger("devplug.sources.health")


class Checked(Protocol):
    """What the checks read of a device: its ID, attributes and sysfs folder."""

    @property
    def id(self) -> str: ...

    @property
    def attributes(self) -> Mapping[str, Attribute]: ...

    @property
    def sysfs(self) -> Path | None: ...


async def run_checks(
    check_round: Callable[[], Awaitable[bool]], interval: float, changed: Callable[[], None]
) -> None:
    """Run `check_round()` every `interval` seconds; call `changed()` when it says a
    verdict changed. Runs until cancelled."""
    while True:
        await asyncio.sleep(interval)
        if await check_round():
            changed()


async def verdicts(devices: Sequence[Checked], health: hardware.HealthSpec) -> dict[str, bool]:
    """Check every device once, side by side: healthy or not, by device ID."""
    results = await asyncio.gather(*(device_healthy(d, health) for d in devices))
    return {d.id: ok for d, ok in zip(devices, results, strict=True)}


async def device_healthy(base: Checked, health: hardware.HealthSpec) -> bool:
    values = {"id": base.id, **{k: str(v) for k, v in base.attributes.items()}}
    for check in health.checks:
        problem = await check_problem(check, base, values)
        if problem:
            log.info("device %s: health check failed: %s", base.id, problem)
            return False
    return True


async def check_problem(
    check: hardware.CheckSpec, base: Checked, values: dict[str, str]
) -> str | None:
    if check.attribute is not None:
        if base.sysfs is None:
            return "no sysfs folder"
        try:
            text = (base.sysfs / check.attribute).read_text(errors="replace").strip()
        except OSError as e:
            return f"{check.attribute}: {e.strerror or e}"
        if check.value is not None and text != check.value:
            return f"{check.attribute} is {text!r}, expected {check.value!r}"
        if check.value is None and not text:
            return f"{check.attribute} is empty"
        return None
    if check.file is not None:
        path = fill(check.file, values)
        exists = await asyncio.to_thread(os.path.exists, path)  # NFS and the like can block
        return None if exists else f"{path} does not exist"
    assert check.command is not None
    argv = [fill(arg, values) for arg in check.command]
    if problem := await asyncio.to_thread(program_problem, argv[0]):  # changed since load?
        return f"not run: {problem}"
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as e:
        return f"{argv[0]}: {e.strerror or e}"
    try:
        async with asyncio.timeout(check.timeout):
            code = await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return f"{argv[0]} took longer than {check.timeout:g} s"
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise
    return None if code == 0 else f"{argv[0]} exited {code}"
