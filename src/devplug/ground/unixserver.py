"""gRPC servers on unix sockets: the one way devplug serves a socket, for plugins and
for the simulated kubelet alike.

Paths are taken as `str` or `os.PathLike` and handled with `os` alone: a plugin
daemon that never needs pathlib then does not load it (with urllib.parse and
ipaddress behind it, 0.6 MiB and milliseconds of every start; `make bench`, "floor").
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct
from collections.abc import Callable, Sequence

import grpc

# sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107

# What tells one socket file from the next at the same path: a kubelet that restarts
# creates a new file, which may reuse the inode number of the old one.
SocketIdentity = tuple[int, int, int]
# A path as callers hold it: a str or a pathlib.Path.
StrPath = str | os.PathLike[str]


def socket_identity(path: StrPath) -> SocketIdentity | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def kubelet_socket_ok(path: StrPath) -> bool:
    """Whether `path` is a socket itself (lstat: a symbolic link is not followed)."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def socket_path_problem(path: StrPath) -> str | None:
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return None
    return (
        f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes, the limit of unix "
        "sockets; use a shorter folder or socket name"
    )


class SocketPathTaken(OSError):
    """The socket path holds something this process must not remove; the message says what."""


def socket_holder(path: StrPath) -> str | None:
    """Who serves the unix socket at `path`, as `process PID (NAME)`; None when nobody
    answers there (no socket, or a stale one left by a process that died)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(os.fspath(path))
    except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError):
        return None
    except BlockingIOError:  # its backlog is full: someone listens, too busy to accept
        return "a busy process"
    except OSError as error:  # no permission to connect: someone may serve it
        return f"a process this one cannot reach ({error.strerror})"
    try:
        cred = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", cred)[0]
    except OSError:
        return "a process"
    finally:
        probe.close()
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return f"process {pid}" if pid > 0 else "a process"
    return f"process {pid} ({name})"


def clear_stale_socket(path: StrPath) -> None:
    """Make room for a new socket at `path`: nothing there, or a socket nobody serves
    (left by a process that died) which is removed. Anything else is left alone and
    SocketPathTaken raised: a symbolic link (never followed, never removed), a file
    or folder that is no socket, or a socket another process still serves."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SocketPathTaken(f"{path} is a symbolic link: not followed and not removed")
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathTaken(f"{path} exists and is not a socket: it is left alone")
    holder = socket_holder(path)
    if holder is not None:
        raise SocketPathTaken(f"{path} is served by {holder}: it is left alone")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def bind_problem(path: StrPath) -> str:
    """Why a socket could not be created at `path`: the error a bind there gets (a
    read-only file system, no permission, no folder), read from a probe bind."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(os.fspath(path))
    except OSError as error:
        if error.errno == errno.ENOENT:
            return f"cannot create socket {path}: the folder {_parent(path)} does not exist"
        return f"cannot create socket {path}: {error.strerror}"
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)  # the probe's own socket file
        return f"cannot create socket {path}"
    finally:
        probe.close()


def _parent(path: StrPath) -> str:
    """The folder that holds `path` (pathlib's `parent`)."""
    return os.path.dirname(os.fspath(path)) or "."


def _link_into_place(hidden: StrPath, path: StrPath) -> None:
    """Give the socket at `hidden` the name `path` (a hard link, which never replaces
    what another process put there meanwhile), and drop the hidden name."""
    try:
        os.link(hidden, path)
    except FileExistsError:
        raise SocketPathTaken(f"{path} was taken by another process while starting") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(hidden)


class UnixServer:
    """A grpc.aio server on one unix socket (mode 0600), which it removes when it
    stops unless something else has taken the path meanwhile. It never removes what it
    did not create, apart from a stale socket nobody serves (see clear_stale_socket).

    gRPC itself unlinks whatever socket is at the path it bound when it stops (and would
    so remove another process's socket that replaced ours): the server binds a hidden
    name beside the path (the kubelet's plugin watcher skips dot-files), and the socket
    is linked into place once it serves, the hidden name removed. gRPC then finds
    nothing to unlink, and only this class removes the path, while it is still ours."""

    def __init__(
        self,
        path: StrPath,
        add_services: Callable[[grpc.aio.Server], None],
        options: Sequence[tuple[str, int]] = (),
    ) -> None:
        if problem := socket_path_problem(path):
            raise ValueError(problem)
        self.path = path
        self._add_services = add_services
        self._options = list(options)
        self._server: grpc.aio.Server | None = None
        self.identity: SocketIdentity | None = None

    async def start(self) -> None:
        os.makedirs(_parent(self.path), mode=0o750, exist_ok=True)
        clear_stale_socket(self.path)
        hidden: StrPath = os.path.join(_parent(self.path), f".dp-{os.urandom(4).hex()}")
        if socket_path_problem(hidden) is not None:
            hidden = self.path  # no room for a longer name: bound where it is served
        server = grpc.aio.server(options=self._options)
        self._add_services(server)
        # bind() inside add_insecure_port creates the file, 0600 by this umask. No
        # chmod after: it would change the file's ctime, part of its identity.
        umask = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix://{hidden}")
        except RuntimeError:
            await server.stop(0)
            raise OSError(bind_problem(self.path)) from None
        finally:
            os.umask(umask)
        self._server = server  # set first: a stop() while starting still stops it
        try:
            await server.start()
            if hidden != self.path:
                _link_into_place(hidden, self.path)
        except BaseException:
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(hidden)
            await server.stop(0)
            raise
        # The path may be wiped at any moment (a kubelet starting): then the identity
        # stays None and `owns_path` is False.
        self.identity = socket_identity(self.path)

    def owns_path(self) -> bool:
        """Whether the file at `path` is still this server's socket."""
        return self.identity is not None and socket_identity(self.path) == self.identity

    async def stop(self, grace: float) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        ours = self.owns_path()
        await server.stop(grace)
        if ours:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self.identity = None

    @property
    def serving(self) -> bool:
        return self._server is not None
