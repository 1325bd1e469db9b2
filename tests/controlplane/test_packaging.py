"""The package as users get it: the licence, the metadata, `python -m devplug`, the wheel
and sdist of `make dist`, and dependency floors that are true (the lowest versions
pyproject.toml allows, installed exactly in a fresh venv, run devplug)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from email.parser import HeaderParser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# The extras a user installs; `envtest` is the tests' control plane (pinned tools).
USER_EXTRAS = ["udev", "dra", "fleet", "report"]
API = ROOT / "src" / "devplug" / "api"


def requirements(extras: list[str]) -> list[Requirement]:
    found = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        found += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return found


def floor(requirement: Requirement) -> str:
    """The lower bound a requirement declares (`>=X`, or `==X`)."""
    bounds = [s.version for s in requirement.specifier if s.operator in (">=", "==")]
    assert len(bounds) == 1, f"{requirement}: no single lower bound"
    return bounds[0]


def constraints(extras: list[str]) -> str:
    """A pip constraints file pinning every requirement to its declared floor."""
    pins = {r.name: floor(r) for r in requirements(extras)}
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def test_the_licence_is_the_apache_2_0_text_the_metadata_declares() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]


def test_the_metadata_says_what_the_package_is() -> None:
    classifiers = PROJECT["classifiers"]
    assert {"Typing :: Typed", "Framework :: Pytest"} <= set(classifiers)
    # The pytest plugin and py.typed that these classifiers announce are shipped.
    assert "devplug" in PROJECT["entry-points"]["pytest11"]
    assert (ROOT / "src" / "devplug" / "py.typed").exists()
    assert {"Source", "Issues", "Changelog", "Documentation"} <= set(PROJECT["urls"])
    versions = [c.rsplit(":: ", 1)[1] for c in classifiers if "Python :: 3." in c]
    assert min(versions, key=lambda v: int(v.split(".")[1])) == "3.11"
    assert PROJECT["requires-python"] == ">=3.11"


def test_the_changelog_has_an_entry_for_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{PROJECT['version']}]" in changelog


def test_development_tools_are_a_dependency_group_not_a_published_extra() -> None:
    assert "dev" not in PROJECT["optional-dependencies"]
    groups = PYPROJECT["dependency-groups"]
    included = {g["include-group"] for g in groups["dev"] if isinstance(g, dict)}
    tools = {
        Requirement(r).name
        for name in included
        for r in groups[name]
        if isinstance(r, str)  # an include of another group is not a requirement
    }
    assert {"pytest", "mypy", "ruff", "grpcio-tools", "build", "twine"} <= tools
    # What `make` installs: every extra, and the group.
    makefile = (ROOT / "Makefile").read_text()
    assert "--group dev" in makefile
    extras = ",".join(sorted(PROJECT["optional-dependencies"]))
    assert re.search(rf"^EXTRAS := {extras}$", makefile, re.M)


def test_every_runtime_requirement_has_a_floor() -> None:
    """No requirement a user installs is open-ended downwards."""
    for requirement in requirements(list(PROJECT["optional-dependencies"])):
        floor(requirement)


def test_the_protobuf_and_grpc_floors_are_what_the_generated_modules_check() -> None:
    """Each *_pb2.py refuses a protobuf older than the protoc that made it (VersionError
    on import), each *_pb2_grpc.py a grpcio older than its generator: the floors are
    the newest of these, never lower."""
    protobuf: list[tuple[int, ...]] = []
    grpc: list[tuple[int, ...]] = []
    for module in API.rglob("*_pb2.py"):
        found = re.search(
            r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),",
            module.read_text(),
        )
        assert found, module
        protobuf.append(tuple(int(n) for n in found.groups()))
    for module in API.rglob("*_pb2_grpc.py"):
        found = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", module.read_text())
        assert found, module
        grpc.append(tuple(int(n) for n in found.group(1).split(".")))
    floors = {r.name: floor(r) for r in requirements([])}
    assert floors["protobuf"] == ".".join(map(str, max(protobuf)))
    assert floors["grpcio"] == ".".join(map(str, max(grpc)))


def test_python_m_devplug_is_the_devplug_command() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "devplug", "--version"], capture_output=True, text=True, timeout=60
    )
    script = subprocess.run(
        [str(Path(sys.executable).parent / "devplug"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert module.returncode == script.returncode == 0, module.stderr
    assert module.stdout == script.stdout
    assert PROJECT["version"] in module.stdout
    usage = subprocess.run(
        [sys.executable, "-m", "devplug", "no-such-command"], capture_output=True, text=True
    )
    assert usage.returncode == 2
    assert "no-such-command" in usage.stderr


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make dist`: the wheel and sdist built and checked (twine, LICENSE, py.typed), in
    a folder of this run's own (DIST), so that nothing else's `make dist` replaces them."""
    folder = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["make", "-s", "dist", f"DIST={folder}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "PASSED" in done.stdout
    return folder


def wheel_of(dist: Path) -> Path:
    [wheel] = dist.glob("devplug-*.whl")
    return wheel


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_make_dist_builds_a_wheel_and_sdist_that_carry_the_licence(dist: Path) -> None:
    with zipfile.ZipFile(wheel_of(dist)) as wheel:
        names = wheel.namelist()
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = HeaderParser().parsestr(wheel.read(meta).decode())
        licence = wheel.read(next(n for n in names if n.endswith("/licenses/LICENSE")))
    assert licence == (ROOT / "LICENSE").read_bytes()
    assert "devplug/py.typed" in names
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert {"Typing :: Typed", "Framework :: Pytest"} <= set(metadata.get_all("Classifier"))
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert urls["Source"] == PROJECT["urls"]["Source"]
    # The published extras are the users' ones; no development tools in the metadata.
    assert set(metadata.get_all("Provides-Extra")) == set(PROJECT["optional-dependencies"])
    required = metadata.get_all("Requires-Dist")
    assert not [r for r in required if Requirement(r).name in ("pytest", "mypy", "ruff")]
    [sdist] = dist.glob("devplug-*.tar.gz")
    with tarfile.open(sdist) as archive:
        inside = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "src/devplug/py.typed", "pyproject.toml"} <= inside


