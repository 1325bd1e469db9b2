"""The daemon as a real process: the README's plugin, signals and clean-up."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import grpc

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.ground.channel import FAST_RECONNECT

ROOT = Path(__file__).resolve().parents[2]
STOP_S = 10.0  # a stop takes well under a second; only a failure waits this long


def readme_plugin() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    return block.group(1)


def test_readme_plugin_is_short_and_complete() -> None:
    code = readme_plugin()
    assert len(code.strip().splitlines()) < 30
    compile(code, "README.md", "exec")


def test_readme_plugin_serves_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    nodes = tmp_path / "dev"
    nodes.mkdir()
    for i in range(2):
        os.mknod(nodes / f"widget{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    script = tmp_path / "widgets.py"
    script.write_text(readme_plugin())
    plugin_dir = tmp_path / "plugins"
    env = dict(os.environ, WIDGET_GLOB=f"{nodes}/widget*", PLUGIN_DIR=str(plugin_dir))
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        socket = plugin_dir / "devplug-example.com-widget.sock"
        with grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT) as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(pb.Empty(), wait_for_ready=True, timeout=10)
            first = next(stream)
            assert [d.ID for d in first.devices] == ["widget0", "widget1"]
            answer = stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["widget1"])]
                )
            )
            spec = answer.container_responses[0].devices[0]
            assert (spec.host_path, spec.permissions) == (str(nodes / "widget1"), "rw")
            assert answer.container_responses[0].envs["WIDGETS"] == "widget1"
            proc.send_signal(signal.SIGTERM)
            assert list(stream) == []  # the stream ends cleanly...
            assert stream.code() == grpc.StatusCode.OK  # ...with OK
            # How fast it goes: the benchmark's `startup` section, SIGTERM to exit.
            assert proc.wait(timeout=STOP_S) == 0
        assert not socket.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def test_sigint_also_stops(tmp_path: Path) -> None:
    script = tmp_path / "one.py"
    script.write_text(
        "import sys\n"
        "from devplug import Device, Plugin, run\n"
        "run(Plugin('example.com/one', devices=[Device('a')]), plugin_dir=sys.argv[1])\n"
    )
    plugin_dir = tmp_path / "plugins"
    proc = subprocess.Popen([sys.executable, str(script), str(plugin_dir)])
    try:
        socket = plugin_dir / "devplug-example.com-one.sock"
        with grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT) as channel:
            pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                pb.Empty(), wait_for_ready=True, timeout=10
            )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=STOP_S) == 0
        assert not socket.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_serve_stays_lean(short_tmp: Path) -> None:
    """`devplug serve` never loads the ssl module: unix sockets only, and 4 MiB less RSS.
    Nor NVML's binding without a GPU resource (a `pynvml` first on the path records it)."""
    plugin_dir = short_tmp / "plugins"
    poison = short_tmp / "poison"
    poison.mkdir()
    marker = short_tmp / "pynvml-imported"
    (poison / "pynvml.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    path = os.pathsep.join(filter(None, [str(poison), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "devplug.cli.main", "serve", "--plugin-dir", str(plugin_dir)],
        env=dict(os.environ, PYTHONPATH=path),
    )
    try:
        socket = plugin_dir / "devplug-devplug.io-fake.sock"
        with grpc.insecure_channel(f"unix://{socket}", options=FAST_RECONNECT) as channel:
            pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                pb.Empty(), wait_for_ready=True, timeout=10
            )
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "cygrpc" in maps  # the check can see loaded extension modules
        assert "_ssl." not in maps
        assert not marker.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
