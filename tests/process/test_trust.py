"""What can make devplug run a program or change what containers get is refused when
others than root and its owner can change it (sshd's StrictModes): the config file and
its folders, NVIDIA config files and per-node folders, health-check and MPS programs.
Real files with real modes and owners; `check`, `serve` and a reload each refuse with
one line naming the path and the fix."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from serve_helpers import wait_for_log
from sim_helpers import devplug

from devplug.ground.trust import program_problem, write_problem

WAIT_S = 60
OTHER_UID = 4321

GOOD = "resources:\n  - name: example.com/fake\n    virtual: 2\n"


def config_with_program(program: str) -> str:
    return (
        "resources:\n  - name: example.com/fake\n    groups: [{paths: [{path: /dev/null}]}]\n"
        f"    health: {{checks: [{{command: [{program}]}}]}}\n"
    )


def nvidia_config(file: str = "", folder: str = "") -> str:
    key = f"folder: {folder}" if folder else f"file: {file}"
    return f"resources:\n  - nvidia: {{nvidiaConfig: {{{key}}}}}\n"


# Each class of path that decides what devplug runs or gives containers, made writable
# by others in one way: (config text, the path the refusal must name, the fix).
Unsafe = Callable[[Path], tuple[str, Path, str]]


def config_file_666(tmp: Path) -> tuple[str, Path, str]:
    return GOOD, tmp / "config.yaml", "chmod go-w"


def config_folder_777(tmp: Path) -> tuple[str, Path, str]:
    tmp.chmod(0o777)
    return GOOD, tmp, "chmod go-w"


def config_file_of_another_user(tmp: Path) -> tuple[str, Path, str]:
    return GOOD, tmp / "config.yaml", "chown root"


def health_program_777(tmp: Path) -> tuple[str, Path, str]:
    program = tmp / "bin" / "check.sh"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o777)
    return config_with_program(str(program)), program, "chmod go-w"


def health_program_in_a_folder_others_write(tmp: Path) -> tuple[str, Path, str]:
    folder = tmp / "bin"
    folder.mkdir()
    (folder / "check.sh").write_text("#!/bin/sh\nexit 0\n")
    (folder / "check.sh").chmod(0o755)
    folder.chmod(0o775)
    return config_with_program(str(folder / "check.sh")), folder, "chmod go-w"


def nvidia_file_666(tmp: Path) -> tuple[str, Path, str]:
    file = tmp / "nvidia.yaml"
    file.write_text("version: v1\n")
    file.chmod(0o666)
    return nvidia_config(file=str(file)), file, "chmod go-w"


def nvidia_folder_sticky_1777(tmp: Path) -> tuple[str, Path, str]:
    """A folder whose every file is a config: its sticky bit does not stop anyone from
    adding one named after the node's label."""
    folder = tmp / "configs"
    folder.mkdir()
    (folder / "a").write_text("version: v1\n")
    folder.chmod(0o1777)
    return nvidia_config(folder=str(folder)), folder, "chmod go-w"


UNSAFE: dict[str, Unsafe] = {
    f.__name__: f
    for f in (
        config_file_666,
        config_folder_777,
        config_file_of_another_user,
        health_program_777,
        health_program_in_a_folder_others_write,
        nvidia_file_666,
        nvidia_folder_sticky_1777,
    )
}


def make(tmp: Path, case: str) -> tuple[Path, Path, str]:
    """A config in its own folder under `tmp`, made unsafe by `case`: (config, path, fix)."""
    folder = tmp / case
    folder.mkdir()
    folder.chmod(0o755)
    text, path, fix = UNSAFE[case](folder)
    config = folder / "config.yaml"
    config.write_text(text)
    config.chmod(0o644)
    if case == "config_file_666":
        config.chmod(0o666)
    if case == "config_file_of_another_user":
        os.chown(config, OTHER_UID, OTHER_UID)
    return config, path, fix


@pytest.mark.parametrize("case", UNSAFE)
def test_check_refuses_what_others_can_write_in_one_line_with_the_fix(
    tmp_path: Path, case: str
) -> None:
    config, path, fix = make(tmp_path, case)
    done = devplug("check", "--config", str(config), timeout=WAIT_S)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{config}: "), line
    assert f"{path} is " in line, line
    assert f"`{fix} {path}`" in line, line


@pytest.mark.parametrize("case", ["config_file_666", "health_program_777"])
def test_serve_refuses_what_others_can_write_before_it_serves(tmp_path: Path, case: str) -> None:
    config, path, fix = make(tmp_path, case)
    plugins = tmp_path / "plugins"
    done = devplug("serve", "--config", str(config), "--plugin-dir", str(plugins), timeout=WAIT_S)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert f"`{fix} {path}`" in line, line
    assert not plugins.exists() or not any(plugins.iterdir())


def test_the_same_config_made_safe_is_accepted(tmp_path: Path) -> None:
    """The refusals are about the modes only: each fix makes the config pass."""
    for case in UNSAFE:
        config, path, _ = make(tmp_path, case)
        os.chown(path, 0, 0)
        os.chmod(path, os.stat(path).st_mode & ~0o022)
        os.chown(config, 0, 0)
        os.chmod(config, 0o644)
        assert write_problem(config) is None, case