FLOORS_CHECK = """
import importlib, json, pkgutil, sys
import devplug.api
wire = [m.name for m in pkgutil.walk_packages(devplug.api.__path__, "devplug.api.")]
for name in wire:
    importlib.import_module(name)
print(json.dumps(sorted(wire)))
"""
# devplug's DRA client code with aiohttp at its floor, against a real API server:
# ResourceSlices listed through resource.k8s.io/v1, with no official client installed.
DRA_CHECK = """
import asyncio, importlib.util, sys
from devplug.apiserver.client import KubeApi
from devplug.framework.dra.claims import ApiClaims
async def main():
    async with KubeApi.from_kubeconfig(sys.argv[1]) as api:
        ApiClaims(api)
        print((await api.call("GET", "/apis/resource.k8s.io/v1/resourceslices"))["kind"])
asyncio.run(main())
print(importlib.util.find_spec("kubernetes") is not None)
"""


class FloorsVenv:
    """A fresh venv with devplug's wheel and exactly the declared floors."""

    def __init__(self, folder: Path, wheel: Path) -> None:
        venv.create(folder, with_pip=True)
        self.python = str(folder / "bin" / "python")
        self.bin = folder / "bin"
        pins = folder / "floors.txt"
        pins.write_text(constraints(USER_EXTRAS))
        # Wheels only: no floor may need a compiler to install.
        self.pip(
            *("install", "--only-binary=:all:", "--constraint", str(pins)),
            f"{wheel}[{','.join(USER_EXTRAS)}]",
        )

    def pip(self, *args: str) -> None:
        done = subprocess.run(
            [self.python, "-m", "pip", "--disable-pip-version-check", "-q", *args],
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert done.returncode == 0, done.stderr[-4000:]

    def installed(self) -> dict[str, str]:
        done = subprocess.run(
            [self.python, "-m", "pip", "list", "--format", "json"],
            capture_output=True,
            text=True,
            check=True,
        )
        return {normalised(p["name"]): p["version"] for p in json.loads(done.stdout)}

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def floors_venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> FloorsVenv:
    return FloorsVenv(tmp_path_factory.mktemp("floors") / "venv", wheel_of(dist))


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_declared_floors_install_and_run_devplug(
    floors_venv: FloorsVenv, kubeconfig: str
) -> None:
    """Each requirement at exactly its floor: every wire module imports, `devplug demo`
    runs its story, `devplug check` reads the DRA config, and the DRA client lists
    ResourceSlices (resource.k8s.io/v1) from a real API server."""
    installed = floors_venv.installed()
    for requirement in requirements(USER_EXTRAS):
        assert Version(installed[normalised(requirement.name)]) == Version(floor(requirement))
    imported = floors_venv.run(floors_venv.python, "-c", FLOORS_CHECK)
    assert imported.returncode == 0, imported.stderr
    modules = json.loads(imported.stdout)
    assert "devplug.api.v1beta1.api_pb2" in modules
    assert len([m for m in modules if m.endswith("_pb2")]) == len(list(API.rglob("*_pb2.py")))
    demo = floors_venv.run(str(floors_venv.bin / "devplug"), "demo", "-o", "json")
    assert demo.returncode == 0, demo.stderr
    events = [json.loads(line)["event"] for line in demo.stdout.splitlines()]
    assert events[-1] == "summary"
    assert "reregistered" in events
    check = floors_venv.run(
        str(floors_venv.bin / "devplug"), "check", "--config", "deploy/dra/config.yaml"
    )
    assert check.returncode == 0, check.stderr
    assert "devplug.io/null" in check.stdout
    dra = floors_venv.run(floors_venv.python, "-c", DRA_CHECK, kubeconfig)
    assert dra.returncode == 0, dra.stderr
    assert dra.stdout.split() == ["ResourceSliceList", "False"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_declared_floors_serve_gpus_through_nvml(
    floors_venv: FloorsVenv, short_tmp: Path
) -> None:
    """The GPU overlay's config checked with nvidia-ml-py at its floor, on the fake NVML
    driver of an 8-GPU host (the NVML names devplug and its fake driver use exist)."""
    from devplug.fakes.nvml import eight_gpus
    from tests.controlplane.test_deploy import check_on_fake_gpus, materialise
    from tests.controlplane.test_deploy import render as kustomize

    config = materialise(kustomize("overlays/gpu"), short_tmp / "pod")
    out = check_on_fake_gpus(config, eight_gpus(), short_tmp / "host", python=floors_venv.python)
    assert "8 device(s), 8 healthy" in out


@contextlib.contextmanager
def below_floor(venv: FloorsVenv, name: str) -> Iterator[None]:
    """The newest release of `name` older than its floor, installed in the venv for the
    block; the floor again afterwards."""
    requirement = next(r for r in requirements(USER_EXTRAS) if r.name == name)
    venv.pip("install", "--only-binary=:all:", f"{name}<{floor(requirement)}")
    assert Version(venv.installed()[name]) < Version(floor(requirement))
    try:
        yield
    finally:
        venv.pip("install", "--only-binary=:all:", f"{name}=={floor(requirement)}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_below_the_floors_devplug_breaks(floors_venv: FloorsVenv, kubeconfig: str) -> None:
    """The floors are the lowest that work, not guesses: the release before each of
    these fails as the floors test would see it."""
    with below_floor(floors_venv, "protobuf"):
        imported = floors_venv.run(floors_venv.python, "-c", FLOORS_CHECK)
    assert imported.returncode != 0
    assert "VersionError" in imported.stderr
    # Back at its floor: devplug works again.
    assert floors_venv.run(floors_venv.python, "-c", FLOORS_CHECK).returncode == 0
    with below_floor(floors_venv, "nvidia-ml-py"):
        nvml = floors_venv.run(floors_venv.python, "-c", "import devplug.fakes.nvml")
    assert nvml.returncode != 0
    assert "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION" in nvml.stderr
