"""The limits of unix sockets said up front, and nothing made on the real kubelet's
folders unless asked: every socket path a command derives from its flags or its
config is checked before it starts (one line naming it, exit 2), and a `serve` on
moved folders derives the others from them."""

from __future__ import annotations

import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from serve_helpers import wait_for_path
from sim_helpers import cli_command, devplug

from devplug.api.dra import constants as dra

# The two ways of saying it: a path as given; a DRA driver's, even with its UID shortened.
LIMITS = ("is longer than 107 bytes, the limit of unix sockets", "more than the 107 a unix socket")
KUBELET_ROOT = Path("/var/lib/kubelet")


def long_folder(root: Path) -> Path:
    """A folder whose path leaves no room for a socket name."""
    folder = root / ("d" * (100 - len(str(root))))
    folder.mkdir()
    return folder


def dra_config(root: Path, driver: str) -> Path:
    config = root / "dra.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {
                        "name": "example.com/a",
                        "virtual": 1,
                        "mode": "dra",
                        "dra": {"driver": driver},
                    }
                ]
            }
        )
    )
    return config


def cases(root: Path) -> dict[str, list[str]]:
    """Each way a socket path comes from a flag or the config, made too long."""
    long = long_folder(root)
    short = root / "s"
    short.mkdir()
    plugins = root / "device-plugins"  # room for kubelet.sock, not for a 63-letter name
    plugins.mkdir()
    virtual = root / "virtual.yaml"
    virtual.write_text("resources:\n  - {name: example.com/v, virtual: 1}\n")
    long_name = root / "long-name.yaml"
    long_name.write_text(f"resources:\n  - {{name: example.com/{'x' * 63}, virtual: 1}}\n")
    dra = dra_config(root, "a.example.com")
    claims = ["--claims-dir", str(short), "--cdi-dir", str(short), "--node-name", "n"]
    dra_serve = ["serve", "--config", str(dra), "--plugin-dir", str(short), *claims]
    return {
        "serve --plugin-dir": ["serve", "--config", str(virtual), "--plugin-dir", str(long)],
        "serve resource name": ["serve", "--config", str(long_name), "--plugin-dir", str(plugins)],
        "check resource name": ["check", "--config", str(long_name)],
        "serve --metrics-pod-resources": [
            "serve", "--config", str(virtual), "--plugin-dir", str(short),
            "--metrics-pod-resources", str(long / "kubelet.sock"),
        ],
        "serve dra --registry-dir": [*dra_serve, "--registry-dir", str(long)],
        "serve dra --dra-socket-dir": [
            *dra_serve, "--registry-dir", str(short), "--dra-socket-dir", str(long),
        ],
        "serve dra --plugin-dir": [
            "serve", "--config", str(dra), "--plugin-dir", str(long / "dp"), *claims,
        ],
        "kubelet --plugin-dir": ["kubelet", "--plugin-dir", str(long)],
        "kubelet --state-dir": ["kubelet", "--plugin-dir", str(short), "--state-dir", str(long)],
        "kubelet --control": [
            "kubelet", "--plugin-dir", str(short), "--control", str(long / "control.sock"),
        ],
    }  # fmt: skip


CASE_NAMES = [
    "serve --plugin-dir",
    "serve resource name",
    "check resource name",
    "serve --metrics-pod-resources",
    "serve dra --registry-dir",
    "serve dra --dra-socket-dir",
    "serve dra --plugin-dir",
    "kubelet --plugin-dir",
    "kubelet --state-dir",
    "kubelet --control",
]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_a_socket_path_past_the_unix_limit_is_one_line_before_starting(
    case: str, short_tmp: Path
) -> None:
    args = cases(short_tmp)[case]
    before = sorted(p for p in short_tmp.rglob("*"))
    result = devplug(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert any(limit in lines[0] for limit in LIMITS), lines[0]
    assert "Traceback" not in result.stderr
    assert sorted(p for p in short_tmp.rglob("*")) == before  # nothing made


def test_every_case_is_run(short_tmp: Path) -> None:
    assert set(CASE_NAMES) == set(cases(short_tmp))


def ours(driver: str) -> list[Path]:
    """What under the real kubelet's folder is named after `driver`."""
    if not KUBELET_ROOT.exists():
        return []
    return sorted(p for p in KUBELET_ROOT.rglob(f"*{driver}*"))


def test_a_dra_serve_on_moved_folders_makes_nothing_on_the_kubelets(short_tmp: Path) -> None:
    driver = f"t{uuid.uuid4().hex[:8]}.example.com"
    kubelet = short_tmp / "kubelet"
    plugin_dir, registry, claims, cdi = (kubelet / d for d in ("dp", "reg", "claims", "cdi"))
    for folder in (plugin_dir, registry, claims, cdi):
        folder.mkdir(parents=True)
    config = dra_config(short_tmp, driver)
    before = ours(driver), (KUBELET_ROOT / "plugins").exists()
    serve = subprocess.Popen(
        cli_command(
            "serve",
            "--config",
            str(config),
            "--plugin-dir",
            str(plugin_dir),
            "--registry-dir",
            str(registry),
            "--claims-dir",
            str(claims),
            "--cdi-dir",
            str(cdi),
            "--node-name",
            "n",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The registration socket where asked, the DRA socket beside it (the kubelet's
        # layout: plugins_registry and plugins side by side).
        wait_for_path(registry / f"{driver}-reg.sock")
        wait_for_path(kubelet / "plugins" / driver / dra.DRA_SOCKET)
    finally:
        serve.send_signal(signal.SIGTERM)
        _, stderr = serve.communicate(timeout=30)
    assert serve.returncode == 0, stderr
    assert (ours(driver), (KUBELET_ROOT / "plugins").exists()) == before
