"""The kubelet's own device manager, to put the simulator's work through the real one.

`dpharness` is pkg/kubelet/cm/devicemanager of Kubernetes v1.36.2, unchanged, behind a
small command line. It comes xz-compressed beside the other Kubernetes binaries
(`../shared/k8s/dpharness.xz`, or the folder $DEVPLUG_K8S_DIR names) and is decompressed
into `.envtest/bin`. It serves Registration on `DIR/kubelet.sock`, waits for a plugin of
one resource, admits pods `pod-0`... (UID `dpharness-pod-I`, one container `ctr`) one
after the other through the real Allocate path, keeps its checkpoint in
`DIR/kubelet_internal_checkpoint` and prints one JSON line per event (`registered`,
`capacity`, `allocate` per pod, `checkpoint`, `summary`).

    binary = find(repo_root)            # None when absent (how_to_provide says where)
    run = admit(binary, folder, "example.com/foo", plugin=lambda d: [...argv...], pods=3)
    [(seconds, event), ...] = run.allocations
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.testing.controlplane import ENV_DIR, decompress, source_dir

NAME = "dpharness"
CONTAINER = "ctr"
STOP_TIMEOUT_S = 10.0


def pod_uid(index: int) -> str:
    """The UID the harness gives its pod `pod-<index>`."""
    return f"dpharness-pod-{index}"


def how_to_provide(root: Path) -> str:
    return (
        f"the kubelet's device manager harness is not available: put {NAME}.xz "
        f"(Kubernetes v1.36.2) in {root.parent / 'shared' / 'k8s'}, or name its folder "
        f"in ${ENV_DIR}"
    )


def find(root: Path) -> Path | None:
    """The harness binary, decompressed into `.envtest/bin` of the repository; None
    when its compressed file is nowhere to be found."""
    source = source_dir(root, (NAME,), script=f"{NAME}.xz")
    if source is None:
        return None
    bin_dir = root / ".envtest" / "bin"
    decompress(source, bin_dir, (NAME,))
    return bin_dir / NAME


@dataclass(frozen=True)
class HarnessRun:
    # every JSON line, with time.perf_counter() when it was read
    events: list[tuple[float, dict[str, Any]]]
    returncode: int
    log: str  # the kubelet's klog lines (stderr)

    @property
    def allocations(self) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in self.events if e.get("event") == "allocate"]

    def last(self, kind: str) -> dict[str, Any] | None:
        found = [e for _, e in self.events if e.get("event") == kind]
        return found[-1] if found else None


def admit(
    binary: Path,
    folder: Path,
    resource: str,
    plugin: Callable[[Path], Sequence[str]],
    *,
    pods: int = 1,
    count: int = 1,
    min_capacity: int = 1,
    verbosity: int = 0,
    wait_s: float = 60.0,
) -> HarnessRun:
    """Run the harness on `folder` (created if need be; a checkpoint in it is read as
    the kubelet reads its own at start), start the plugin command `plugin(folder)` once
    the harness serves, and return what the harness printed once it has exited."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        str(binary),
        *("--dir", str(folder), "--resource", resource),
        *("--pods", str(pods), "--count", str(count), "--min-capacity", str(min_capacity)),
        *("--wait", f"{wait_s:g}s", "--v", str(verbosity)),
    ]
    with tempfile.TemporaryFile() as log_file:
        harness = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file
        )
        try:
            _wait_for_socket(folder / "kubelet.sock", harness, wait_s)
            server = subprocess.Popen(list(plugin(folder)), stdin=subprocess.DEVNULL)
            try:
                assert harness.stdout is not None
                lines = [(time.perf_counter(), line) for line in harness.stdout]
                code = harness.wait()
            finally:
                server.terminate()
                try:
                    server.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
        finally:
            if harness.poll() is None:
                harness.kill()
                harness.wait()
            if harness.stdout is not None:
                harness.stdout.close()
        log_file.seek(0)
        log = log_file.read().decode(errors="replace")
    events = [(t, json.loads(line)) for t, line in lines if line.strip()]
    return HarnessRun(events, code, log)


def _wait_for_socket(path: Path, harness: subprocess.Popen[bytes], timeout: float) -> None:
    """Return once the harness serves `path`, woken by inotify on its folder."""
    from asyncinotify import Inotify, Mask

    deadline = time.monotonic() + timeout
    with Inotify() as inotify:
        inotify.add_watch(path.parent, Mask.CREATE | Mask.MOVED_TO)
        while not path.is_socket():
            if harness.poll() is not None:
                raise RuntimeError(f"{NAME} exited ({harness.returncode}) before serving {path}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{NAME} did not serve {path} within {timeout:g} s")
            inotify.sync_timeout = min(left, 0.5)  # and look at the process again
            inotify.sync_get()
