"""Preparing claims on the node: allocation -> devices -> a CDI spec per claim, with
a checkpoint of what is prepared so that a restart of the driver or the kubelet
loses nothing.

Prepare is idempotent: a claim already prepared gets the same answer (its CDI spec
is written again if it went missing). Unprepare of a claim that is not prepared
succeeds, as the kubelet expects after a restart in between.

A device that is not shareable is prepared for one claim at a time, and partitions
never together with one they overlap: the scheduler never allocates so, but a pod
force-deleted while its container still runs frees its claim's devices early, and the
node is the last place that can refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from devplug.config.ids import env_word
from devplug.framework import cdi
from devplug.framework.device import ContainerEdits, Device, Mount
from devplug.framework.dra import metadata
from devplug.framework.dra.claims import ClaimError, ClaimSource, allocated_devices
from devplug.framework.dra.driver import AllocatedDevice, ClaimRef, DriverBinding, Offer
from devplug.framework.dra.layout import overlapping
from devplug.ground.files import remove_quietly, write_atomic
from devplug.kube.tolerations import tolerates

log = logging.getLogger("devplug.dra.prepare")

CHECKPOINT_FILE = "prepared-claims.json"
LOCK_FILE = "serialize.lock"  # held by the instance preparing or unpreparing
CDI_CLASS = "claim"


class PreparedDevice(msgspec.Struct, frozen=True):
    requests: list[str]
    pool: str
    device: str
    device_id: str
    cdi_ids: list[str]
    # A share of a shared device: its share ID (several claims hold the device).
    share_id: str = ""
    # Allocated for administrative access: never in the way of another claim.
    admin: bool = False
    # A partition: the counter set it consumes from, and how much of each counter.
    counter_set: str = ""
    consumes: dict[str, int] = {}


class PreparedClaim(msgspec.Struct):
    namespace: str
    name: str
    devices: list[PreparedDevice]


class Checkpoint(msgspec.Struct):
    claims: dict[str, PreparedClaim] = msgspec.field(default_factory=dict)


@dataclass(slots=True)
class _Pick:
    """One allocated device of the claim being prepared (a share counts apart)."""

    offer: Offer
    share_id: str
    consumed: dict[str, str]
    admin: bool
    requests: list[str] = field(default_factory=list)

    @property
    def cdi_name(self) -> str:
        return f"{self.offer.name}-{self.share_id}" if self.share_id else self.offer.name


class Preparer:
    """Prepares and unprepares the claims of one driver's pool on this node."""

    def __init__(
        self,
        driver: DriverBinding,
        pool: str,
        claims: ClaimSource,
        cdi_dir: Path | str,
        state_dir: Path | str,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.claims = claims
        self.cdi_dir = Path(cdi_dir)
        self.state_dir = Path(state_dir)
        self.checkpoint_path = self.state_dir / CHECKPOINT_FILE
        self.cdi_kind = f"{driver.name}/{CDI_CLASS}"
        self._lock = asyncio.Lock()
        self.lock_path = Path(state_dir) / LOCK_FILE
        self._lock_fd: int | None = None
        self._seen: tuple[int, int, int] | None = None  # the checkpoint file we know
        self.prepared: dict[str, PreparedClaim] = self._load()
        self._tell_held()

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
        self._tell_held()

    def _tell_held(self) -> None:
        """The driver's hooks may ask what is prepared (a MIG instance found at start is
        one devplug made when a claim holds its partition)."""
        self.driver.held = {d.device for c in self.prepared.values() for d in c.devices}

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self.driver.name}-{claim_uid}.json"

    def _already(self, claim: ClaimRef) -> list[PreparedDevice] | None:
        """The devices of `claim` if it is prepared (its CDI spec there, and its
        metadata files where the driver writes them), else None."""
        done = self.prepared.get(claim.uid)
        if done is None or (done.devices and not self.spec_path(claim.uid).exists()):
            return None
        folder = metadata.claim_dir(self.state_dir, claim.namespace, claim.name)
        if done.devices and self.driver.device_metadata and not folder.is_dir():
            return None
        return done.devices

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        async with self._serialized():
            if (done := self._already(claim)) is not None:
                return done
        # Read outside the lock: claims of concurrent calls are read side by side, and
        # only what touches the node (checkpoint, CDI spec, the hooks) is serialized.
        obj = await self.claims.get(claim)
        async with self._serialized():
            if (done := self._already(claim)) is not None:
                return done  # prepared meanwhile (the kubelet called again, or the other pod)
            picks = self._picks(allocated_devices(claim, obj, self.driver.name, self.pool))
            self._refuse_double_allocation(claim, picks)
            devices = list({id(p.offer): p.offer.device for p in picks}.values())
            try:
                edits = await self.driver.prepare(claim, devices)
            except ClaimError:
                raise
            except Exception as error:
                raise ClaimError(f"preparing failed: {error}") from error
            mounts = self._write_metadata(obj, picks) if picks else {}
            prepared = self._write_spec(claim, picks, edits, mounts) if picks else []
            self.prepared[claim.uid] = PreparedClaim(claim.namespace, claim.name, prepared)
            self._save()
            log.info(
                "%s: prepared claim %s/%s: %s",
                self.driver.name,
                claim.namespace,
                claim.name,
                ", ".join(p.cdi_name for p in picks) or "no devices",
            )
            return prepared

    def _picks(self, results: Sequence[AllocatedDevice]) -> list[_Pick]:
        """The claim's devices, known and healthy; a device allocated for several of the
        claim's requests once, with all of them."""
        offers = self.driver.offers()
        picks: dict[tuple[str, str], _Pick] = {}
        for result in results:
            offer = offers.get(result.device)
            if offer is None:
                raise ClaimError(f"device {result.device} is not published by this node")
            if not offer.device.healthy and not self._tolerated(offer.device, result):
                why = f" ({offer.device.health_reason})" if offer.device.health_reason else ""
                raise ClaimError(
                    f"device {result.device} is unhealthy{why} and the claim does not "
                    "tolerate its taint"
                )
            key = (result.device, result.share_id)
            pick = picks.setdefault(
                key, _Pick(offer, result.share_id, dict(result.consumed), result.admin_access)
            )
            pick.requests.append(result.request)
        return list(picks.values())

    def _refuse_double_allocation(self, claim: ClaimRef, picks: Sequence[_Pick]) -> None:
        """A device that is not shareable, or a partition that overlaps one, already
        prepared for another claim (one the kubelet has not unprepared yet: its pod may
        still run) is refused, as the scheduler could not have allocated it."""
        held: dict[str, tuple[str, PreparedClaim]] = {}
        consuming: dict[str, list[tuple[PreparedDevice, str, PreparedClaim]]] = {}
        for uid, other in self.prepared.items():
            if uid == claim.uid:
                continue
            for device in other.devices:
                if device.admin:
                    continue
                if not device.share_id:
                    held[device.device] = (uid, other)
                if device.counter_set:
                    consuming.setdefault(device.counter_set, []).append((device, uid, other))
        mine: dict[str, list[Mapping[str, int]]] = {}
        for pick in picks:
            if pick.admin:
                continue
            name = pick.offer.name
            if not pick.offer.shared and name in held:
                uid, other = held[name]
                raise ClaimError(
                    f"device {name} is already prepared for claim {other.namespace}/"
                    f"{other.name} (UID {uid}) and is not shareable: it is free once that "
                    "claim is unprepared"
                )
            partition, layout = pick.offer.partition, pick.offer.layout
            if partition is None or layout is None:
                continue
            counter_set = pick.offer.counter_set
            others = consuming.get(counter_set, [])
            taken = [d.consumes for d, _, _ in others] + mine.get(counter_set, [])
            if short := overlapping(layout, taken, partition.consumes):
                culprits = [
                    f"{d.device} of claim {o.namespace}/{o.name} (UID {u})"
                    for d, u, o in others
                    if set(d.consumes) & set(short)
                ] or ["another device of this claim"]
                raise ClaimError(
                    f"partition {name} overlaps {', '.join(culprits)}: counter "
                    f"{', '.join(short)} of {counter_set} would be exceeded"
                )
            mine.setdefault(counter_set, []).append(partition.consumes)

    def _tolerated(self, device: Device, result: AllocatedDevice) -> bool:
        """Whether the allocation tolerates every taint of `device` that has an effect
        (a claim that tolerates it may use an unhealthy device, e.g. to diagnose it)."""
        return all(
            tolerates(result.tolerations, taint)
            for taint in self.driver.taints(device)
            if taint.get("effect") != "None"
        )

    def _write_metadata(self, obj: Mapping[str, Any], picks: Sequence[_Pick]) -> dict[str, Mount]:
        """The claim's device metadata files, where the driver writes them: the bind
        mount of each base request."""
        if not self.driver.device_metadata:
            return {}
        from devplug.framework.dra.slices import slice_device

        devices = []
        for pick in picks:
            described = {
                "pool": self.pool,
                "name": pick.offer.name,
                "attributes": slice_device(self.driver, pick.offer).get("attributes", {}),
            }
            devices += [(request, described) for request in pick.requests]
        return metadata.write(self.state_dir, self.driver.name, obj, devices)

    def _write_spec(
        self,
        claim: ClaimRef,
        picks: Sequence[_Pick],
        edits: ContainerEdits,
        mounts: Mapping[str, Mount],
    ) -> list[PreparedDevice]:
        """One CDI device per allocated device or share (its nodes and mounts; a share's
        ID and consumed capacity as env), the claim's env and any further edits of the
        prepare hook as the spec's common edits."""
        per_device, own_nodes, own_mounts = _device_edits(claim.uid, picks, mounts)
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
        own = {c for p in picks for c in p.offer.device.cdi_devices}
        extra = [c for c in edits.cdi_devices if c not in own]
        prepared = []
        for index, pick in enumerate(picks):
            device = pick.offer.device
            ids = [
                cdi.qualified_name(self.cdi_kind, f"{claim.uid}-{pick.cdi_name}"),
                *device.cdi_devices,
            ]
            bases = dict.fromkeys(metadata.base_request(r) for r in pick.requests)
            ids += [
                cdi.qualified_name(self.cdi_kind, f"{claim.uid}-metadata-{base}")
                for base in bases
                if base in mounts
            ]
            partition = pick.offer.partition
            prepared.append(
                PreparedDevice(
                    requests=pick.requests,
                    pool=self.pool,
                    device=pick.offer.name,
                    device_id=device.id,
                    cdi_ids=ids + (extra if index == 0 else []),
                    share_id=pick.share_id,
                    admin=pick.admin,
                    counter_set=pick.offer.counter_set,
                    consumes=dict(partition.consumes) if partition else {},
                )
            )
        return prepared

    async def unprepare(self, claim: ClaimRef) -> None:
        async with self._serialized():
            done = self.prepared.get(claim.uid)
            if done is None:
                remove_quietly(self.spec_path(claim.uid))
                metadata.remove(self.state_dir, claim.namespace, claim.name)
                return
            # Each device once (a claim may hold several shares of one); those gone left out.
            offers = self.driver.offers()
            names = dict.fromkeys(d.device for d in done.devices if d.device in offers)
            devices = [offers[name].device for name in names]
            try:
                await self.driver.unprepare(claim, devices)
            except Exception as error:
                raise ClaimError(f"unpreparing failed: {error}") from error
            remove_quietly(self.spec_path(claim.uid))
            metadata.remove(self.state_dir, claim.namespace, claim.name)
            del self.prepared[claim.uid]
            self._save()
            log.info("%s: unprepared claim %s/%s", self.driver.name, claim.namespace, claim.name)


