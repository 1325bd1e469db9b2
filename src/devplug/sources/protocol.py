"""What a device source provides: every kind (host device nodes, virtual devices, NVIDIA
GPUs, and any added later) answers the same questions, so that `devplug check`,
`devplug serve`, a reload and the fleet ask them without knowing the kind.

`Source` is the protocol; `SourcePlugin` is the framework's Plugin that serves one,
the base of every kind, with the answers most kinds share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from devplug.framework.plugin import Plugin

if TYPE_CHECKING:
    from devplug.config.resource import ResourceSpec
    from devplug.framework.device import Device
    from devplug.framework.limits import Limits
    from devplug.sources.sysfs.select import Pool


class Source(Protocol):
    """A resource's devices as a config entry describes them."""

    @property
    def resource_name(self) -> str:
        """The resource served (a model's or a MIG profile's, where an entry has several)."""
        ...

    @property
    def spec(self) -> ResourceSpec:
        """The config entry it is built from (its `count`: replicas of each device)."""
        ...

    @property
    def kind(self) -> str:
        """What the devices are: 'host', 'virtual' or 'nvidia' (`devplug check` says it)."""
        ...

    @property
    def pool(self) -> Pool | None:
        """The model of a split resource this serves, or None."""
        ...

    @property
    def limits(self) -> Limits: ...

    @property
    def warnings(self) -> Sequence[str]:
        """One-line notes about the devices found (a glob that matches nothing)."""
        ...

    @property
    def start_problem(self) -> str:
        """Why `devplug serve` must not start with it ('': none), e.g. NVML failing
        for an `nvidia:` entry with failOnInitError."""
        ...

    def discover(self) -> list[Device]:
        """The devices to serve now, without publishing them."""
        ...


class SourcePlugin(Plugin):
    """A Plugin serving one Source of a config entry (each kind of device subclasses
    it); what most kinds share: no pool, no warnings, nothing that stops a start."""

    kind = "host"
    pool: Pool | None = None
    spec: ResourceSpec

    @property
    def warnings(self) -> Sequence[str]:
        return ()

    @property
    def start_problem(self) -> str:
        return ""

    def discover(self) -> list[Device]:
        raise NotImplementedError
