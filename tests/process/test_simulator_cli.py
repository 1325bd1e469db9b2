"""The simulator's commands end to end: `devplug kubelet` as a process, driven by
`devplug pods`, `devplug node` and `devplug kubelet-restart` over its control socket."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from sim_helpers import (
    FOO,
    PluginProcess,
    device,
    devplug,
    kubelet_process,
    plugin,
    pod,
    pods_yaml,
)


def test_commands_end_to_end(tmp_path: Path) -> None:
    plugins, state = tmp_path / "plugins", tmp_path / "state"
    control = str(state / "control.sock")
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(pods_yaml(pod("small", {"c": {FOO: 1}}), pod("huge", {"c": {FOO: 5}})))
    with kubelet_process("--plugin-dir", str(plugins), "--state-dir", str(state)) as (
        kubelet,
        ready,
    ):
        assert control in ready
        with PluginProcess(
            tmp_path, plugins, [plugin(FOO, [device("d0", [0]), device("d1", [1])])]
        ):
            node = devplug("node", "--control", control, "--wait-for", f"{FOO}=2", "-o", "json")
            assert node.returncode == 0, node.stderr
            status = json.loads(node.stdout)
            [resource] = status["resources"]
            assert (resource["name"], resource["capacity"], resource["allocatable"]) == (FOO, 2, 2)
            assert status["registrations"] == {FOO: 1}

            applied = devplug(
                "pods", "apply", "-f", str(manifest), "--control", control, "-o", "json"
            )
            assert applied.returncode == 0, applied.stderr  # a rejected pod is no failure
            small, huge = [json.loads(line) for line in applied.stdout.splitlines()]
            assert (small["pod"], small["container"], small["devices"]) == (
                "small",
                "c",
                {FOO: ["d0"]},
            )
            assert small["options"]["devices"] == []
            assert (huge["admitted"], huge["reason"]) == (False, "UnexpectedAdmissionError")
            assert "Requested: 5, Available: 1" in huge["message"]

            table = devplug(
                "pods",
                "apply",
                "-f",
                "-",
                "--control",
                control,
                stdin=pods_yaml(pod("more", {"c": {FOO: 1}})),
            )
            assert table.returncode == 0, table.stderr
            assert "pod default/more" in table.stdout
            assert "example.com/foo: d1" in table.stdout

            listed = devplug("pods", "list", "--control", control)
            assert listed.returncode == 0, listed.stderr
            assert "small" in listed.stdout
            assert "more" in listed.stdout

            node = devplug("node", "--control", control)
            assert node.returncode == 0, node.stderr
            assert "default/small/c" in node.stdout
            assert FOO in node.stdout

            deleted = devplug("pods", "delete", "small", "--control", control)
            assert deleted.returncode == 0, deleted.stderr
            missing = devplug("pods", "delete", "small", "--control", control)
            assert missing.returncode == 1

            restarted = devplug("kubelet-restart", "--control", control, "--wait-for", FOO)
            assert restarted.returncode == 0, restarted.stderr
            assert f"{FOO}: registered again" in restarted.stdout
            node = devplug("node", "--control", control, "--wait-for", f"{FOO}=2", "-o", "json")
            status = json.loads(node.stdout)
            assert status["registrations"] == {FOO: 2}
            assert [p["name"] for p in status["pods"]] == ["more"]
            assert status["resources"][0]["allocated"] == 1

            metrics = devplug("node", "--metrics", "--control", control)
            assert (
                f'kubelet_device_plugin_registration_total{{resource_name="{FOO}"}} 2'
                in metrics.stdout
            )
            assert "kubelet_device_plugin_alloc_duration_seconds_count" in metrics.stdout

        kubelet.send_signal(signal.SIGTERM)
        assert kubelet.wait(timeout=10) == 0
    assert not (plugins / "kubelet.sock").exists()
    assert (state / "kubelet_internal_checkpoint").exists()


def test_pods_at_start_and_usage_errors(tmp_path: Path) -> None:
    plugins, state = tmp_path / "plugins", tmp_path / "state"
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(pods_yaml(pod("early", {"c": {FOO: 2}})))
    with PluginProcess(tmp_path, plugins, [plugin(FOO, [device("d0"), device("d1")])]):
        args = ["--plugin-dir", str(plugins), "--state-dir", str(state), "--output", "json"]
        args += ["-f", str(manifest), "--wait-for", f"{FOO}=2"]
        with kubelet_process(*args) as (kubelet, _):
            assert kubelet.stdout is not None
            record = json.loads(kubelet.stdout.readline())
            assert (record["pod"], record["devices"]) == ("early", {FOO: ["d0", "d1"]})
            control = str(state / "control.sock")
            bad = devplug("pods", "apply", "-f", "-", "--control", control, stdin="kind: Service\n")
            assert bad.returncode == 2  # refused before it reaches the simulator
            assert "stdin: document 1: kind 'Service' is not supported" in bad.stderr
    gone = devplug("node", "--control", str(state / "control.sock"))
    assert gone.returncode == 1
    assert "cannot reach the kubelet simulator" in gone.stderr
    no_file = devplug("pods", "apply", "-f", str(tmp_path / "missing.yaml"), "--control", "x")
    assert no_file.returncode == 2


def test_wait_for_ends_at_its_timeout_and_applies_nothing(tmp_path: Path) -> None:
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(pods_yaml(pod("early", {"c": {FOO: 1}})))
    args = ["--plugin-dir", str(tmp_path / "plugins"), "-f", str(manifest)]
    args += ["--wait-for", f"{FOO}=2", "--timeout", "0.5", "--log-level", "warning"]
    done = devplug("kubelet", *args, timeout=30)
    assert done.returncode == 1
    assert done.stdout.startswith("kubelet simulator ready")
    assert "early" not in done.stdout
    [line] = done.stderr.splitlines()
    assert line == (
        f"devplug kubelet: --wait-for {FOO}=2: not registered and listed within --timeout "
        "0.5 s; no pod applied"
    )


def test_wait_for_ends_at_once_on_sigterm(tmp_path: Path) -> None:
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(pods_yaml(pod("early", {"c": {FOO: 1}})))
    args = ["--plugin-dir", str(tmp_path / "plugins"), "-f", str(manifest)]
    args += ["--wait-for", FOO, "--timeout", "600"]
    with kubelet_process(*args) as (kubelet, _):
        kubelet.send_signal(signal.SIGTERM)
        assert kubelet.wait(timeout=10) == 0  # not the 600 s of the wait
        assert kubelet.stdout is not None
        assert "early" not in kubelet.stdout.read()


def test_a_reader_that_went_away_is_no_error(tmp_path: Path) -> None:
    """`devplug node | head -1` and `devplug pods list | head -1`: nothing said about
    the simulator, which answered."""
    import os
    import subprocess

    from sim_helpers import cli_command

    plugins, state = tmp_path / "plugins", tmp_path / "state"
    with (
        kubelet_process("--plugin-dir", str(plugins), "--state-dir", str(state)),
        PluginProcess(tmp_path, plugins, [plugin(FOO, [device(f"d{i}") for i in range(50)])]),
    ):
        control = str(state / "control.sock")
        assert devplug("node", "--control", control, "--wait-for", f"{FOO}=50").returncode == 0
        for command in (["node"], ["pods", "list"], ["node", "-o", "yaml"]):
            read, write = os.pipe()
            os.close(read)
            try:
                done = subprocess.run(
                    cli_command(*command, "--control", control),
                    stdout=write,
                    stderr=subprocess.PIPE,
                    text=True,
                    timeout=30,
                )
            finally:
                os.close(write)
            assert done.stderr == "", done.stderr
            assert done.returncode == 1


def test_ctrl_c_in_a_wait_is_one_line(tmp_path: Path) -> None:
    """`devplug node --wait-for` on a simulator whose plugin never comes: SIGINT ends
    the wait at once, with one line and 130, as a shell reports it."""
    import subprocess

    from sim_helpers import cli_command

    plugins, state = tmp_path / "plugins", tmp_path / "state"
    with kubelet_process("--plugin-dir", str(plugins), "--state-dir", str(state)):
        control = str(state / "control.sock")
        command = ["node", "--control", control, "--wait-for", FOO, "--timeout", "600"]
        waiting = subprocess.Popen(
            cli_command(*command, "--log-level", "debug"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert waiting.stderr is not None
            asked = waiting.stderr.readline()  # the request is out: it waits for the answer
            assert "asked" in asked, asked
            assert ": wait;" in asked, asked
            waiting.send_signal(signal.SIGINT)
            _, errors = waiting.communicate(timeout=30)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
    assert waiting.returncode == 130, errors
    assert errors.splitlines() == ["devplug node: interrupted"]
