"""Preparing claims on the node: allocation -> devices -> a CDI spec per claim, with
a checkpoint of what is prepared so that a restart of the driver or the kubelet
loses nothing.

Prepare is idempotent: a claim already prepared gets the same answer (its CDI spec
is written again if it went missing). Unprepare of a claim that is not prepared
succeeds, as the kubelet expects after a restart in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import msgspec

from devplug.framework.device import ContainerEdits, Device
from devplug.framework.dra.claims import ClaimError, ClaimSource, allocated_devices
from devplug.framework.dra.driver import AllocatedDevice, ClaimRef, Driver, tolerates
from devplug.outputs import cdi
from devplug.outputs.files import remove_quietly, write_atomic

log = logging.getLogger("devplug.dra.prepare")

CHECKPOINT_FILE = "prepared-claims.json"
LOCK_FILE = "serialize.lock"  # held by the instance preparing or unpreparing
CDI_CLASS = "claim"
_ENV_UNSAFE = re.compile(r"[^A-Za-z0-9]")


class PreparedDevice(msgspec.Struct, frozen=True):
    requests: list[str]
    pool: str
    device: str
    device_id: str
    cdi_ids: list[str]


class PreparedClaim(msgspec.Struct):
    namespace: str
    name: str
    devices: list[PreparedDevice]


class Checkpoint(msgspec.Struct):
    claims: dict[str, PreparedClaim] = msgspec.field(default_factory=dict)


class Preparer:
    """Prepares and unprepares the claims of one driver's pool on this node."""

    def __init__(
        self,
        driver: Driver,
        pool: str,
        claims: ClaimSource,
        cdi_dir: Path | str,
        state_dir: Path | str,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.claims = claims
        self.cdi_dir = Path(cdi_dir)
        self.checkpoint_path = Path(state_dir) / CHECKPOINT_FILE
        self.cdi_kind = f"{driver.name}/{CDI_CLASS}"
        self._lock = asyncio.Lock()
        self.lock_path = Path(state_dir) / LOCK_FILE
        self._lock_fd: int | None = None
        self._seen: tuple[int, int, int] | None = None  # the checkpoint file we know
        self.prepared: dict[str, PreparedClaim] = self._load()

    @contextlib.asynccontextmanager
    async def _serialized(self) -> AsyncIterator[None]:
        """One prepare or unprepare at a time, across every devplug instance of the node
        (a rolling update runs two, and the kubelet may call either): an asyncio lock
        within the process, a file lock between processes, and the checkpoint read
        again when another instance changed it."""
        async with self._lock:
            fd = self._lock_fd
            if fd is None:
                self.lock_path.parent.mkdir(parents=True, exist_ok=True)
                fd = self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # the other instance is at it: wait in a thread
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            try:
                if self._checkpoint_stat() != self._seen:
                    self.prepared = self._load()
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _checkpoint_stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.checkpoint_path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _load(self) -> dict[str, PreparedClaim]:
        self._seen = self._checkpoint_stat()
        try:
            data = self.checkpoint_path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            return msgspec.json.decode(data, type=Checkpoint).claims
        except msgspec.DecodeError as error:
            log.error(
                "%s: unreadable checkpoint %s: %s", self.driver.name, self.checkpoint_path, error
            )
            return {}

    def _save(self) -> None:
        data = msgspec.json.encode(Checkpoint(self.prepared))
        write_atomic(self.checkpoint_path, data, mode=0o600)
        self._seen = self._checkpoint_stat()

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self.driver.name}-{claim_uid}.json"

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        async with self._serialized():
            done = self.prepared.get(claim.uid)
            if done is not None and (not done.devices or self.spec_path(claim.uid).exists()):
                return done.devices
            obj = await asyncio.to_thread(self.claims.get, claim)
            results = allocated_devices(claim, obj, self.driver.name, self.pool)
            by_name = self.driver.devices_by_name()
            chosen: dict[str, Device] = {}
            requests: dict[str, list[str]] = {}
            for result in results:
                device = by_name.get(result.device)
                if device is None:
                    raise ClaimError(f"device {result.device} is not published by this node")
                if not device.healthy and not self._tolerated(device, result):
                    why = f" ({device.health_reason})" if device.health_reason else ""
                    raise ClaimError(
                        f"device {result.device} is unhealthy{why} and the claim does not "
                        "tolerate its taint"
                    )
                chosen[result.device] = device
                requests.setdefault(result.device, []).append(result.request)
            try:
                edits = await self.driver.prepare(claim, list(chosen.values()))
            except ClaimError:
                raise
            except Exception as error:
                raise ClaimError(f"preparing failed: {error}") from error
            devices = self._write_spec(claim, chosen, requests, edits) if chosen else []
            self.prepared[claim.uid] = PreparedClaim(claim.namespace, claim.name, devices)
            self._save()
            log.info(
                "%s: prepared claim %s/%s: %s",
                self.driver.name,
                claim.namespace,
                claim.name,
                ", ".join(chosen) or "no devices",
            )
            return devices

    def _tolerated(self, device: Device, result: AllocatedDevice) -> bool:
        """Whether the allocation tolerates every taint of `device` that has an effect
        (a claim that tolerates it may use an unhealthy device, e.g. to diagnose it)."""
        return all(
            tolerates(result.tolerations, taint)
            for taint in self.driver.taints(device)
            if taint.get("effect") != "None"
        )

    def _write_spec(
        self,
        claim: ClaimRef,
        chosen: dict[str, Device],
        requests: dict[str, list[str]],
        edits: ContainerEdits,
    ) -> list[PreparedDevice]:
        """One CDI device per allocated device (its nodes and mounts), the claim's env
        and any further edits of the prepare hook as the spec's common edits."""
        per_device: dict[str, ContainerEdits] = {}
        own_nodes: set[str] = set()
        own_mounts: set[str] = set()
        for name, device in chosen.items():
            device_edits = ContainerEdits(nodes=list(device.nodes), mounts=list(device.mounts))
            own_nodes.update(n.container_path for n in device.nodes)
            own_mounts.update(m.container_path for m in device.mounts)
            if not device_edits.nodes and not device_edits.mounts:
                # CDI refuses a device without edits: name the device in the env.
                device_edits.env[f"DEVPLUG_DRA_DEVICE_{_ENV_UNSAFE.sub('_', name).upper()}"] = (
                    device.id
                )
            per_device[f"{claim.uid}-{name}"] = device_edits
        common = ContainerEdits(
            env=dict(edits.env),
            nodes=[n for n in edits.nodes if n.container_path not in own_nodes],
            mounts=[m for m in edits.mounts if m.container_path not in own_mounts],
        )
        body = cdi.spec(
            self.cdi_kind,
            per_device,
            common,
            annotations={"devplug.io/claim": f"{claim.namespace}/{claim.name}"},
        )
        cdi.write_spec(self.spec_path(claim.uid), body)
        # CDI names the hook added beyond the devices' own go with the first device.
        own = {c for d in chosen.values() for c in d.cdi_devices}
        extra = [c for c in edits.cdi_devices if c not in own]
        prepared = []
        for index, (name, device) in enumerate(chosen.items()):
            ids = [cdi.qualified_name(self.cdi_kind, f"{claim.uid}-{name}"), *device.cdi_devices]
            prepared.append(
                PreparedDevice(
                    requests=requests[name],
                    pool=self.pool,
                    device=name,
                    device_id=device.id,
                    cdi_ids=ids + (extra if index == 0 else []),
                )
            )
        return prepared

    async def unprepare(self, claim: ClaimRef) -> None:
        async with self._serialized():
            done = self.prepared.get(claim.uid)
            if done is None:
                remove_quietly(self.spec_path(claim.uid))
                return
            by_name = self.driver.devices_by_name()
            devices: Sequence[Device] = [
                by_name[d.device] for d in done.devices if d.device in by_name
            ]
            try:
                await self.driver.unprepare(claim, devices)
            except Exception as error:
                raise ClaimError(f"unpreparing failed: {error}") from error
            remove_quietly(self.spec_path(claim.uid))
            del self.prepared[claim.uid]
            self._save()
            log.info("%s: unprepared claim %s/%s", self.driver.name, claim.namespace, claim.name)
