"""The node devplug serves: its name, as the kubelet's own node knows it."""

from __future__ import annotations


def this_node() -> str:
    """The node's name when none is given: $NODE_NAME (the downward API's
    spec.nodeName in a DaemonSet), else the host name."""
    import os
    import socket

    return os.environ.get("NODE_NAME") or socket.gethostname()
