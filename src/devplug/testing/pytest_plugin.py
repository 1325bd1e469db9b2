"""pytest plugin: the `kubelet` and `kubelet_factory` fixtures.

Registered as the `pytest11` entry point `devplug`; without the installed entry point,
enable it with `-p devplug.testing.pytest_plugin` or `pytest_plugins = [...]` in a
conftest. Options, weakest first:

- ini options `devplug_topology_policy` (none), `devplug_numa_nodes` (unset: the NUMA
  nodes the devices report) and `devplug_timeout` (10 seconds, the default of waits);
- the marker `@pytest.mark.kubelet(topology_policy=..., numa_nodes=..., grace_period=...,
  dial_timeout=..., timeout=...)` on a test, class or module;
- indirect parametrisation of `kubelet`: a dict of those keys, or a policy name.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from devplug.testing.harness import KubeletHarness

OPTIONS = ("topology_policy", "numa_nodes", "grace_period", "dial_timeout", "timeout")
MARKER = (
    "kubelet(topology_policy=None, numa_nodes=None, grace_period=None, dial_timeout=None, "
    "timeout=None): options of the devplug kubelet fixture"
)

_HARNESSES = pytest.StashKey[list["KubeletHarness"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "devplug_topology_policy",
        "topology manager policy of the kubelet fixture: none, best-effort, restricted, "
        "single-numa-node",
        default="none",
    )
    parser.addini(
        "devplug_numa_nodes",
        "NUMA node count of the kubelet fixture (default: those the devices report)",
        default="",
    )
    parser.addini("devplug_timeout", "default timeout of the kubelet fixture's waits", default="10")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


def _checked(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise pytest.UsageError(
            f"{where}: unknown kubelet option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}"
        )
    return {k: v for k, v in options.items() if v is not None}


def _base_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    ini = request.config.getini
    options: dict[str, Any] = {"topology_policy": str(ini("devplug_topology_policy")) or "none"}
    numa = str(ini("devplug_numa_nodes")).strip()
    if numa:
        options["numa_nodes"] = int(numa)
    options["timeout"] = float(str(ini("devplug_timeout")) or 10)
    marker = request.node.get_closest_marker("kubelet")
    if marker is not None:
        if marker.args:
            raise pytest.UsageError("@pytest.mark.kubelet takes keyword arguments only")
        options.update(_checked(marker.kwargs, "@pytest.mark.kubelet"))
    return options


@pytest.fixture
def kubelet_factory(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., KubeletHarness]]:
    """Make started `KubeletHarness`es (keyword arguments override the options); all
    are closed after the test."""
    from devplug.testing.harness import KubeletHarness

    made = request.node.stash.setdefault(_HARNESSES, [])
    mine: list[KubeletHarness] = []

    def make(**overrides: Any) -> KubeletHarness:
        options = {**_base_options(request), **_checked(overrides, "kubelet_factory")}
        harness = KubeletHarness(**options)
        made.append(harness)
        mine.append(harness)
        return harness.start()

    yield make
    errors: list[BaseException] = []
    for harness in reversed(mine):
        try:
            harness.close()
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]


@pytest.fixture
def kubelet(
    request: pytest.FixtureRequest, kubelet_factory: Callable[..., KubeletHarness]
) -> KubeletHarness:
    """A running kubelet simulator in a temporary folder of its own, with helpers to
    start plugins against it and admit pods; stopped and removed after the test."""
    param = getattr(request, "param", None)
    if param is None:
        return kubelet_factory()
    if isinstance(param, str):
        return kubelet_factory(topology_policy=param)
    if isinstance(param, Mapping):
        return kubelet_factory(**param)
    raise pytest.UsageError(f"kubelet parameter {param!r}: expected a dict of options or a policy")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        harnesses = item.stash.get(_HARNESSES, [])
        text = "\n".join(h.plugin_outputs() for h in harnesses if h.processes)
        if text:
            report.sections.append((f"devplug plugin processes ({report.when})", text))
    return report
