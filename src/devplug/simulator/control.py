"""The control socket of a running simulator: JSON lines over a unix stream socket.

Each request is one line `{"op": NAME, ...arguments}`; each answer one line,
`{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`. Operations:

| op        | arguments                                   | result                     |
|-----------|---------------------------------------------|----------------------------|
| apply     | manifests (YAML text, or manifest objects)  | list of PodResult          |
| delete    | name, namespace                             | {"deleted": bool}          |
| pods      |                                             | list of PodSummary         |
| node      |                                             | NodeStatus                 |
| wait      | resource, count (optional), timeout         | ResourceStatus             |
| wait_driver | driver (a DRA driver's name), timeout     | its registrations          |
| restart   | wait_for (list of resources), timeout       | {resource: registrations}  |
| metrics   |                                             | Prometheus text            |

`ControlClient` is the blocking client the `devplug` commands use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path
from typing import Any, Protocol

import msgspec

from devplug.ground.unixserver import SocketIdentity, clear_stale_socket, socket_identity
from devplug.simulator.pods import ManifestError
from devplug.simulator.results import NodeStatus, PodResult, PodSummary, ResourceStatus

log = logging.getLogger("devplug.simulator.control")

LINE_LIMIT = 64 * 1024 * 1024
DEFAULT_TIMEOUT_S = 10.0


class ControlError(Exception):
    """The simulator answered the request with an error."""


class Controlled(Protocol):
    """What the control socket asks of the simulated kubelet it serves."""

    async def apply(self, manifests: str | list[Any]) -> list[PodResult]: ...
    async def delete_pod(self, name: str, namespace: str = "default") -> bool: ...
    def pods(self) -> list[PodSummary]: ...
    def node_status(self) -> NodeStatus: ...
    def metrics_text(self) -> str: ...
    async def wait_for_resource(
        self, name: str, *, count: int | None = None, timeout: float = 10.0
    ) -> ResourceStatus: ...
    def registrations(self, resource: str) -> int: ...
    async def restart(self) -> None: ...
    async def wait_for_registration(
        self, resource: str, *, after: int = 0, timeout: float = 10.0
    ) -> int: ...


class ControlServer:
    def __init__(self, kubelet: Controlled, path: Path) -> None:
        self.kubelet = kubelet
        self.path = path
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._identity: SocketIdentity | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        clear_stale_socket(self.path)  # never a file, a link or a socket someone serves
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=LINE_LIMIT)
        self.path.chmod(0o600)
        self._identity = socket_identity(self.path)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._clients):
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        await server.wait_closed()
        if self._identity is not None and socket_identity(self.path) == self._identity:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # ours still: not one another process made since
        self._identity = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            while line := await reader.readline():
                answer = await self._answer(line)
                writer.write(msgspec.json.encode(answer) + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = msgspec.json.decode(line)
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                raise ControlError('a request is a JSON object with a string "op"')
            return {"ok": True, "result": await self._dispatch(request)}
        except (ControlError, ManifestError, TimeoutError, RuntimeError, ValueError) as error:
            return {"ok": False, "error": str(error) or type(error).__name__}
        except Exception as error:  # the server keeps serving; the client hears why
            log.exception("control request failed")
            return {"ok": False, "error": f"internal error: {error}"}

    async def _dispatch(self, request: dict[str, Any]) -> Any:
        kubelet = self.kubelet
        op = request["op"]
        timeout = float(request.get("timeout") or DEFAULT_TIMEOUT_S)
        if op == "apply":
            manifests = request.get("manifests")
            if not isinstance(manifests, str | list):
                raise ControlError('apply needs "manifests", YAML text or a list of manifests')
            return await kubelet.apply(manifests)
        if op == "delete":
            name = request.get("name")
            if not isinstance(name, str) or not name:
                raise ControlError('delete needs a pod "name"')
            namespace = str(request.get("namespace") or "default")
            return {"deleted": await kubelet.delete_pod(name, namespace)}
        if op == "pods":
            return kubelet.pods()
        if op == "node":
            return kubelet.node_status()
        if op == "metrics":
            return kubelet.metrics_text()
        if op == "wait":
            resource = request.get("resource")
            if not isinstance(resource, str):
                raise ControlError('wait needs a "resource"')
            count = request.get("count")
            return await kubelet.wait_for_resource(
                resource, count=int(count) if count is not None else None, timeout=timeout
            )
        if op == "wait_driver":
            driver = request.get("driver")
            if not isinstance(driver, str):
                raise ControlError('wait_driver needs a "driver"')
            return await kubelet.wait_for_registration(driver, timeout=timeout)
        if op == "restart":
            wait_for = [str(r) for r in request.get("wait_for") or []]
            before = {r: kubelet.registrations(r) for r in wait_for}
            await kubelet.restart()
            return {
                r: await kubelet.wait_for_registration(r, after=before[r], timeout=timeout)
                for r in wait_for
            }
        raise ControlError(f"unknown op {op!r}")


class ControlClient:
    """Blocking client of a simulator's control socket."""

    def __init__(self, path: Path | str, timeout: float = DEFAULT_TIMEOUT_S + 20) -> None:
        self.path = Path(path)
        self.timeout = timeout

    def call(self, op: str, **arguments: Any) -> Any:
        """Send one request; the result, or ControlError; OSError when unreachable."""
        payload = msgspec.json.encode({"op": op, **arguments}) + b"\n"
        wait = arguments.get("timeout")
        timeout = max(self.timeout, float(wait) + 5) if wait is not None else self.timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.path))
            sock.sendall(payload)
            log.debug("asked %s: %s; waiting up to %g s for the answer", self.path, op, timeout)
            chunks: list[bytes] = []
            while not chunks or not chunks[-1].endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        if not chunks:
            raise ConnectionError(f"{self.path}: the simulator closed the connection")
        answer = msgspec.json.decode(b"".join(chunks))
        if not isinstance(answer, dict) or not answer.get("ok"):
            error = answer.get("error") if isinstance(answer, dict) else answer
            raise ControlError(str(error))
        return answer.get("result")

    def apply(self, manifests: str | list[Any]) -> list[PodResult]:
        return msgspec.convert(self.call("apply", manifests=manifests), list[PodResult])

    def delete(self, name: str, namespace: str = "default") -> bool:
        return bool(self.call("delete", name=name, namespace=namespace)["deleted"])

    def pods(self) -> list[PodSummary]:
        return msgspec.convert(self.call("pods"), list[PodSummary])

    def node(self) -> NodeStatus:
        return msgspec.convert(self.call("node"), NodeStatus)

    def metrics(self) -> str:
        return str(self.call("metrics"))

    def wait(
        self, resource: str, count: int | None = None, timeout: float = 10.0
    ) -> ResourceStatus:
        return msgspec.convert(
            self.call("wait", resource=resource, count=count, timeout=timeout), ResourceStatus
        )

    def wait_driver(self, driver: str, timeout: float = 10.0) -> int:
        """Wait until the DRA driver `driver` has registered; its registrations."""
        return int(self.call("wait_driver", driver=driver, timeout=timeout))

    def restart(self, wait_for: list[str] | None = None, timeout: float = 10.0) -> dict[str, int]:
        return msgspec.convert(
            self.call("restart", wait_for=wait_for or [], timeout=timeout), dict[str, int]
        )