def _device_edits(
    claim_uid: str, picks: Sequence[_Pick], mounts: Mapping[str, Mount]
) -> tuple[dict[str, ContainerEdits], set[str], set[str]]:
    """The CDI devices of a claim by name, with their edits: one per allocated device
    or share (its nodes and mounts; a share's ID and consumed capacity as env), one per
    request with metadata (its file, bind-mounted read-only); and the container paths
    of the devices' own nodes and mounts."""
    per_device: dict[str, ContainerEdits] = {}
    own_nodes: set[str] = set()
    own_mounts: set[str] = set()
    for pick in picks:
        device = pick.offer.device
        device_edits = ContainerEdits(nodes=list(device.nodes), mounts=list(device.mounts))
        own_nodes.update(n.container_path for n in device.nodes)
        own_mounts.update(m.container_path for m in device.mounts)
        label = env_word(pick.offer.name)
        if pick.share_id:
            device_edits.env[f"DEVPLUG_DRA_SHARE_{label}"] = pick.share_id
            for capacity, amount in pick.consumed.items():
                key = env_word(capacity.rpartition("/")[2])
                device_edits.env[f"DEVPLUG_DRA_SHARE_{label}_{key}"] = amount
        if not device_edits.nodes and not device_edits.mounts and not device_edits.env:
            # CDI refuses a device without edits: name the device in the env.
            device_edits.env[f"DEVPLUG_DRA_DEVICE_{label}"] = device.id
        per_device[f"{claim_uid}-{pick.cdi_name}"] = device_edits
    for request, mount in mounts.items():
        per_device[f"{claim_uid}-metadata-{request}"] = ContainerEdits(mounts=[mount])
    return per_device, own_nodes, own_mounts
