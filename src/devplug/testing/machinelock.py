"""The machine-wide turn at the one real cluster: a blocking lock on a file of its own,
so that test runs of different checkouts wait for each other."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from devplug.testing.nodesh import MARKER, run_node_sh

LOCK_FILE = Path("/run/lock/devplug-realnode.lock")
NODE_SH_LOCK = Path("/run/lock/k8s-node.lock")  # node.sh's own (`flock -n`), and its .dir
LOCK_TIMEOUT_ENV = "DEVPLUG_NODE_LOCK_TIMEOUT"
LOCK_TIMEOUT_S = 1800.0  # two full test runs of another checkout
LOCK_POLL_S = 0.5  # a released flock sends no event: the waiter asks again


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text().strip() or "another process"
    return "another process"


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class MachineLock:
    """The machine-wide turn at the one real cluster: a blocking lock on a file of its
    own, so that test runs of different checkouts wait for each other instead of
    failing on node.sh's non-blocking `flock -n`.

    It also waits for node.sh's own lock to be free (a cluster started by hand), and
    stops a cluster that a killed run of this module left behind."""

    def __init__(
        self,
        path: Path = LOCK_FILE,
        node_sh: Path | None = None,
        node_sh_lock: Path = NODE_SH_LOCK,
    ) -> None:
        self.path = path
        self.node_sh_lock = node_sh_lock
        self.node_sh = node_sh  # to stop a left-behind cluster of ours; None: wait for it
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None, say: Callable[[str], None] = print) -> None:
        """Block until ours (`timeout`: $DEVPLUG_NODE_LOCK_TIMEOUT or 30 min); `say` is
        told once who holds it while waiting. TimeoutError names the holder."""
        if self._fd is not None:
            return
        if timeout is None:
            timeout = float(os.environ.get(LOCK_TIMEOUT_ENV) or LOCK_TIMEOUT_S)
        deadline = time.monotonic() + timeout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._wait(fd, self.path, deadline, timeout, say)
            os.ftruncate(fd, 0)
            os.write(
                fd, f"pid {os.getpid()} ({' '.join(sys.argv)[:200]}) in {os.getcwd()}\n".encode()
            )
            self._free_node_sh(deadline, timeout, say)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _wait(
        self, fd: int, path: Path, deadline: float, timeout: float, say: Callable[[str], None]
    ) -> None:
        told = False
        while not _try_flock(fd):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the real node was not free within {timeout:.0f} s: {path} is held by "
                    f"{_holder(path)} (wait longer with ${LOCK_TIMEOUT_ENV}=SECONDS)"
                )
            if not told:
                say(
                    f"waiting up to {timeout:.0f} s for the real node: {path} is held by "
                    f"{_holder(path)}"
                )
                told = True
            time.sleep(LOCK_POLL_S)

    def _free_node_sh(self, deadline: float, timeout: float, say: Callable[[str], None]) -> None:
        lock = self.node_sh_lock
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            told = False
            while not _try_flock(fd):
                folder = Path(_holder(lock.with_name(lock.name + ".dir")))
                if self.node_sh is not None and (folder / MARKER).is_file():
                    # Ours, and we hold our lock: a run that was killed left it up.
                    say(f"stopping the cluster a killed test run left in {folder}")
                    run_node_sh(self.node_sh, folder, "down", timeout=120, check=False)
                    continue
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"a node.sh cluster is still running in {folder} after {timeout:.0f} s "
                        f"({lock}): stop it with `node.sh down {folder}`"
                    )
                if not told:
                    say(f"waiting for the node.sh cluster in {folder} to be stopped")
                    told = True
                time.sleep(LOCK_POLL_S)
            fcntl.flock(fd, fcntl.LOCK_UN)  # node.sh up takes it itself
        finally:
            os.close(fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock

    @contextlib.contextmanager
    def holding(
        self, timeout: float | None = None, say: Callable[[str], None] = print
    ) -> Iterator[None]:
        self.acquire(timeout, say)
        try:
            yield
        finally:
            self.release()
