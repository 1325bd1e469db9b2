"""What a container runtime accepts of a device plugin's answer: device node
permissions (the device cgroup's r, w and m) and env variables. Checked when a config
is read and again when a Device is made, so that the two never disagree."""

from __future__ import annotations

import re

# Compiled on first use (re keeps them), not at every start.
_PERMISSIONS = r"^(?!.*(.).*\1)[rwm]{1,3}$"


def permissions_problem(permissions: str) -> str | None:
    if re.match(_PERMISSIONS, permissions):
        return None
    return f"permissions {permissions!r} must combine r, w and m, each at most once"


def env_problem(name: str, value: str) -> str | None:
    """Why a container cannot get the variable `name=value`: the runtime hands env to
    execve as 'NAME=VALUE' C strings, so a NUL cuts it and '=' in the name moves the
    split (containerd then drops or mangles it)."""
    if not name:
        return "an env variable needs a name"
    if "=" in name or "\0" in name:
        return f"bad env variable name {name!r}: no '=' or NUL character"
    if "\0" in value:
        return f"env variable {name!r}: its value contains a NUL character"
    return None
