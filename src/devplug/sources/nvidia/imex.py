"""IMEX channels as NVIDIA's plugin gives them: every container of the resource gets
the configured channel (NVIDIA takes only channel 0) when its node exists on the host.

The container learns it by NVIDIA_IMEX_CHANNELS (envvar), a mount under the
volume-mounts folder (volume-mounts), and the channel's device node with
passDeviceSpecs; a channel missing on the host is skipped with a warning, or with
`imexRequired` stops the start, as there.
"""

from __future__ import annotations

import os
import stat

from devplug.config.nvidia import NvidiaSpec, cdi_only
from devplug.framework.device import ContainerEdits, Mount
from devplug.sources.nvidia.discovery import VOLUME_MOUNTS_DIR, driver_node, host_path

CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"
ENV = "NVIDIA_IMEX_CHANNELS"


def channel_path(channel: int) -> str:
    return f"{CHANNELS_DIR}/channel{channel}"


def missing_channels(spec: NvidiaSpec) -> list[str]:
    """The configured channels whose node is not a character device on the host."""
    missing = []
    for channel in spec.imex_channels:
        path = host_path(spec.host_root, channel_path(channel))
        try:
            if stat.S_ISCHR(os.stat(path).st_mode):
                continue
        except OSError:
            pass
        missing.append(channel_path(channel))
    return missing


def add_channels(edits: ContainerEdits, spec: NvidiaSpec) -> None:
    """Add the present channels to one container's edits."""
    absent = set(missing_channels(spec))
    present = [c for c in spec.imex_channels if channel_path(c) not in absent]
    if not present or cdi_only(spec):
        return
    ids = [str(c) for c in present]
    strategies = spec.device_list_strategy
    if "envvar" in strategies:
        edits.env[ENV] = ",".join(ids)
    if "volume-mounts" in strategies:
        edits.mounts += [Mount("/dev/null", f"{VOLUME_MOUNTS_DIR}/imex/{i}") for i in ids]
    if spec.pass_device_specs:
        edits.nodes += [driver_node(spec, channel_path(c)) for c in present]
