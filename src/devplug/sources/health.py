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
from collections.abc import Callable
from typing import TYPE_CHECKING

from devplug.sources import hardware
from devplug.sources.sysfs.select import fill

if TYPE_CHECKING:
    from devplug.sources.hostdev import HostDevicePlugin, _Base

log = logging.getLogger("devplug.sources.health")


async def run_checks(
    plugin: HostDevicePlugin, health: hardware.HealthSpec, changed: Callable[[], None]
) -> None:
    """Check every device every `health.interval` seconds; call `changed()` when a
    verdict changes. Runs until cancelled."""
    while True:
        await asyncio.sleep(health.interval)
        if await check_round(plugin, health):
            changed()


async def check_round(
    plugin: HostDevicePlugin, health: hardware.HealthSpec, bases: list[_Base] | None = None
) -> bool:
    """Check `bases` (default: every device there) once; True when a verdict changed."""
    bases = plugin.present_bases() if bases is None else bases
    results = await asyncio.gather(*(device_healthy(b, health) for b in bases))
    return plugin.set_checks({b.id: ok for b, ok in zip(bases, results, strict=True)})


async def device_healthy(base: _Base, health: hardware.HealthSpec) -> bool:
    values = {"id": base.id, **{k: str(v) for k, v in base.attributes.items()}}
    for check in health.checks:
        problem = await check_problem(check, base, values)
        if problem:
            log.info("device %s: health check failed: %s", base.id, problem)
            return False
    return True


async def check_problem(
    check: hardware.CheckSpec, base: _Base, values: dict[str, str]
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