def test_a_sticky_folder_like_tmp_on_the_way_is_fine_but_not_a_folder_of_configs(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "mine").mkdir(mode=0o755)
    file = shared / "mine" / "config.yaml"
    file.write_text(GOOD)
    assert write_problem(file) is None
    assert write_problem(shared / "mine", folder_read=True) is None
    problem = write_problem(shared, folder_read=True)
    assert problem == (
        f"{shared} is writable by its group and others (mode 1777), who could change "
        f"what devplug runs: run `chmod go-w {shared}`"
    )


def test_a_link_is_judged_by_where_it_leads(tmp_path: Path) -> None:
    """The path as given and the path its links lead to: a safe link into a folder
    others write is refused, naming that folder."""
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    (open_folder / "config.yaml").write_text(GOOD)
    open_folder.chmod(0o777)
    link = tmp_path / "config.yaml"
    link.symlink_to(open_folder / "config.yaml")
    assert f"{open_folder} is writable" in (write_problem(link) or "")


def test_a_program_on_path_is_judged_where_the_exec_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    program = folder / "gpu-check"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o757)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    assert f"{program} is writable by others" in (program_problem("gpu-check") or "")
    assert program_problem("no-such-program-anywhere") is None  # running it says so
    assert program_problem("sh") is None


@pytest.mark.timeout(200)
def test_a_reload_of_a_config_others_can_write_is_refused_and_the_old_one_serves(
    short_tmp: Path,
) -> None:
    """A config that becomes writable by others is not reloaded (the running one keeps
    serving), with the one line in the log; made safe again, it reloads."""
    from devplug.testing import KubeletHarness

    config = short_tmp / "config.yaml"
    config.write_text(GOOD)
    with KubeletHarness() as kubelet:
        serve = kubelet.start_serve(config, timeout=WAIT_S)
        config.chmod(0o666)
        config.write_text(GOOD.replace("virtual: 2", "virtual: 3"))
        said = wait_for_log(serve.log_path, "config reload refused", timeout=WAIT_S)
        assert (
            f"{config}: refused: {config} is writable by its group and others (mode 0666)" in said
        )
        assert f"run `chmod go-w {config}`" in said
        assert kubelet.resource("example.com/fake").capacity == 2  # type: ignore[union-attr]
        config.chmod(0o644)
        os.kill(serve.pid, signal.SIGHUP)
        wait_for_log(serve.log_path, "config reloaded from", timeout=WAIT_S)
        kubelet.wait_for_resource("example.com/fake", count=3)
        assert serve.stop() == 0


def test_a_configmap_like_folder_of_mode_777_on_a_read_only_mount_is_fine(tmp_path: Path) -> None:
    """A ConfigMap volume's folder is 0777, but its mount is read-only: nobody writes
    there, so its config is accepted; the same folder mounted read-write is refused."""
    volume = tmp_path / "volume"
    volume.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "mode=0777,size=1m", "devplug-test", str(volume)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        config = volume / "config.yaml"
        config.write_text(GOOD)
        config.chmod(0o644)
        assert f"{volume} is writable by its group and others (mode 0777)" in (
            write_problem(config) or ""
        )
        subprocess.run(["mount", "-o", "remount,ro", str(volume)], check=True)
        assert write_problem(config) is None
        done = devplug("check", "--config", str(config), timeout=WAIT_S)
        assert done.returncode == 0, done.stderr
    finally:
        subprocess.run(["umount", str(volume)], check=False)


async def test_a_health_program_made_writable_after_the_config_loaded_is_not_run(
    tmp_path: Path,
) -> None:
    """The rule holds at each run, not only at load: a program others can now change is
    not run, and the device's health check says why."""
    from devplug.config.hardware import CheckSpec
    from devplug.sources.health import check_problem
    from devplug.sources.hostdev import _Base

    ran = tmp_path / "ran"
    program = tmp_path / "check.sh"
    program.write_text(f"#!/bin/sh\ntouch {ran}\n")
    program.chmod(0o755)
    base = _Base("dev0", (0, -2, "dev0"), (), None, {})  # type: ignore[arg-type]

    async def problem() -> str | None:
        return await check_problem(CheckSpec(command=[str(program)]), base, {})

    assert await problem() is None
    assert ran.exists()
    ran.unlink()
    program.chmod(0o777)
    assert await problem() == (
        f"not run: {program} is writable by its group and others (mode 0777), who could "
        f"change what devplug runs: run `chmod go-w {program}`"
    )
    assert not ran.exists()


def test_the_generic_device_plugin_s_config_file_follows_the_same_rule(tmp_path: Path) -> None:
    from devplug.config.errors import ConfigError
    from devplug.sources.gdpfront import Flags, load

    file = tmp_path / "config.yaml"
    file.write_text("devices:\n  - name: zero\n    groups: [{paths: [{path: /dev/null}]}]\n")
    file.chmod(0o666)
    with pytest.raises(ConfigError) as refused:
        load(Flags(config=str(file)), {})
    assert str(refused.value) == (
        f"{file}: refused: {file} is writable by its group and others (mode 0666), who "
        f"could change what devplug runs: run `chmod go-w {file}`"
    )
    file.chmod(0o644)
    assert load(Flags(config=str(file)), {}) is not None
