"""Socket paths of a DRA driver that fit AF_UNIX: `sun_path` holds 108 bytes with the
closing NUL, so a path has at most 107. A driver name of up to 63 characters and a pod
UID of 36 can pass that (Kubernetes 1.38 fixed the same in its kubelet plugin helper),
so the UID is shortened to a hash where needed, and a name that cannot be shortened
enough is refused with one line instead of failing at bind.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

# The most bytes a socket path may have (sun_path is 108 with the closing NUL).
MAX_SOCKET_PATH = 107


def _digest(*parts: str, size: int) -> str:
    """`size` bytes of sha256 over `parts`, URL-safe base64 without padding."""
    raw = hashlib.sha256("\0".join(parts).encode()).digest()[:size]
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def socket_path(folder: Path, name: str, uid: str, suffix: str) -> Path:
    """`<folder>/<name>-<uid><suffix>` (`<name><suffix>` without a UID), else with 8
    bytes of the UID's hash in its place, else 8 bytes of the hash of both alone: the
    first that fits (the last fits any driver name in the kubelet's folders). ValueError,
    saying so, when none does."""
    if not uid:
        candidates = [f"{name}{suffix}"]
    else:
        candidates = [
            f"{name}-{uid}{suffix}",
            f"{name}-{_digest(uid, size=8)}{suffix}",
            f"{_digest(name, uid, size=8)}{suffix}",
        ]
    for candidate in candidates:
        path = folder / candidate
        if len(bytes(path)) <= MAX_SOCKET_PATH:
            return path
    first = folder / candidates[0]
    raise ValueError(
        f"socket {first} is {len(bytes(first))} bytes, more than the {MAX_SOCKET_PATH} a unix "
        f"socket path may have, even shortened: use a shorter folder than {folder}"
    )
