"""`devplug check` and `devplug serve` as real processes: reports, exit statuses, signals."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from asyncinotify import Inotify, Mask

from devplug.framework.plugin import default_socket_name

TIMEOUT_S = 30


def devplug(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug.cli.main", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def mknod(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """Two matched nodes, one missing literal path, a glob with no match, and virtual devices."""
    for name in ("dev0", "dev1"):
        mknod(tmp_path / name)
    path = tmp_path / "config.yaml"
    path.write_text(
        f"""
resources:
  - name: example.com/node
    allowAnyPath: true
    groups:
      - paths: [{{path: '{tmp_path}/dev*'}}]
        numaNode: 0
      - paths: [{{path: {tmp_path}/missing}}]
      - paths: [{{path: '{tmp_path}/none*'}}]
  - name: example.com/fake
    virtual: 2
    count: 2
"""
    )
    return path


def test_check_text_report(config: Path, tmp_path: Path) -> None:
    result = devplug("check", "--config", config)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"{config}: valid, 2 resource(s)\n")
    assert (
        "example.com/node (host, count 1, env DEVPLUG_EXAMPLE_COM_NODE): 3 device(s), 2 healthy"
        in out
    )
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    by_path = {row[-1]: row[1:-1] for row in rows if row[-1].startswith(str(tmp_path))}
    assert by_path == {
        f"{tmp_path}/dev0": ["Healthy", "numa", "0"],
        f"{tmp_path}/dev1": ["Healthy", "numa", "0"],
        f"{tmp_path}/missing": ["Unhealthy", "-"],
    }
    warning = f"example.com/node: groups[2].paths[0].path: '{tmp_path}/none*' matches nothing"
    assert f"  warning: {warning}\n" in out
    by_id = {row[0]: row[1:] for row in rows}
    for device_id in ("fake-0::0", "fake-0::1", "fake-1::0", "fake-1::1"):
        assert by_id[device_id] == ["Healthy", "-", "-"]


def test_check_json_report(config: Path, tmp_path: Path) -> None:
    result = devplug("check", "--config", config, "--output", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["valid"] is True
    node, fake = report["resources"]
    assert (node["name"], node["kind"], node["count"]) == ("example.com/node", "host", 1)
    assert node["idsEnv"] == "DEVPLUG_EXAMPLE_COM_NODE"
    assert [(d["health"], d["hostPaths"], d["numaNodes"]) for d in node["devices"]] == [
        ("Healthy", [str(tmp_path / "dev0")], [0]),
        ("Healthy", [str(tmp_path / "dev1")], [0]),
        ("Unhealthy", [str(tmp_path / "missing")], []),
    ]
    assert node["warnings"] == [
        f"example.com/node: groups[2].paths[0].path: '{tmp_path}/none*' matches nothing"
    ]
    assert fake["kind"] == "virtual"
    assert [d["id"] for d in fake["devices"]] == [
        "fake-0::0",
        "fake-0::1",
        "fake-1::0",
        "fake-1::1",
    ]
    assert fake["warnings"] == []


def test_check_refuses_a_bad_config_with_status_2(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("resources: [{name: example.com/a, virtual: 1, count: 0}]\n")
    for output in ("text", "json"):
        result = devplug("check", "--config", path, "--output", output)
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr == f"{path}: resources[0].count: expected an integer >= 1, got 0\n"


def test_check_without_a_config_checks_the_packaged_default() -> None:
    result = devplug("check", "-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["config"] is None
    assert "devplug.io/fake" in [r["name"] for r in report["resources"]]


def test_serve_refuses_a_bad_config_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("resources: [{name: example.com/a, groups: [{paths: [{path: /tmp/x}]}]}]\n")
    plugin_dir = tmp_path / "plugins"
    result = devplug("serve", "--config", path, "--plugin-dir", plugin_dir)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"{path}: resources[0].groups[0].paths[0].path: '/tmp/x' is outside /dev"
    )
    assert not plugin_dir.exists()
    missing = devplug("serve", "--config", tmp_path / "nope.yaml", "--plugin-dir", plugin_dir)
    assert missing.returncode == 2
    assert (
        missing.stderr
        == f"{tmp_path / 'nope.yaml'}: cannot read the config: No such file or directory\n"
    )


def test_serve_refuses_a_plugin_dir_that_is_a_file(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "plugins"
    not_a_folder.touch()
    for path in (not_a_folder, not_a_folder / "below"):
        result = devplug("serve", "--plugin-dir", path)
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.splitlines()
        assert f"--plugin-dir: {path}: " in line
    assert not_a_folder.is_file()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_runs_until_a_signal(tmp_path: Path, config: Path, signum: signal.Signals) -> None:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    sockets = {default_socket_name(n) for n in ("example.com/node", "example.com/fake")}
    with Inotify(sync_timeout=TIMEOUT_S) as inotify:
        inotify.add_watch(plugin_dir, Mask.CREATE)
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devplug.cli.main",
                "serve",
                "--config",
                str(config),
                "--plugin-dir",
                str(plugin_dir),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # Wait on inotify events for both sockets (a timeout ends the iteration).
            for _ in inotify:
                if not sockets - {p.name for p in plugin_dir.iterdir()}:
                    break
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert not sockets - {p.name for p in plugin_dir.iterdir()}
            process.send_signal(signum)
            _, stderr = process.communicate(timeout=TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0, stderr
    assert f"{signal.Signals(signum).name} received" in stderr


def test_serve_says_it_waits_for_the_kubelet_and_when_it_registered(tmp_path: Path) -> None:
    from sim_helpers import kubelet_process

    plugin_dir = tmp_path / "plugins"
    process = subprocess.Popen(
        [sys.executable, "-m", "devplug.cli.main", "serve", "--plugin-dir", str(plugin_dir)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        lines = iter(process.stderr.readline, "")
        waiting = next(line for line in lines if "devplug.daemon" in line)
        assert f"waiting for the kubelet: no {plugin_dir / 'kubelet.sock'} yet" in waiting
        with kubelet_process("--plugin-dir", str(plugin_dir)):
            registered = next(line for line in lines if "registered with the kubelet" in line)
            assert "INFO" in registered
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0


def test_a_read_only_plugin_folder_is_said_once_with_its_real_cause(tmp_path: Path) -> None:
    """EROFS is said as such (not 'permission denied'), once, in devplug's log format
    (no gRPC C-core line), and retried quietly (at debug level)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(folder)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (root needed): {mounted.stderr!r}")
    config = tmp_path / "config.yaml"
    config.write_text("resources:\n  - {name: example.com/fake, virtual: 1}\n")
    serve = [sys.executable, "-m", "devplug.cli.main", "serve", "--config", str(config)]
    process = subprocess.Popen(
        [*serve, "--plugin-dir", str(folder), "--log-format", "json", "--log-level", "debug"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        seen = []
        for line in iter(process.stderr.readline, ""):
            seen.append(line)
            if "retrying in" in line and '"level": "debug"' in line:
                break  # the second attempt: said at debug level only
        records = [json.loads(line) for line in seen]  # every line is devplug's JSON
        errors = [r["msg"] for r in records if r["level"] == "error"]
        assert len(errors) == 1, errors
        assert "Read-only file system" in errors[0]
        assert str(folder / "devplug-example.com-fake.sock") in errors[0]
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=TIMEOUT_S)
        subprocess.run(["umount", str(folder)], check=False)
    assert process.returncode == 0
