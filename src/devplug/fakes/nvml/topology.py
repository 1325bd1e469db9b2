"""NVLinks and the PCI topology between GPUs through the fake NVML."""

from __future__ import annotations

from typing import Any

import pynvml as _real

from devplug.fakes.nvml.driver import (
    NVML_FEATURE_ENABLED,
    NVML_NVLINK_MAX_LINKS,
    NVMLError_InvalidArgument,
    NVMLError_NotSupported,
    _key,
    _target,
)

# -- topology ------------------------------------------------------------------------------


def _link(device: Any, link: int) -> str:
    _, entry, _ = _target(device)
    links = entry.get("nvlinks", [])
    if not links:
        raise NVMLError_NotSupported()
    if not 0 <= link < NVML_NVLINK_MAX_LINKS:
        raise NVMLError_InvalidArgument()
    if link >= len(links):
        raise NVMLError_NotSupported()
    return str(links[link])


def nvmlDeviceGetNvLinkState(device: Any, link: int) -> int:
    _link(device, link)
    return int(NVML_FEATURE_ENABLED)


def nvmlDeviceGetNvLinkRemotePciInfo(device: Any, link: int) -> Any:
    info = _real.nvmlPciInfo_t()
    info.busId = _link(device, link).encode()
    return info


def nvmlDeviceGetTopologyCommonAncestor(device1: Any, device2: Any) -> int:
    description, _, _ = _target(device1)
    _target(device2)
    first, second = _key(device1)[1], _key(device2)[1]
    matrix = description.get("topology")
    if not matrix:
        return int(_real.NVML_TOPOLOGY_SYSTEM)
    return int(matrix[first][second])
