"""A plugin author's mistakes are named, over real gRPC with the kubelet simulator: a
blocking call in an async hook is logged with how long it held the event loop and the
hook it was in; a hook that returns the wrong type is refused with the hook's name and
the type expected, and the process keeps serving its other resources."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from serve_helpers import wait_for_output

from devplug import ContainerEdits, Device, Plugin
from devplug.testing import KubeletHarness

BLOCKED = "event loop blocked for"


def devices(n: int) -> list[Device]:
    return [Device(f"d{i}") for i in range(n)]


class Sleepy(Plugin):
    """Blocks the event loop in its allocate hook, as `time.sleep` in async code does."""

    def __init__(self) -> None:
        super().__init__("example.com/sleepy", devices(2))

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        time.sleep(1.5)  # noqa: ASYNC251  # the mistake
        return await super().allocate(devices)


class Patient(Plugin):
    """Waits in its allocate hook as it should: without holding the loop."""

    def __init__(self) -> None:
        super().__init__("example.com/patient", devices(2))

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        await asyncio.sleep(1.5)
        return await super().allocate(devices)


class Forgetful(Plugin):
    """Hooks that return nothing where the framework expects an answer."""

    preferred_allocation = True

    def __init__(self) -> None:
        super().__init__("example.com/forgetful", devices(2))

    async def allocate(self, devices: Sequence[Device]) -> ContainerEdits:
        await super().allocate(devices)
        return None  # type: ignore[return-value]  # the mistake

    async def preferred(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str]:
        return None  # type: ignore[return-value]  # the mistake


class Fine(Plugin):
    def __init__(self) -> None:
        super().__init__("example.com/fine", devices(2))


def test_a_blocking_hook_is_named_with_how_long_it_held_the_loop() -> None:
    with KubeletHarness() as kubelet:
        process = kubelet.start_plugin(Patient(), Sleepy(), Fine())
        # Waiting without blocking first: it is never reported.
        assert kubelet.admit({"example.com/patient": 1}).admitted
        assert kubelet.admit({"example.com/sleepy": 1}).admitted
        output = wait_for_output(process, BLOCKED)
        [line] = [line for line in output.splitlines() if BLOCKED in line]
        assert "example.com/sleepy: Sleepy.allocate (" in line
        assert "test_loop_watchdog.py:" in line
        assert "asyncio.to_thread" in line
        seconds = float(line.split(BLOCKED)[1].split()[0])
        assert seconds >= 1.0  # the sleep's 1.5 s, less the beat's granularity
        assert kubelet.admit({"example.com/fine": 1}).admitted
        assert process.stop() == 0
        assert process.output.count(BLOCKED) == 1


def test_a_hook_returning_the_wrong_type_is_named_and_the_daemon_keeps_serving() -> None:
    with KubeletHarness() as kubelet:
        process = kubelet.start_plugin(Forgetful(), Fine())
        pod = kubelet.admit({"example.com/forgetful": 1})
        assert not pod.admitted
        assert (
            "Forgetful.preferred returned NoneType, expected a sequence of device IDs"
            in pod.message
        ), pod.message
        assert "code = Internal" in pod.message
        assert kubelet.admit({"example.com/fine": 1}).admitted
        assert process.running
        assert process.stop() == 0


class ForgetfulAllocate(Forgetful):
    """Only allocate wrong (no preferred-allocation offered)."""

    preferred_allocation = False


def test_an_allocate_hook_returning_none_is_named() -> None:
    with KubeletHarness() as kubelet:
        process = kubelet.start_plugin(ForgetfulAllocate(), Fine())
        pod = kubelet.admit({"example.com/forgetful": 1})
        assert not pod.admitted
        assert (
            "ForgetfulAllocate.allocate returned NoneType, expected ContainerEdits" in pod.message
        ), pod.message
        assert "'NoneType' object has no attribute" not in process.output
        assert kubelet.admit({"example.com/fine": 1}).admitted
        assert process.stop() == 0


class Unlabelled(Plugin):
    def node_labels(self) -> dict[str, str]:
        return None  # type: ignore[return-value]  # the mistake


async def test_a_node_labels_hook_returning_the_wrong_type_is_named(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from hw_helpers import wait_for_file

    from devplug.framework.daemon import Daemon
    from devplug.outputs.nfd import HEADER, FeatureFile

    features = short_tmp / "features"
    plugins = [Unlabelled("example.com/unlabelled", devices(1)), Labelled()]

    stop = asyncio.Event()
    daemon = Daemon(plugins, short_tmp / "plugins", services=[FeatureFile(features)])
    task = asyncio.create_task(daemon.run(stop))
    # The other resource's labels are written; the daemon keeps serving.
    await wait_for_file(features, lambda t: t == HEADER + "example.com/labelled.count=1\n")
    assert not task.done()
    stop.set()
    await task
    assert (
        "example.com/unlabelled: Unlabelled.node_labels returned NoneType, expected a mapping "
        "of strings" in caplog.text
    )


class Labelled(Plugin):
    def __init__(self) -> None:
        super().__init__("example.com/labelled", devices(1))

    def node_labels(self) -> dict[str, str]:
        return {"example.com/labelled.count": str(len(self.devices))}
