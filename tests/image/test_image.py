"""The container image, built by `make image` and run from its unpacked root file system.

`podman run` cannot set rlimits on these machines, so the image's rootfs is unpacked
with umoci and its entrypoint run under chroot in a private mount namespace, with the
kubelet simulator's plugin folder bind-mounted where the kubelet's would be.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from image_helpers import ARCHIVE, build_image, image_name, project_version
from serve_helpers import free_port, http_get, wait_for_path

from devplug.testing import KubeletHarness
from devplug.testing.harness import PluginProcess

ROOT = Path(__file__).resolve().parents[2]
IMAGE_CONFIG = "/etc/devplug/config.yaml"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class Unpacked:
    rootfs: Path
    args: list[str]  # the image's entrypoint + command
    env: list[str]


@pytest.fixture(scope="module")
def image() -> Iterator[Unpacked]:
    build_image()
    work = Path(tempfile.mkdtemp(prefix="dp-img-"))
    try:
        layout = work / "oci"
        layout.mkdir()
        subprocess.run(["tar", "-xf", str(ARCHIVE), "-C", str(layout)], check=True)
        index = json.loads((layout / "index.json").read_text())
        tag = image_name()
        names = [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]
        assert names == [tag]
        bundle = work / "bundle"
        subprocess.run(
            ["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)],
            check=True,
            capture_output=True,
        )
        process = json.loads((bundle / "config.json").read_text())["process"]
        yield Unpacked(bundle / "rootfs", process["args"], process["env"])
    finally:
        # The bind mounts live in the served process's own mount namespace; never remove
        # a tree that still has a mount in it here (it could be the host's /dev).
        mounts = Path("/proc/self/mountinfo").read_text()
        if f" {work}/" not in mounts:
            shutil.rmtree(work, ignore_errors=True)


def in_image(image: Unpacked, *args: str) -> list[str]:
    """A command run in the image's root, with its environment only."""
    return ["chroot", str(image.rootfs), "/usr/bin/env", "-i", *image.env, *args]


def test_image_entrypoint_is_devplug_serve_with_the_mounted_config(image: Unpacked) -> None:
    assert image.args == ["devplug", "serve", "--config", IMAGE_CONFIG]
    assert (image.rootfs / IMAGE_CONFIG.lstrip("/")).is_file()


