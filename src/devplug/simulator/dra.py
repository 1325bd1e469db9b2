"""The kubelet's DRA path: the plugin watcher that registers DRA drivers from
plugins_registry, and the claims of pods prepared through NodePrepareResources.

    dra = DraManager(registry_dir, state_dir, claims=FileClaims(folder))
    await dra.start()                       # registers the drivers found, and new ones
    cdi = await dra.prepare_pod(pod)        # {container: [CDI device IDs]}
    await dra.unprepare_pod(pod)

The claims a pod references (`spec.resourceClaims`) are read from a claim source
(the API server, or claim documents in a folder); their allocation names the
drivers, each asked to prepare the claims it has devices in. What was prepared is
kept in `<state-dir>/dra_manager_state`, so a restarted kubelet still knows the CDI
devices of running pods, and asks the drivers again only for what it does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import msgspec

from devplug.api.dra import constants as dra
from devplug.api.dra.v1 import api_pb2 as v1
from devplug.api.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.api.drahealth.v1 import api_pb2 as health_v1
from devplug.api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug.api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug.api.pluginregistration.v1 import api_pb2 as reg
from devplug.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.framework.dra.claims import ClaimError, ClaimSource, FileClaims
from devplug.framework.dra.driver import ClaimRef
from devplug.framework.dra.names import driver_name_problem
from devplug.ground.channel import unix_channel
from devplug.ground.dirwatch import DirWatcher
from devplug.simulator.pods import PodSpec, dra_backed_resources
from devplug.simulator.results import REASON_FAILED_PREPARE, REASON_UNSCHEDULABLE, DraClaimStatus

log = logging.getLogger("devplug.simulator.dra")

STATE_FILE = "dra_manager_state"
CALL_TIMEOUT_S = 10.0
# How long the kubelet keeps the slices of a driver that has no instance left.
WIPING_DELAY_S = 30.0
# The DRA services this kubelet speaks.
_VERSIONS: dict[str, tuple[Any, Any]] = {
    dra.V1: (v1, v1_grpc),
    dra.V1BETA1: (v1beta1, v1beta1_grpc),
}
# The device health services this kubelet speaks, the one it prefers first (as a 1.37
# kubelet: v1, else v1alpha1).
_HEALTH_VERSIONS: dict[str, tuple[Any, Any]] = {
    dra.HEALTH_V1: (health_v1, health_v1_grpc),
    dra.HEALTH_V1ALPHA1: (health_v1alpha1, health_v1alpha1_grpc),
}

# Event kinds passed to `on_event(kind, driver, detail)`.
DRIVER_REGISTERED = "dra_driver_registered"
DRIVER_REFUSED = "dra_driver_refused"
DRIVER_REMOVED = "dra_driver_removed"
DEVICE_HEALTH = "dra_device_health"
SLICES_WIPED = "dra_slices_wiped"  # driver: the one wiped ("" at start: all), detail: how


def skips(results: Sequence[Mapping[str, Any]], driver: str, operation: str) -> bool:
    """Whether every allocated device of `driver` skips `operation` (its slice's
    `skipNodeOperations`, copied into the allocation: Kubernetes 1.37, alpha), so that
    the kubelet makes no call to the driver for it."""
    mine = [r for r in results if r.get("driver") == driver]
    return bool(mine) and all(
        {operation, "*"} & set(r.get("skipNodeOperations") or ()) for r in mine
    )


class PrepareError(Exception):
    """A claim of the pod could not be prepared (the kubelet's FailedPrepareDynamicResources),
    or (`reason` Unschedulable) could never have been allocated so."""

    def __init__(self, message: str, reason: str = REASON_FAILED_PREPARE) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class RegisteredDriver:
    name: str
    endpoint: str
    version: str
    socket: Path  # the registration socket it came from
    channel: grpc.aio.Channel
    stub: Any
    health_task: asyncio.Task[None] | None = None
    # The device health service watched ("v1.DRAResourceHealth"), "" for none.
    health_service: str = ""


class PreparedClaimState(msgspec.Struct):
    namespace: str
    name: str
    uid: str
    # driver -> CDI device IDs by request name ("" for devices of every request)
    cdi: dict[str, dict[str, list[str]]] = {}
    pods: list[str] = []
    # The allocation results, to check the claims that come after it.
    results: list[dict[str, Any]] = []


class State(msgspec.Struct):
    claims: dict[str, PreparedClaimState] = {}


# The pod claim name under which the claim the scheduler made for a pod's extended
# resources is known here (no real pod claim can have it: not a DNS label).
EXTENDED_CLAIM = "<extended-resources>"


def pod_claims(pod: PodSpec) -> dict[str, str]:
    """Pod claim name -> ResourceClaim name, from spec.resourceClaims (direct names,
    or generated ones from status.resourceClaimStatuses), and the claim of the pod's
    extended resources served through DRA (status.extendedResourceClaimStatus)."""
    spec = pod.manifest.get("spec") or {}
    status = pod.manifest.get("status") or {}
    extended = status.get("extendedResourceClaimStatus")
    if isinstance(extended, Mapping) and extended.get("resourceClaimName"):
        made = {EXTENDED_CLAIM: str(extended["resourceClaimName"])}
    else:
        made = {}
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    result: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        name = entry.get("resourceClaimName") or generated.get(entry["name"])
        if name:
            result[str(entry["name"])] = str(name)
    return {**result, **made}


def container_claims(pod: PodSpec) -> dict[str, list[tuple[str, str]]]:
    """Container -> [(pod claim name, request or '')], from resources.claims."""
    spec = pod.manifest.get("spec") or {}
    result: dict[str, list[tuple[str, str]]] = {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources") or {}
            claims = resources.get("claims") if isinstance(resources, Mapping) else None
            result[str(container.get("name"))] = [
                (str(c.get("name")), str(c.get("request") or ""))
                for c in claims or []
                if isinstance(c, Mapping)
            ]
    # Counted extended resources served through DRA: each container gets its request
    # of the scheduler's claim.
    for (container_name, _), request in dra_backed_resources(pod.manifest).items():
        result.setdefault(container_name, []).append((EXTENDED_CLAIM, request))
    return result


class NodeSlices:
    """The kubelet's hold on its node's ResourceSlices: it deletes all of them when it
    starts (no driver is registered yet), and a driver's WIPING_DELAY_S after the last
    instance of it went away (the real kubelet's grace for a driver that restarts)."""

    def __init__(self, api_client: Any, node: str, wiping_delay: float = WIPING_DELAY_S) -> None:
        from kubernetes import client

        self._resource: Any = client.ResourceV1Api(api_client)
        self.node = node
        self.wiping_delay = wiping_delay
        self.wiped = 0  # wipes done, for tests

    async def wipe(self, driver: str | None) -> bool:
        """Delete the node's slices (of `driver` only, if given); failures are logged."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        from devplug.apiserver.failures import Permanent, say

        selector = f"spec.nodeName={self.node}" + (f",spec.driver={driver}" if driver else "")
        try:
            await asyncio.to_thread(
                self._resource.delete_collection_resource_slice, field_selector=selector
            )
        except (ApiException, HTTPError, OSError, Permanent) as error:
            log.warning("deleting ResourceSlices (%s) failed: %s", selector, say(error))
            return False
        self.wiped += 1
        log.info("deleted ResourceSlices (%s)", selector)
        return True


class DraManager:
    """The kubelet's DRA manager and plugin watcher for DRA drivers."""

    def __init__(
        self,
        registry_dir: Path | str,
        state_dir: Path | str,
        claims: ClaimSource,
        *,
        on_event: Callable[[str, str, str], None] | None = None,
        slices: NodeSlices | None = None,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.state_path = Path(state_dir) / STATE_FILE
        self.claims = claims
        # The driver instances to call: the newest registered of each name. Several
        # instances of one driver (a rolling update) are all registered, by socket.
        self.drivers: dict[str, RegisteredDriver] = {}
        self._instances: dict[str, list[RegisteredDriver]] = {}
        self.slices = slices
        self._wipes: dict[str, asyncio.TimerHandle] = {}
        # (driver, pool, device) -> "Healthy" / "Unhealthy" / "Unknown", from the
        # drivers' health streams (NodeWatchResources), where they offer one.
        self.device_health: dict[tuple[str, str, str], str] = {}
        # The same devices' health messages (why they are unhealthy), where given.
        self.device_health_message: dict[tuple[str, str, str], str] = {}
        self._on_event = on_event or (lambda kind, driver, detail: None)
        self._watcher: DirWatcher | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._state = self._load()
        # Claims from a folder were allocated by no scheduler: check them as it would,
        # against the slices the drivers write there.
        self._slices_dir = claims.folder if isinstance(claims, FileClaims) else None

    # -- state ----------------------------------------------------------------------

    def _load(self) -> State:
        try:
            return msgspec.json.decode(self.state_path.read_bytes(), type=State)
        except FileNotFoundError:
            return State()
        except msgspec.DecodeError as error:
            log.error(
                "cannot read %s: %s; starting without prepared claims", self.state_path, error
            )
            return State()

    def _save(self) -> None:
        from devplug.ground.files import write_atomic

        write_atomic(self.state_path, msgspec.json.encode(self._state), mode=0o600)

    # -- plugin watcher ---------------------------------------------------------------

    async def start(self) -> None:
        """Register the drivers whose sockets are in the registry folder, and watch it
        for more (as the kubelet's plugin watcher does after a start)."""
        self.registry_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        watcher = DirWatcher(self._on_folder_event)
        watcher.watch(self.registry_dir)
        self._watcher = watcher
        self._watch_task = asyncio.create_task(watcher.run(), name="plugin watcher")
        if self.slices is not None:
            # At start no driver is registered: the node offers nothing until they are
            # back. In the background, as the kubelet does: it may land after a driver
            # has registered and published again.
            self._spawn(self._wipe(None), "wipe slices")
        for path in sorted(self.registry_dir.iterdir()):
            self._consider(path)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` in the background; `stop` cancels what is still running."""
        task = asyncio.create_task(work, name=name)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def stop(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        for handle in self._wipes.values():
            handle.cancel()
        self._wipes.clear()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for instances in self._instances.values():
            for driver in instances:
                _cancel(driver)
                await driver.channel.close()
        self._instances.clear()
        self.drivers.clear()

    def _on_folder_event(self, folder: Path, name: str) -> None:
        if name:
            self._consider(folder / name)

    def _consider(self, path: Path) -> None:
        if path.name.startswith("."):
            return  # the kubelet's plugin watcher ignores hidden files (a socket being made)
        try:
            is_socket = stat.S_ISSOCK(path.lstat().st_mode)
        except OSError:
            is_socket = False
        if not is_socket:
            for instances in list(self._instances.values()):
                for driver in [d for d in instances if d.socket == path]:
                    self._deregister(driver)
            return
        self._spawn(self._register(path), f"register {path.name}")

    def _deregister(self, driver: RegisteredDriver) -> None:
        instances = self._instances.get(driver.name, [])
        if driver not in instances:
            return
        instances.remove(driver)
        _cancel(driver)
        log.info("DRA driver %s deregistered (%s removed)", driver.name, driver.socket)
        self._on_event(DRIVER_REMOVED, driver.name, str(driver.socket))
        self._spawn(driver.channel.close(), f"close {driver.name}")
        if instances:
            self.drivers[driver.name] = instances[-1]  # the newest left
            return
        del self._instances[driver.name]
        del self.drivers[driver.name]
        if self.slices is not None:
            # The kubelet's grace for a driver that restarts: its slices go only if no
            # instance of it registers within WIPING_DELAY_S.
            name = driver.name
            loop = asyncio.get_running_loop()
            self._wipes[name] = loop.call_later(
                self.slices.wiping_delay, lambda: self._wipe_driver(name)
            )

    def _wipe_driver(self, name: str) -> None:
        self._wipes.pop(name, None)
        if name not in self.drivers:
            self._spawn(self._wipe(name), f"wipe slices of {name}")

    async def _wipe(self, driver: str | None) -> None:
        assert self.slices is not None
        if await self.slices.wipe(driver):
            how = "the grace after the last instance went" if driver else "the kubelet's start"
            self._on_event(SLICES_WIPED, driver or "", how)

    async def _register(self, socket: Path) -> None:
        async with unix_channel(socket) as channel:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                # The file exists from bind(), a moment before the server listens.
                info = await stub.GetInfo(
                    reg.InfoRequest(), timeout=CALL_TIMEOUT_S, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as error:
                log.warning("GetInfo on %s failed: %s", socket, error.details())
                return
            problem = self._info_problem(info)
            if info.type != dra.DRA_PLUGIN_TYPE:
                return  # a CSI or device plugin: not this manager's
            if problem is None:
                # The first of the driver's list that this kubelet speaks, as the
                # kubelet picks it (the driver's order, not the kubelet's).
                version = next(v for v in info.supported_versions if v in _VERSIONS)
                pb_grpc = _VERSIONS[version][1]
                endpoint = info.endpoint or str(socket)
                instances = self._instances.setdefault(info.name, [])
                for old in [d for d in instances if d.socket == socket]:
                    instances.remove(old)  # the same registration socket served again
                    _cancel(old)
                    await old.channel.close()
                if any(d.endpoint == endpoint for d in instances):
                    problem = f"endpoint {endpoint} already registered for DRA driver {info.name}"
            if problem is None:
                service_channel = unix_channel(endpoint)
                driver = RegisteredDriver(
                    info.name,
                    endpoint,
                    version,
                    socket,
                    service_channel,
                    pb_grpc.DRAPluginStub(service_channel),
                )
                # The health stream is watched only where the driver lists it in its
                # supported_versions, as the kubelet does: v1 where listed, else v1alpha1.
                listed = [v for v in _HEALTH_VERSIONS if v in info.supported_versions]
                if listed:
                    driver.health_service = listed[0]
                    driver.health_task = asyncio.create_task(
                        self._watch_health(driver), name=f"health {info.name}"
                    )
                instances.append(driver)
                self.drivers[info.name] = driver
                wipe = self._wipes.pop(info.name, None)
                if wipe is not None:
                    wipe.cancel()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=problem is None, error=problem or ""),
                    timeout=CALL_TIMEOUT_S,
                )
        if problem is None:
            log.info("DRA driver %s registered (%s, %s)", info.name, version, endpoint)
            self._on_event(DRIVER_REGISTERED, info.name, version)
        else:
            log.warning("DRA driver %s refused: %s", info.name, problem)
            self._on_event(DRIVER_REFUSED, info.name, problem)

    async def _watch_health(self, driver: RegisteredDriver) -> None:
        """Follow the driver's device health stream while it is registered; a driver
        that fails the call (UNIMPLEMENTED too) is simply not watched, as the kubelet does."""
        health, health_grpc = _HEALTH_VERSIONS[driver.health_service]
        stub = health_grpc.DRAResourceHealthStub(driver.channel)
        names = {health.HEALTHY: "Healthy", health.UNHEALTHY: "Unhealthy"}
        try:
            async for message in stub.NodeWatchResources(health.NodeWatchResourcesRequest()):
                for item in message.devices:
                    key = (driver.name, item.device.pool_name, item.device.device_name)
                    state = names.get(item.health, "Unknown")
                    self.device_health_message[key] = item.message
                    if self.device_health.get(key) != state:
                        self.device_health[key] = state
                        self._on_event(DEVICE_HEALTH, driver.name, f"{key[1]}/{key[2]}: {state}")
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                log.info("%s: no device health stream: %s", driver.name, error.code().name)

    @staticmethod
    def _info_problem(info: reg.PluginInfo) -> str | None:
        if problem := driver_name_problem(info.name):
            return problem
        if not any(v in info.supported_versions for v in _VERSIONS):
            return (
                f"none of the versions {list(info.supported_versions)} is supported by the "
                f"kubelet ({', '.join(_VERSIONS)})"
            )
        if info.endpoint and not Path(info.endpoint).is_absolute():
            return f"endpoint {info.endpoint!r} is not an absolute path"
        return None

    # -- claims ------------------------------------------------------------------------

    async def prepare_pod(self, pod: PodSpec) -> dict[str, list[str]]:
        """Prepare the pod's claims; the CDI device IDs of each container."""
        claims: dict[str, PreparedClaimState] = {}
        for pod_claim, claim_name in pod_claims(pod).items():
            claims[pod_claim] = await self._prepare_claim(pod, claim_name)
        return self._container_cdi(pod, claims)

    def container_cdi(self, pod: PodSpec) -> dict[str, list[str]]:
        """The CDI device IDs of each container of a pod whose claims are prepared."""
        by_name = {(c.namespace, c.name): c for c in self._state.claims.values()}
        claims = {
            pod_claim: by_name[(pod.namespace, claim_name)]
            for pod_claim, claim_name in pod_claims(pod).items()
            if (pod.namespace, claim_name) in by_name
        }
        return self._container_cdi(pod, claims)

    @staticmethod
    def _container_cdi(
        pod: PodSpec, claims: Mapping[str, PreparedClaimState]
    ) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for container, refs in container_claims(pod).items():
            ids: dict[str, None] = {}
            for pod_claim, request in refs:
                state = claims.get(pod_claim)
                for by_request in (state.cdi if state is not None else {}).values():
                    for req, cdi_ids in by_request.items():
                        if not request or req in ("", request) or req.startswith(f"{request}/"):
                            ids.update(dict.fromkeys(cdi_ids))
            if ids:
                result[container] = list(ids)
        return result

    async def _prepare_claim(self, pod: PodSpec, claim_name: str) -> PreparedClaimState:
        try:
            obj = await asyncio.to_thread(self.claims.get, ClaimRef(pod.namespace, claim_name, ""))
        except ClaimError as error:
            raise PrepareError(str(error)) from None
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        known = self._state.claims.get(uid)
        if known is not None:
            if pod.uid not in known.pods:
                known.pods.append(pod.uid)
                self._save()
            return known
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"ResourceClaim {pod.namespace}/{claim_name} is not allocated")
        results = (allocation.get("devices") or {}).get("results") or []
        if self._slices_dir is not None:
            self._check_allocation(f"{pod.namespace}/{claim_name}", results)
        drivers = sorted({str(r.get("driver")) for r in results})
        state = PreparedClaimState(
            pod.namespace, claim_name, uid, pods=[pod.uid], results=list(results)
        )
        for name in drivers:
            if skips(results, name, "NodePrepareResources"):
                continue  # as a 1.37 kubelet with DRAOptionalNodeOperations: not even looked up
            driver = self.drivers.get(name)
            if driver is None:
                raise PrepareError(f"DRA driver {name} is not registered")
            pb = _VERSIONS[driver.version][0]
            claim = pb.Claim(namespace=pod.namespace, uid=uid, name=claim_name)
            try:
                response = await driver.stub.NodePrepareResources(
                    pb.NodePrepareResourcesRequest(claims=[claim]), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as error:
                raise PrepareError(
                    f"NodePrepareResources of {name} failed: {error.code().name}: {error.details()}"
                ) from None
            if uid not in response.claims:
                raise PrepareError(f"{name} did not answer for claim {claim_name}")
            answer = response.claims[uid]
            if answer.error:
                raise PrepareError(f"{name}: claim {pod.namespace}/{claim_name}: {answer.error}")
            by_request: dict[str, list[str]] = {}
            for device in answer.devices:
                for request in device.request_names or [""]:
                    by_request.setdefault(request, []).extend(device.cdi_device_ids)
            state.cdi[name] = by_request
        self._state.claims[uid] = state
        self._save()
        return state

    def _check_allocation(self, claim: str, results: list[dict[str, Any]]) -> None:
        from devplug.simulator.allocation import InvalidAllocation, check, read_pools

        assert self._slices_dir is not None
        others = [(f"{c.namespace}/{c.name}", c.results) for c in self._state.claims.values()]
        try:
            check(claim, results, others, read_pools(self._slices_dir))
        except (InvalidAllocation, ValueError) as error:
            raise PrepareError(str(error), REASON_UNSCHEDULABLE) from None

    async def unprepare_pod(self, pod: PodSpec) -> None:
        """Release the pod's claims; a claim no other pod uses is unprepared."""
        for uid, state in list(self._state.claims.items()):
            if pod.uid not in state.pods:
                continue
            state.pods.remove(pod.uid)
            if not state.pods:
                await self._unprepare(state)
                del self._state.claims[uid]
            self._save()

    async def _unprepare(self, state: PreparedClaimState) -> None:
        for name in state.cdi:
            if skips(state.results, name, "NodeUnprepareResources"):
                continue
            driver = self.drivers.get(name)
            if driver is None:
                log.warning(
                    "cannot unprepare claim %s: driver %s is not registered", state.name, name
                )
                continue
            pb = _VERSIONS[driver.version][0]
            claim = pb.Claim(namespace=state.namespace, uid=state.uid, name=state.name)
            try:
                response = await driver.stub.NodeUnprepareResources(
                    pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as error:
                log.warning("NodeUnprepareResources of %s failed: %s", name, error.details())
                continue
            answer = response.claims.get(state.uid)
            if answer is not None and answer.error:
                log.warning("%s: unprepare of %s: %s", name, state.name, answer.error)

    def driver_versions(self) -> dict[str, str]:
        """The registered drivers and the DRA service version each is called with."""
        return {d.name: d.version for d in self.drivers.values()}

    def claim_status(self) -> list[DraClaimStatus]:
        """The prepared claims as the node status shows them: CDI devices per driver."""
        return [
            DraClaimStatus(
                c.namespace,
                c.name,
                c.uid,
                {d: sorted({i for ids in r.values() for i in ids}) for d, r in c.cdi.items()},
                list(c.pods),
            )
            for c in self._state.claims.values()
        ]


def _cancel(driver: RegisteredDriver) -> None:
    if driver.health_task is not None:
        driver.health_task.cancel()
