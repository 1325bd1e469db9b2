"""The Xid policy: which Xids a GPU recovers from by itself and which need a reset.

The source is NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid
Catalog"), whose "immediate resolution" column says what each Xid asks for:
RESTART_APP or IGNORE (the application's problem, or nothing to do: the GPU is fine
once the application is gone), RESET_GPU, RESTART_BM / RESTART_VM (reboot the machine),
or a workflow (WORKFLOW_XID_48 for a double-bit ECC error, WORKFLOW_NVLINK_ERR...) that
ends in a reset. devplug turns that into three actions:

- `ignore`: in the ignored list (NVIDIA's plugin's defaults, plus the config's): nothing;
- `transient`: Unhealthy, Healthy again after the quiet time (`recoverySeconds`);
- `reset`: Unhealthy until the GPU was reset (or the machine rebooted): see
  `devplug.sources.nvidia.source` for how a reset is seen.

An Xid the catalog does not list, or lists only as "contact support", needs a reset:
that is how NVIDIA's plugin treats every critical Xid it does not ignore. The DRA side
uses the same function (`xid_action`) to decide which Xids taint a device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

XidAction = Literal["ignore", "transient", "reset"]

# Xids caused by applications, not by the GPU (NVIDIA's device plugin ignores them):
# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
# 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


def _expand(spec: str) -> set[int]:
    found: set[int] = set()
    for part in spec.split():
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


# The catalog's immediate resolution of each Xid it lists with one.
RESOLUTIONS: dict[str, set[int]] = {
    "RESTART_APP": _expand(
        "8 11 13 25 31 32 39-41 60 68-72 75-77 80 82-86 88 89 94 96-105 126-135 139"
    ),
    "IGNORE": _expand("14 37 38 43 44 63 66 67 92 93 106-108 121 137 141 152 153 157 160 161"),
    "WORKFLOW_XID_45": {45},
    "XID_154": {154},  # informational: the recovery action (read by the probe) changed
    "RESET_GPU": _expand("46 62 64 95 109 110 119 120 136 140 143 155 156 158"),
    "WORKFLOW_XID_48": {48},
    "WORKFLOW_NVLINK_ERR": {74},
    "WORKFLOW_NVLINK5_ERR": _expand("144-150"),
    "RESTART_BM": {79},
    "RESTART_VM": {151},
    "CHECK_MECHANICALS": {54},
    "CHECK_UVM": {159},
    "UPDATE_SWFW": {78},
}
TRANSIENT_RESOLUTIONS = ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45", "XID_154")


def resolution(xid: int) -> str:
    """The catalog's immediate resolution of `xid` ('' when it lists none)."""
    for name, xids in RESOLUTIONS.items():
        if xid in xids:
            return name
    return ""


def ignored_xids(added: Iterable[int] = (), enabled: Iterable[int] = ()) -> frozenset[int]:
    """NVIDIA's default ignored Xids, plus `added`, minus `enabled` (as NVIDIA's
    DP_DISABLE_HEALTHCHECKS adds to its list and DP_ENABLE_HEALTHCHECKS takes out)."""
    return frozenset((set(DEFAULT_IGNORED_XIDS) | set(added)) - set(enabled))


def xid_action(xid: int, ignored: Iterable[int] = DEFAULT_IGNORED_XIDS) -> XidAction:
    """What an Xid means for its GPU: 'ignore', 'transient' (recovers after a quiet
    time) or 'reset' (Unhealthy until the GPU was reset)."""
    if xid in set(ignored):
        return "ignore"
    return "transient" if resolution(xid) in TRANSIENT_RESOLUTIONS else "reset"


def needs_reset(xid: int) -> bool:
    """Whether the catalog's resolution of `xid` is a reset or reboot (ignoring aside)."""
    return xid_action(xid, ()) == "reset"
