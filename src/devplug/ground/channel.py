"""gRPC channels over unix sockets, tuned for peers on the same node."""

from __future__ import annotations

import os

import grpc

# A socket file exists from bind(), a moment before its server listens, and a peer
# may restart at any time: retry connections within milliseconds instead of after
# gRPC's default 1 s first backoff.
FAST_RECONNECT = (
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.min_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 500),
)


def unix_channel(path: str | os.PathLike[str]) -> grpc.aio.Channel:
    """An asyncio channel to the gRPC server on the unix socket at `path`."""
    return grpc.aio.insecure_channel(f"unix://{path}", options=FAST_RECONNECT)
