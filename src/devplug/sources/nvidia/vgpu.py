"""vGPU host labels as GPU feature discovery writes them (`nvidia.com/vgpu.present`,
`vgpu.host-driver-version`, `vgpu.host-driver-branch`), read from the PCI config space
of NVIDIA's devices in sysfs: a GPU handed to a VM by a vGPU host carries a
vendor-specific capability signed 'VF' whose record 0 holds the host driver's
version and branch (10 bytes each). Reading the whole config space needs privileges:
where only its first 64 bytes can be read, no vGPU label is written, as GFD does."""

from __future__ import annotations

import os

from devplug.sources.nvidia.discovery import VENDOR_ID, host_path

PCI_DEVICES = "/sys/bus/pci/devices"
STATUS, STATUS_CAPABILITIES, CAPABILITIES = 0x06, 0x10, 0x34
VENDOR_SPECIFIC = 0x09
FULL_CONFIG = 256  # bytes of config space a privileged reader sees
FIELD = 10  # bytes of the version and of the branch


def _capability(config: bytes) -> bytes | None:
    """The vendor-specific capability of a config space, if any."""
    if not config[STATUS] & STATUS_CAPABILITIES:
        return None
    position, seen = config[CAPABILITIES], set()
    while position and position not in seen and position + 3 <= len(config):
        seen.add(position)
        kind, following, length = config[position], config[position + 1], config[position + 2]
        if kind == 0xFF:
            return None
        if kind == VENDOR_SPECIFIC:
            return config[position : position + length]
        position = following
    return None


def _host_driver(capability: bytes) -> tuple[str, str] | None:
    """(version, branch) of record 0 of a vGPU capability ('VF' at bytes 3-4)."""
    if len(capability) < 5 or capability[3:5] != b"VF":
        return None
    position = 5
    while position < len(capability) and capability[position] != 0:
        step = capability[position + 1] if position + 1 < len(capability) else 0
        if step == 0:
            return None
        position += step
    start = position + 2
    if position >= len(capability) or start + 2 * FIELD > len(capability):
        return None
    version = capability[start : start + FIELD].rstrip(b"\0").decode(errors="replace")
    branch = capability[start + FIELD : start + 2 * FIELD].rstrip(b"\0").decode(errors="replace")
    return version, branch


def vgpu_labels(root: str, domain: str) -> dict[str, str]:
    """GFD's vGPU labels of this host ({} when the config space cannot be read)."""
    folder = host_path(root, PCI_DEVICES)
    found: list[tuple[str, str]] = []
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return {}
    for address in entries:
        base = os.path.join(folder, address)
        try:
            with open(os.path.join(base, "vendor")) as f:
                if f.read().strip().lower() != VENDOR_ID:
                    continue
            with open(os.path.join(base, "config"), "rb") as f:
                config = f.read()
        except OSError:
            return {}
        if len(config) < FULL_CONFIG:  # not privileged: GFD writes nothing then
            return {}
        capability = _capability(config)
        driver = _host_driver(capability) if capability else None
        if driver is not None:
            found.append(driver)
    labels = {f"{domain}/vgpu.present": str(bool(found)).lower()}
    if found:
        version, branch = found[-1]
        labels[f"{domain}/vgpu.host-driver-version"] = version
        labels[f"{domain}/vgpu.host-driver-branch"] = branch
    return labels
