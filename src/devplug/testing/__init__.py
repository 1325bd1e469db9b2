"""Test device plugins against a kubelet simulator, from plain synchronous tests.

    def test_widgets(kubelet):                       # the pytest fixture
        kubelet.start_plugin(Widgets())              # a process; waits for registration
        assert kubelet.device_ids("example.com/widget") == ["widget0", "widget1"]
        pod = kubelet.admit({"example.com/widget": 1})
        assert pod.admitted, pod
        assert pod.device_nodes() == {"/dev/widget0": "/dev/widget0"}

The `kubelet` fixture comes from the pytest plugin `devplug.testing.pytest_plugin`,
registered under the `pytest11` entry point `devplug`, so installing devplug enables
it. `KubeletHarness` is the same object for use without pytest. Names are loaded on
first use, so that loading the pytest plugin costs nothing for tests that do not use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devplug.ground.lazy import lazy_exports

if TYPE_CHECKING:
    from devplug.fakes.sysfs import FakeSysfs
    from devplug.ground.process import ChildProcess
    from devplug.testing.harness import (
        KubeletHarness,
        PluginExited,
        PluginProcess,
    )
    from devplug.testing.pods import PodAdmission, pod_manifest

_EXPORTS = {
    "ChildProcess": "devplug.ground.process",
    "FakeSysfs": "devplug.fakes.sysfs",
    "KubeletHarness": "devplug.testing.harness",
    "PluginExited": "devplug.testing.harness",
    "PluginProcess": "devplug.testing.harness",
    "PodAdmission": "devplug.testing.pods",
    "pod_manifest": "devplug.testing.pods",
}

__all__ = [
    "ChildProcess",
    "FakeSysfs",
    "KubeletHarness",
    "PluginExited",
    "PluginProcess",
    "PodAdmission",
    "pod_manifest",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
