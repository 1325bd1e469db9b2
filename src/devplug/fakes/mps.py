"""A stand-in for `nvidia-cuda-mps-control`, for tests on machines without the driver.

It speaks the documented control interface (NVIDIA's MPS documentation, "Tools and
Interface Reference"): `-d` starts the control daemon in the background, with its
files in `CUDA_MPS_PIPE_DIRECTORY` (the `nvidia-cuda-mps-control.pid` file, the
`control` endpoint) and its log in `CUDA_MPS_LOG_DIRECTORY/control.log`; run without
`-d` it is the interactive client: commands on stdin, one per line, answers on stdout,
exiting non-zero when no control daemon answers. The daemon keeps the defaults it is
told (`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`),
answers their `get_` commands, logs every command (`Cmd:<command>`), and ends on `quit`.
It also writes what it was started with and told to `state.json` in the log folder, for
tests to read, like the fake NVML's description.

    nvidia-cuda-mps-control -d                       # CUDA_MPS_PIPE_DIRECTORY=... set
    echo set_default_active_thread_percentage 25 | nvidia-cuda-mps-control
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL = "control"  # the endpoint in the pipe folder (a unix socket here)
STATE = "state.json"


def script(folder: Path | str) -> Path:
    """An executable named nvidia-cuda-mps-control in `folder` that runs this stand-in
    (with this Python), for a config's `mps.control` or a PATH."""
    path = Path(folder) / "nvidia-cuda-mps-control"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -m devplug.fakes.mps "$@"\n')
    path.chmod(0o755)
    return path


def _folders() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, log


def _log(log: Path, text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(log / "control.log", "a") as f:
        f.write(f"[{stamp} Control {os.getpid()}] {text}\n")


class _Daemon:
    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe, self.log = pipe, log
        self.state: dict[str, object] = {
            "pid": os.getpid(),
            "visibleDevices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "activeThreadPercentage": "100.0",
            "pinnedMemLimits": {},
            "commands": [],
        }

    def save(self) -> None:
        tmp = self.log / f".{STATE}.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.log / STATE)

    def answer(self, command: str) -> tuple[str, bool]:
        """(the reply, whether to quit)."""
        words = command.split()
        commands = self.state["commands"]
        assert isinstance(commands, list)
        commands.append(command)
        _log(self.log, f"Cmd:{command}")
        limits = self.state["pinnedMemLimits"]
        assert isinstance(limits, dict)
        reply = ""
        if not words:
            pass
        elif words[0] == "quit":
            return "", True
        elif words[0] == "set_default_active_thread_percentage" and len(words) == 2:
            self.state["activeThreadPercentage"] = f"{float(words[1]):.1f}"
        elif words[0] == "get_default_active_thread_percentage":
            reply = str(self.state["activeThreadPercentage"])
        elif words[0] == "set_default_device_pinned_mem_limit" and len(words) == 3:
            limits[words[1]] = words[2]
        elif words[0] == "get_default_device_pinned_mem_limit" and len(words) == 2:
            reply = str(limits.get(words[1], "0"))
        elif words[0] in ("get_server_list", "get_device_client_list"):
            reply = ""
        else:
            reply = f"Invalid command: {command}"
        return reply, False

    def serve(self) -> None:
        endpoint = self.pipe / CONTROL
        with contextlib.suppress(FileNotFoundError):
            endpoint.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(endpoint))
        server.listen(8)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        _log(self.log, f"Starting control daemon using socket {endpoint}")
        self.save()
        done = False
        while not done:
            connection, _ = server.accept()
            with connection, connection.makefile("rw") as stream:
                for line in stream:
                    reply, done = self.answer(line.strip())
                    self.save()
                    stream.write(reply + "\n\x00\n")  # one answer per command
                    stream.flush()
                    if done:
                        break
        _log(self.log, "Exiting")
        server.close()
        for name in (CONTROL, PID_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.pipe / name).unlink()


def _start_daemon() -> int:
    pipe, log = _folders()
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    if (pipe / PID_FILE).exists() and _ask(pipe, ["get_server_list"]) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    child = os.fork()
    if child:  # the parent returns once the daemon answers, as `-d` does
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _ask(pipe, []) is not None:
                return 0
            time.sleep(0.01)
        return 1
    os.setsid()
    with open(os.devnull, "r+") as null:
        for stream in (0, 1, 2):
            os.dup2(null.fileno(), stream)
    try:
        _Daemon(pipe, log).serve()
    finally:
        os._exit(0)


def _ask(pipe: Path, commands: list[str]) -> list[str] | None:
    """The daemon's answers to `commands`, or None when no daemon answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(pipe / CONTROL))
            replies = []
            with connection.makefile("rw") as stream:
                for command in commands:
                    stream.write(command + "\n")
                    stream.flush()
                    lines = []
                    for line in stream:
                        if line == "\x00\n":
                            break
                        lines.append(line.rstrip("\n"))
                    replies.append("\n".join(lines))
            return replies
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["-d"]:
        return _start_daemon()
    if args:
        print(f"Unknown option {args[0]}", file=sys.stderr)
        return 1
    pipe, _ = _folders()
    commands = [line.strip() for line in sys.stdin if line.strip()]
    replies = _ask(pipe, commands)
    if replies is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    for reply in replies:
        if reply:
            print(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
