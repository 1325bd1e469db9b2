"""Small stand-ins for an API server that misbehaves, on 127.0.0.1 only: one that
answers every request with one status (401, 403, 429, 503...), one whose certificate
nobody trusts, a port that accepts connections and never answers, a closed port; and
the kubeconfig files that point at them."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NODE_LIST = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}


class Answering(http.server.ThreadingHTTPServer):
    """Answers every request with `status` (a Status body), or 200 and an empty list
    when the bearer token is `good`; records the Authorization headers it got."""

    daemon_threads = True

    def __init__(self, status: int, good: str | None = None) -> None:
        self.status = status
        self.good = good
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Answering

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        token = self.headers.get("Authorization", "")
        self.server.seen.append(token)
        if self.server.good is not None and token == f"Bearer {self.server.good}":
            status, body = 200, NODE_LIST
        else:
            status = self.server.status
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": f"answered {status} by the test server",
                "reason": http.HTTPStatus(status).phrase.replace(" ", ""),
                "code": status,
            }
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def answering(
    status: int, *, good: str | None = None, tls: tuple[Path, Path] | None = None
) -> Iterator[Answering]:
    """A server answering `status` (HTTPS with the (cert, key) of `tls`)."""
    server = Answering(status, good)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no CA vouches for, and its key."""
    cert, key = folder / "untrusted.crt", folder / "untrusted.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextmanager
def silent_port() -> Iterator[int]:
    """A port whose connections are accepted by the kernel and never answered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


def closed_port() -> int:
    """A port nobody listens on (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_kubeconfig(
    path: Path,
    server: str,
    *,
    token: str | None = "t0ken",
    user: dict[str, object] | None = None,
    ca: str | None = None,
    contexts: dict[str, str] | None = None,
    current: str = "main",
) -> Path:
    """A kubeconfig of one cluster `server` (or one per context of `contexts`: name ->
    server), one user (a token, or `user`), each context pointing at its cluster."""
    contexts = contexts or {current: server}
    body = user if user is not None else ({"token": token} if token else {})
    clusters = []
    for name, url in contexts.items():
        cluster: dict[str, object] = {"server": url}
        if ca:
            cluster["certificate-authority"] = ca
        clusters.append({"name": name, "cluster": cluster})
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "users": [{"name": "u", "user": body}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in contexts],
        "current-context": current,
    }
    path.write_text(json.dumps(document))
    return path


def exec_plugin(folder: Path, tokens: list[str], seconds: float | None) -> Path:
    """A credential command printing an ExecCredential: the next of `tokens` on each run
    (the last one again when they run out), valid for `seconds` (None: no expiry); each
    run is counted in `runs` beside it."""
    script = folder / "credential-plugin"
    state = folder / "runs"
    script.write_text(
        f"""#!/usr/bin/env python3
import datetime, json, os, pathlib, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False
state = pathlib.Path({str(state)!r})
runs = int(state.read_text()) if state.exists() else 0
state.write_text(str(runs + 1))
tokens = {tokens!r}
status = {{"token": tokens[min(runs, len(tokens) - 1)]}}
seconds = {seconds!r}
if seconds is not None:
    end = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    status["expirationTimestamp"] = end.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""
    )
    script.chmod(0o755)
    return script


def runs(plugin: Path) -> int:
    state = plugin.with_name("runs")
    return int(state.read_text()) if state.exists() else 0


def exec_user(
    plugin: Path, api_version: str = "client.authentication.k8s.io/v1"
) -> dict[str, object]:
    return {"exec": {"apiVersion": api_version, "command": str(plugin), "interactiveMode": "Never"}}
