"""Every error real NVML gives on the paths devplug uses (as nvml.h lists them), raised
by the fake driver, and what devplug makes of each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from devplug.fakes import nvml as fakenvml
from devplug.fakes.gpus import FakeGpuHost, eight_gpus, fake_host
from devplug.sources import parse_config
from devplug.sources.nvidia.nvml import DOUBLE_BIT_ECC, RECOVERY_NONE, Nvml
from devplug.sources.nvidia.source import GpuSource


@pytest.fixture
def host(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpuHost:
    fake = FakeGpuHost(short_tmp / "gpus", eight_gpus())
    for key, value in fake.env.items():
        monkeypatch.setenv(key, value)
    return fake


@pytest.fixture
def nvml(host: FakeGpuHost) -> Iterator[Nvml]:
    lib = Nvml()
    lib.start()
    yield lib
    lib.stop()


@pytest.mark.parametrize(
    ("driver", "error"),
    [
        ({"library": False}, pynvml.NVMLError_LibraryNotFound),  # no libnvidia-ml.so.1
        ({"loaded": False}, pynvml.NVMLError_DriverNotLoaded),
        ({"initError": "NoPermission"}, pynvml.NVMLError_NoPermission),
        ({"initError": "LibRmVersionMismatch"}, pynvml.NVMLError_LibRmVersionMismatch),
        ({"initError": "Unknown"}, pynvml.NVMLError_Unknown),
    ],
)
def test_nvml_init(host: FakeGpuHost, driver: dict[str, object], error: type[Exception]) -> None:
    host.set_driver(**driver)
    with pytest.raises(error):
        Nvml().start()
    [resource] = parse_config(f"resources:\n- nvidia: {{hostRoot: {host.host_root}}}\n").resources
    source = GpuSource(resource)
    source.read_now()
    assert error.__name__ in source.problem  # said in the one line, then retried


def test_without_the_description_the_library_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fakenvml.DESCRIPTION_ENV, raising=False)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fakenvml.nvmlInit()


@pytest.mark.parametrize(
    "name", ["GpuIsLost", "NoPermission", "InsufficientPower", "IrqIssue", "Unknown"]
)
def test_a_gpu_nvml_cannot_hand_over(host: FakeGpuHost, name: str) -> None:
    """nvmlDeviceGetHandleByIndex's errors: that GPU is missing, with why; the others
    are served."""
    if name == "GpuIsLost":
        host.set_lost(3, True)
    else:
        host.set(3, error=name)
    lib = Nvml()
    lib.start()
    try:
        view = lib.read()
    finally:
        lib.stop()
    assert [g.index for g in view.gpus] == [0, 1, 2, 4, 5, 6, 7]
    [(index, why)] = view.missing
    assert index == 3
    assert why.startswith(f"NVMLError_{name}")


def test_events(host: FakeGpuHost, nvml: Nvml) -> None:
    nvml.read()
    host.set(5, events=False)  # nvmlDeviceGetSupportedEventTypes: none
    host.set(6, events=["dbe"])  # no Xid events: not watched for Xids
    events, unwatched = nvml.watch_events()
    assert unwatched == [5, 6]
    with pytest.raises(pynvml.NVMLError_NotSupported):  # asking for what it lacks
        fakenvml.nvmlDeviceRegisterEvents(
            fakenvml.nvmlDeviceGetHandleByIndex(6), pynvml.nvmlEventTypeXidCriticalError, events
        )
    assert nvml.wait_event(events, 1) is None  # NVMLError_Timeout
    host.inject_ecc(1)
    host.inject_ecc(2, double_bit=False)  # not registered: never seen
    host.inject_xid(4, 79, gi=1, ci=0)
    first = nvml.wait_event(events, 1000)
    second = nvml.wait_event(events, 1000)
    assert first is not None
    assert second is not None
    assert (first.index, first.xid) == (1, DOUBLE_BIT_ECC)
    assert (second.index, second.xid, second.gpu_instance, second.compute_instance) == (
        4,
        79,
        1,
        0,
    )
    host.set_lost(2, True)  # a GPU of the set falls off the bus
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.wait_event(events, 1000)
    host.set_lost(2, False)
    host.set_driver(waitError="Unknown")
    with pytest.raises(pynvml.NVMLError_Unknown):
        nvml.wait_event(events, 1000)
    nvml.free(events)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # freed twice
        fakenvml.nvmlEventSetFree(events)


def test_probe(host: FakeGpuHost, nvml: Nvml) -> None:
    nvml.read()
    assert nvml.probe(0) == RECOVERY_NONE
    host.set(0, recoveryAction=2)  # NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    assert nvml.probe(0) == 2
    host.set(0, recoveryAction=None)  # a driver without the field: NotSupported in it
    assert nvml.probe(0) == RECOVERY_NONE
    host.set_lost(0, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.probe(0)


def test_mig_paths(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeGpuHost(
        short_tmp / "mig",
        fake_host("gpus: [{model: H100-SXM5-80GB, mig: [4g.40gb]}, {model: H100-SXM5-80GB}]"),
    )
    for key, value in fake.env.items():
        monkeypatch.setenv(key, value)
    lib = Nvml()
    lib.start()
    try:
        view = lib.read()  # slots 1-6 of GPU 0 are empty: NotFound, skipped
        assert [m.profile for m in view.gpus[0].migs] == ["4g.40gb"]
        assert (view.gpus[0].max_mig_devices, view.gpus[1].max_mig_devices) == (7, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG off
            lib.mig_geometry(1)
        gpu0 = fakenvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotFound):
            fakenvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 1)
        fake.set(0, migConfig=False)  # no NVIDIA_MIG_CONFIG_DEVICES: may look, not change
        with pytest.raises(pynvml.NVMLError_NoPermission):
            fakenvml.nvmlDeviceCreateGpuInstance(gpu0, 19)
        fake.set(0, migAccess=False)
        with pytest.raises(pynvml.NVMLError_NoPermission):
            fakenvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 0)
        assert "NoPermission" in lib.read().gpus[0].mig_problem
    finally:
        lib.stop()
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # every call once shut down
        fakenvml.nvmlDeviceGetCount()
    lib.stop()  # a second shutdown is Uninitialized, which stop() does not raise
