"""Shared fixtures: a short temp folder, and the real one-node cluster (`real_node`,
`real_node_image`) that every real-node test of a run shares; each test marked with the
tier of its folder (unit, process, controlplane, realnode, image)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from devplug.testing.controlplane import ControlPlane, how_to_provide
from devplug.testing.realnode import MachineLock, RealNode, missing

if TYPE_CHECKING:
    from tests.dra_helpers import NodeDirs

ROOT = Path(__file__).resolve().parent.parent
_NODE_LOCK = pytest.StashKey[MachineLock]()
_NODE_LOCK_ERROR = pytest.StashKey[str]()
_OWN_BASETEMP = pytest.StashKey[str]()
# The folder of a running node.sh cluster to use instead of starting one (iterating on
# tests): `node.sh up FOLDER`, then DEVPLUG_NODE_DIR=FOLDER pytest ...
ATTACH_ENV = "DEVPLUG_NODE_DIR"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp folder with a short path: unix socket paths must fit in 107 bytes, and
    pytest's tmp_path plus a socket name can exceed that."""
    folder = Path(tempfile.mkdtemp(prefix="dp-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def module_dirs() -> Iterator[NodeDirs]:
    """The folders of a simulated node, for the scenario of one file (short paths:
    sockets live there)."""
    from tests.dra_helpers import NodeDirs

    folder = Path(tempfile.mkdtemp(prefix="dp-"))
    try:
        yield NodeDirs(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def daemons() -> Iterator[list[Any]]:
    """The processes a test starts (it appends them: a `subprocess.Popen`, or anything
    with a `stop()`), stopped at its end, last first, whatever happened."""
    from sim_helpers import stop_process

    started: list[Any] = []
    yield started
    for daemon in reversed(started):
        if isinstance(daemon, subprocess.Popen):
            stop_process(daemon, timeout=15)
        else:
            daemon.stop()


TIERS = ("unit", "process", "controlplane", "realnode", "image")


def pytest_configure(config: pytest.Config) -> None:
    """A short base for tmp_path (unless --basetemp is given): unix socket paths must fit
    in 107 bytes, and a parallel run (pytest-xdist) adds the worker's name to every path.
    The base is made once, by the process that starts the workers, and removed at the end."""
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    config.option.basetemp = tempfile.mkdtemp(prefix="dpt-")
    config.stash[_OWN_BASETEMP] = config.option.basetemp


def pytest_unconfigure(config: pytest.Config) -> None:
    if own := config.stash.get(_OWN_BASETEMP, None):
        shutil.rmtree(own, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier marker from the folder: `pytest -m unit` runs the pure tier alone, and
    `make test` splits the suite by these markers, so a test outside the tier folders
    (or folders within them) would belong to no run's plan: it is refused."""
    tiers = {item: _tier(item.path) for item in items}
    outside = sorted({str(item.path) for item, tier in tiers.items() if tier is None})
    if outside:
        raise pytest.UsageError(
            f"test files outside the tier folders ({', '.join(TIERS)}): {', '.join(outside)}"
        )
    for item, tier in tiers.items():
        item.add_marker(getattr(pytest.mark, str(tier)))


def _tier(path: Path) -> str | None:
    """The tier folder a test file lies in, directly or in a folder of its own (a story
    split by behaviour, tests/controlplane/dra/)."""
    for folder in path.parents:
        if folder.name in TIERS and folder.parent.name == "tests":
            return folder.name
    return None


def _node_lock(config: pytest.Config) -> MachineLock:
    """Wait for this machine's one real cluster (another checkout's run may hold it);
    the wait is told on the terminal, and a timeout fails the tests that need it."""
    lock = config.stash.setdefault(_NODE_LOCK, MachineLock())
    if lock.held or _NODE_LOCK_ERROR in config.stash:
        return lock
    node = RealNode.find(ROOT)
    lock.node_sh = node.script if node is not None else None
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(message: str) -> None:
        if reporter is not None:
            reporter.write_line(f"real node: {message}")
        else:
            print(f"real node: {message}", file=sys.stderr)

    try:
        lock.acquire(say=say)
    except TimeoutError as error:
        config.stash[_NODE_LOCK_ERROR] = str(error)
    return lock


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    # Outside pytest-timeout's timer: the wait for the lock is not the test's time.
    uses = "real_node" in getattr(item, "fixturenames", ())
    if uses and missing(ROOT) is None and not os.environ.get(ATTACH_ENV):
        _node_lock(item.config)
    return (yield)


@pytest.fixture(scope="session")
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    """The real one-node cluster (node.sh: kubelet, containerd, control plane), started
    once per test run and shared by every test that asks for it. Skipped, saying how to
    provide it, where root, the binaries or the packages are missing. Tests use a
    namespace of their own (`real_node.namespace()`) and leave the node as they found it."""
    why = missing(ROOT)
    if why is not None:
        pytest.skip(f"no real node: {why}")
    if running := os.environ.get(ATTACH_ENV):
        # A cluster started elsewhere (node.sh up FOLDER): used as it is, left running.
        node = RealNode.find(ROOT)
        assert node is not None
        node.folder = Path(running)
        node.attach()
        yield node
        return
    lock = _node_lock(request.config)
    if error := request.config.stash.get(_NODE_LOCK_ERROR, None):
        pytest.fail(error)
    node = RealNode.find(ROOT)
    assert node is not None
    try:
        node.up()
        yield node
    finally:
        node.down()
        lock.release()


@pytest.fixture(scope="session")
def real_node_image(real_node: RealNode) -> str:
    """The image of `make image`, imported into the real node; its name."""
    from image_helpers import build_image, image_name

    real_node.import_image(build_image())
    return image_name()


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    """One throwaway control plane (etcd, kube-apiserver, kube-scheduler) per test run,
    shared by every test that talks to an API server; skipped, saying how to provide
    the binaries, where they are absent."""
    plane = ControlPlane.find(ROOT)
    if plane is None:
        pytest.skip(how_to_provide(ROOT))
    try:
        yield plane.start()
    finally:
        plane.stop()