def test_image_says_its_version_source_and_revision_in_oci_labels(image: Unpacked) -> None:
    """The labels of the image's config in the archive: the project's version, the
    Source URL of pyproject.toml, and the commit it was built from."""
    import tomllib

    with tarfile.open(ARCHIVE) as archive:

        def blob(digest: str) -> Any:
            member = archive.extractfile(f"blobs/{digest.replace(':', '/', 1)}")
            assert member is not None
            return json.load(member)

        index = archive.extractfile("index.json")
        assert index is not None
        [manifest] = json.load(index)["manifests"]
        labels = blob(blob(manifest["digest"])["config"]["digest"])["config"]["Labels"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.version"] == project_version()
    assert labels["org.opencontainers.image.source"] == project["urls"]["Source"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    revision = labels["org.opencontainers.image.revision"]
    commits = subprocess.run(
        ["git", "log", "--format=%H", "-n", "200"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert revision.removesuffix("-dirty") in commits


def test_image_prints_its_version_and_checks_the_default_config(image: Unpacked) -> None:
    version = subprocess.run(
        in_image(image, "devplug", "--version"), capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"devplug {project_version()}"
    check = subprocess.run(
        in_image(image, "devplug", "check", "--config", IMAGE_CONFIG),
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert "devplug.io/null" in check.stdout


def test_image_carries_the_api_client_of_the_dra_driver_and_not_the_official_one(
    image: Unpacked,
) -> None:
    """`deploy/dra` serves through DRA, which talks to the API server through devplug's
    client on aiohttp; the official `kubernetes` package is the test kit's, not the
    image's."""
    loaded = subprocess.run(
        in_image(
            image,
            "python3",
            "-c",
            "import importlib.util, aiohttp, devplug.apiserver.client, devplug.framework.dra"
            ".service; print(importlib.util.find_spec('kubernetes') is None)",
        ),
        capture_output=True,
        text=True,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["True"]


def serve_in_image(
    kubelet: KubeletHarness, image: Unpacked, args: list[str], resources: list[str]
) -> PluginProcess:
    """`args` run in the image as the DaemonSet runs it: the host's /dev and /sys, a /proc
    and the kubelet's plugin folder mounted in, in a mount namespace of its own."""
    rootfs = image.rootfs
    mountpoint = rootfs / "var/lib/kubelet/device-plugins"
    mountpoint.mkdir(parents=True, exist_ok=True)
    kubelet.plugin_dir.mkdir(parents=True, exist_ok=True)
    setup = " && ".join(
        [
            f"mount --rbind /dev {shlex.quote(str(rootfs / 'dev'))}",
            f"mount --rbind /sys {shlex.quote(str(rootfs / 'sys'))}",
            f"mount -t proc proc {shlex.quote(str(rootfs / 'proc'))}",
            f"mount --bind {shlex.quote(str(kubelet.plugin_dir))} {shlex.quote(str(mountpoint))}",
            "exec " + shlex.join(in_image(image, *args)),
        ]
    )
    return kubelet.start_command(
        ["unshare", "--mount", "sh", "-c", setup], name="image", wait_for=resources
    )


def test_image_serves_and_registers_through_a_bind_mounted_plugin_folder(
    image: Unpacked,
) -> None:
    from devplug.sources import load_config

    resources = [r.name for r in load_config(ROOT / "src/devplug/config/default.yaml").resources]
    port = free_port()
    with KubeletHarness() as kubelet:
        served = serve_in_image(
            kubelet, image, [*image.args, "--metrics-port", str(port)], resources
        )
        pod = kubelet.admit({"devplug.io/zero": 1})
        assert pod.admitted, pod
        assert pod.device_nodes() == {"/dev/zero": "/dev/zero", "/dev/full": "/dev/full"}
        # Every resource is listed, so each stream is open: ready.
        assert http_get(port, "/readyz") == (200, "ok\n")
        text = http_get(port, "/metrics")[1]
        assert 'devplug_allocations_total{resource="devplug.io/zero"} 1.0' in text
        assert served.stop() == 0
        assert not list(kubelet.plugin_dir.glob("devplug-*.sock"))


def test_image_listens_to_uevents_for_devices_selected_in_the_hosts_sysfs(
    image: Unpacked,
) -> None:
    """pyudev and libudev are in the image: PCI/USB hot-plug through the kernel's
    uevents, not only /dev (a warning says so when they are missing)."""
    config = image.rootfs / "etc/devplug/pci.yaml"
    # Any PCI device of this host (a class mask of 0), found in the mounted /sys.
    config.write_text(
        "resources:\n  - name: example.com/pci\n    groups:\n"
        '      - pci: {class: "0x000000/0x000000"}\n'
    )
    with KubeletHarness() as kubelet:
        served = serve_in_image(
            kubelet,
            image,
            ["devplug", "serve", "--config", "/etc/devplug/pci.yaml"],
            ["example.com/pci"],
        )
        assert served.stop() == 0
        output = served.output
    assert "serving example.com/pci" in output  # the log is there to read
    assert "hot-plug is seen through /dev only" not in output, output


def test_image_checks_the_gpu_overlay_config_with_nvml(image: Unpacked) -> None:
    """The GPU overlay's config in the image: the NVML binding is there and only the
    driver's library is missing (on a GPU node the container toolkit mounts it)."""
    config = image.rootfs / "etc/devplug/gpu.yaml"
    shutil.copy(ROOT / "deploy/overlays/gpu/config.yaml", config)
    check = subprocess.run(
        in_image(image, "devplug", "check", "--config", "/etc/devplug/gpu.yaml"),
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert "nvidia.com/gpu (nvidia" in check.stdout
    assert "NVMLError_LibraryNotFound" in check.stdout + check.stderr


def test_the_archive_loads_into_podman_and_containerd(image: Unpacked, short_tmp: Path) -> None:
    loaded = subprocess.run(
        ["podman", "load", "-i", str(ARCHIVE)], capture_output=True, text=True, timeout=120
    )
    assert loaded.returncode == 0, loaded.stderr
    assert f"Loaded image: {image_name()}" in loaded.stdout + loaded.stderr

    # A containerd of our own (own root, state, socket, empty config), as on a node.
    config = short_tmp / "config.toml"
    config.write_text("version = 2\n")
    address = short_tmp / "run" / "containerd.sock"
    address.parent.mkdir()
    daemon = subprocess.Popen(
        [
            *("containerd", "--config", str(config), "--address", str(address)),
            *("--root", str(short_tmp / "root"), "--state", str(short_tmp / "state")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_path(address)
        ctr = ["ctr", "--address", str(address), "--namespace", "k8s.io", "images"]
        imported = subprocess.run(
            [*ctr, "import", str(ARCHIVE)], capture_output=True, text=True, timeout=120
        )
        assert imported.returncode == 0, imported.stderr
        listed = subprocess.run([*ctr, "ls", "-q"], capture_output=True, text=True, check=True)
        assert image_name() in listed.stdout.split()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
