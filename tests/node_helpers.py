"""The shipped manifests on the real node: test overlays of deploy/ and its variants,
deployed and removed again, and what a test reads from the node after a restart."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devplug.testing.realnode import RealNode, kubectl_path

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
NAMESPACE = "devplug-system"
# What deploy/ (the packaged default config) serves on any node.
DEFAULT_RESOURCES = {
    "devplug.io/null": 4,
    "devplug.io/zero": 1,
    "devplug.io/fake": 8,
    "devplug.io/shared": 4,
}


def overlay(
    folder: Path, variant: str, node: RealNode | None = None, patches: tuple[str, ...] = ()
) -> Path:
    """A kustomization in `folder` over `deploy/<variant>` ("" for deploy/ itself),
    changing only what this offline one-node cluster needs. With `node`: the API
    server's address for the daemon, since the node has no kube-proxy and the
    `kubernetes` Service address leads nowhere (here it even reaches an outbound proxy
    with another certificate). `patches`: JSON 6902 patches of the DaemonSet, as YAML."""
    folder.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(DEPLOY / variant, folder)
    ops = list(patches)
    if node is not None:
        for name, value in (
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", str(node.apiserver_port)),
        ):
            ops.append(
                "- op: add\n  path: /spec/template/spec/containers/0/env/-\n"
                f"  value: {{name: {name}, value: {json.dumps(value)}}}\n"
            )
    text = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
    text += f"resources:\n  - {base}\n"
    if ops:
        patch = "".join(ops).replace("\n", "\n      ")
        text += (
            "patches:\n  - target: {kind: DaemonSet}\n    patch: |\n      " + patch.rstrip() + "\n"
        )
    (folder / "kustomization.yaml").write_text(text)
    return folder


def deployed(node: RealNode, kustomization: Path, daemonset: str = "devplug") -> Any:
    """`RealNode.deployed` in devplug's namespace."""
    return node.deployed(kustomization, NAMESPACE, daemonset)


def daemon_pods(node: RealNode, daemonset: str = "devplug") -> list[dict[str, Any]]:
    return node.daemon_pods(NAMESPACE, daemonset)


class PodLog:
    """`kubectl logs -f` of a pod of devplug's (JSON lines), read as it comes: each
    `wait` returns the next line its predicate accepts, after the lines read before it,
    so a line that was there before an action cannot be taken for its effect. A context
    manager; the stream is closed on exit."""

    def __init__(self, node: RealNode, pod: str) -> None:
        kubectl = kubectl_path()
        assert kubectl is not None
        self.lines: list[dict[str, Any]] = []  # every line read so far
        self._read = 0  # how many of them `wait` has looked at
        self._buffer = b""
        self._process = subprocess.Popen(
            [kubectl, f"--kubeconfig={node.kubeconfig}", "logs", "-f", "-n", NAMESPACE, pod],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def __enter__(self) -> PodLog:
        return self

    def __exit__(self, *_: object) -> None:
        self._process.kill()
        self._process.wait()
        assert self._process.stdout is not None
        self._process.stdout.close()

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> Any:
        """The next line (parsed) that `predicate` accepts; TimeoutError after `timeout` s."""
        stream = self._process.stdout
        assert stream is not None
        deadline = time.monotonic() + timeout
        while True:
            while self._read < len(self.lines):
                line = self.lines[self._read]
                self._read += 1
                if predicate(line):
                    return line
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([stream], [], [], left)[0]:
                seen = [line.get("msg") for line in self.lines[-5:]]
                raise TimeoutError(f"the pod's log did not show it within {timeout:g} s: {seen}")
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"kubectl logs -f ended; the last lines: {self.lines[-5:]}")
            *complete, self._buffer = (self._buffer + chunk).split(b"\n")
            self.lines += [_entry(text.decode()) for text in complete if text.strip()]

    def says(self, *parts: str, timeout: float = 30.0) -> str:
        """The next message containing every one of `parts`."""
        line = self.wait(lambda entry: all(p in entry.get("msg", "") for p in parts), timeout)
        return str(line["msg"])


def _entry(text: str) -> dict[str, Any]:
    """A JSON log line; anything else (a crash before logging was set up) as its text."""
    try:
        entry = json.loads(text)
    except ValueError:
        return {"msg": text}
    return entry if isinstance(entry, dict) else {"msg": text}
