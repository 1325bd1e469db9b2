"""The DevicePlugin gRPC service: the wire adapter between the kubelet and a Plugin.

Requests are validated here, once, for every plugin, so hooks only ever see known,
unique, healthy devices; each refusal carries the gRPC status the kubelet expects
and is logged once with the resource it concerns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc

from devplug.api.constants import HEALTHY, UNHEALTHY
from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework import observe
from devplug.framework.device import ContainerEdits, Device, any_edits, edits_problem, merge_edits
from devplug.framework.malformed import MALFORMED_REQUEST, refuse_malformed
from devplug.framework.observe import show_ids
from devplug.framework.plugin import AllocationError, Plugin
from devplug.kube.containers import env_problem

log = logging.getLogger("devplug.plugin")


def device_to_wire(device: Device) -> pb.Device:
    message = pb.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
    if device.numa_nodes:
        message.topology.nodes.extend(pb.NUMANode(ID=n) for n in device.numa_nodes)
    return message


def edits_to_wire(
    edits: ContainerEdits, into: pb.ContainerAllocateResponse | None = None
) -> pb.ContainerAllocateResponse:
    """`edits` as the kubelet reads them, written into `into` (a response's own
    container entry, which saves a copy) or a new message. Only the parts that hold
    something are touched: on every Allocate, most are empty."""
    message = pb.ContainerAllocateResponse() if into is None else into
    if edits.env:
        envs = message.envs
        for key, value in edits.env.items():
            envs[key] = value
    if edits.mounts:
        message.mounts.extend(
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in edits.mounts
        )
    if edits.nodes:
        message.devices.extend(
            pb.DeviceSpec(
                container_path=n.container_path, host_path=n.host_path, permissions=n.permissions
            )
            for n in edits.nodes
        )
    if edits.annotations:
        annotations = message.annotations
        for key, value in edits.annotations.items():
            annotations[key] = value
    if edits.cdi_devices:
        message.cdi_devices.extend(pb.CDIDevice(name=name) for name in edits.cdi_devices)
    return message


def hook(plugin: Plugin, name: str) -> str:
    """How a plugin's hook is named in errors: 'Widgets.allocate'."""
    return f"{type(plugin).__name__}.{name}"


def resolve(plugin: Plugin, ids: Sequence[str], *, need_healthy: bool = True) -> list[Device]:
    """The devices behind `ids`, or an AllocationError saying what is wrong with them."""
    table = plugin.devices
    devices = []
    try:
        for i in ids:  # a loop: for the one or two IDs of a request, cheaper than [...]
            devices.append(table[i])
    except KeyError:
        unknown = [i for i in ids if i not in table]
        raise AllocationError(f"unknown device IDs: {show_ids(unknown)}") from None
    if len(ids) > 1 and len(set(ids)) != len(ids):
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise AllocationError(f"device IDs requested more than once: {show_ids(twice)}")
    if need_healthy:
        for device in devices:  # a loop, not all(): this runs on every Allocate
            if not device.healthy:
                sick = [d.id for d in devices if not d.healthy]
                raise AllocationError(
                    f"unhealthy devices: {show_ids(sick)}", grpc.StatusCode.FAILED_PRECONDITION
                )
    return devices


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        # The framework's own allocate hook builds its edits from Devices, checked when
        # made, and the IDs' variable, checked here: its answer goes straight to the
        # wire; only a plugin's own hook has its answer checked on every Allocate.
        self._check_edits = type(plugin).allocate is not Plugin.allocate or (
            plugin.ids_env is not None and env_problem(plugin.ids_env, "") is not None
        )
        self._closing = asyncio.Event()
        self._wire_generation = -1
        self._wire_list = pb.ListAndWatchResponse()
        self.streams = 0  # ListAndWatch streams open now

    def close(self) -> None:
        """End every ListAndWatch stream cleanly (status OK) before the server stops."""
        self._closing.set()

    def _current_list(self) -> pb.ListAndWatchResponse:
        # Built once per change, shared by every stream.
        if self._wire_generation != self.plugin.generation:
            self._wire_generation = self.plugin.generation
            self._wire_list = pb.ListAndWatchResponse(
                devices=[device_to_wire(d) for d in self.plugin.devices.values()]
            )
        return self._wire_list

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        if request is MALFORMED_REQUEST:
            await refuse_malformed(context)
        return pb.DevicePluginOptions(
            pre_start_required=self.plugin.pre_start_required,
            get_preferred_allocation_available=self.plugin.preferred_allocation,
        )

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        if request is MALFORMED_REQUEST:
            await refuse_malformed(context)
        limit = self.plugin.limits.max_streams
        if self.streams >= limit:
            await self._refuse(
                context,
                "ListAndWatch",
                AllocationError(
                    f"{self.streams} ListAndWatch streams are open, the limit "
                    f"(limits.maxStreams) is {limit}",
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                ),
            )
        generation = self.plugin.generation
        self.streams += 1
        name = self.plugin.resource_name
        observe.emit(observe.STREAM_OPENED, name, "ListAndWatch stream opened", logging.DEBUG)
        closing = asyncio.ensure_future(self._closing.wait())
        changed: asyncio.Future[int] | None = None
        try:
            # A client that does not read stalls only its own stream here (HTTP/2 flow
            # control); it holds one list at most, as every send is the current one.
            yield self._current_list()
            while not self._closing.is_set():
                changed = asyncio.ensure_future(self.plugin.wait_changed(generation))
                await asyncio.wait({changed, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not changed.done():
                    break
                generation = changed.result()
                yield self._current_list()
        finally:
            # A stream torn down while waiting (the kubelet went away) must not leave
            # its waiters behind: they would pile up across kubelet restarts.
            closing.cancel()
            if changed is not None:
                changed.cancel()
            self.streams -= 1
            observe.emit(observe.STREAM_CLOSED, name, "ListAndWatch stream closed", logging.DEBUG)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[
            pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
        ],
    ) -> pb.PreferredAllocationResponse:
        if request is MALFORMED_REQUEST:
            await refuse_malformed(context)
        if not self.plugin.preferred_allocation:
            await self._refuse(
                context,
                "GetPreferredAllocation",
                AllocationError(
                    "preferred allocation is not offered", grpc.StatusCode.UNIMPLEMENTED
                ),
            )
        response = pb.PreferredAllocationResponse()
        try:
            # The kubelet offers every free device, to each container again: a request
            # as large as the published list allows is the kubelet's own, whatever
            # limits.maxIdsPerRequest says (below the device count it would fail every pod).
            containers = len(request.container_requests)
            self._check_id_count(
                sum(
                    len(c.available_deviceIDs) + len(c.must_include_deviceIDs)
                    for c in request.container_requests
                ),
                at_least=2 * containers * len(self.plugin.devices),
            )
            for index, creq in enumerate(request.container_requests):
                ids = await self._preferred_one(index, creq)
                response.container_responses.add(deviceIDs=ids)
        except AllocationError as error:
            await self._refuse(context, "GetPreferredAllocation", error)
        except Exception as error:  # a hook failed: the daemon keeps serving
            log.exception("%s: preferred hook failed", self.plugin.resource_name)
            await self._refuse(
                context,
                "GetPreferredAllocation",
                AllocationError(f"preferred failed: {error}", grpc.StatusCode.INTERNAL),
            )
        return response

    async def _preferred_one(
        self, index: int, creq: pb.ContainerPreferredAllocationRequest
    ) -> Sequence[str]:
        table = self.plugin.devices
        # IDs the plugin no longer knows are skipped, not refused: the kubelet's view
        # can lag one update behind, and a refusal would fail the pod's admission.
        known = map(table.get, dict.fromkeys(creq.available_deviceIDs))
        available = [d for d in known if d is not None]
        offered = {d.id for d in available}
        must_ids = list(dict.fromkeys(creq.must_include_deviceIDs))
        outside = [i for i in must_ids if i not in offered]
        prefix = f"container request {index}: "
        if outside:
            raise AllocationError(prefix + f"must-include IDs not available: {show_ids(outside)}")
        size = creq.allocation_size
        if size < len(must_ids):
            raise AllocationError(
                prefix + f"allocation size {size} is smaller than {len(must_ids)} must-include IDs"
            )
        if size > len(available):
            raise AllocationError(
                prefix + f"allocation size {size} exceeds the {len(available)} available devices"
            )
        answer = await self.plugin.preferred(available, [table[i] for i in must_ids], size)
        if isinstance(answer, str | bytes) or not isinstance(answer, Iterable):
            raise AllocationError(
                prefix + f"{hook(self.plugin, 'preferred')} returned {type(answer).__name__}, "
                "expected a sequence of device IDs",
                grpc.StatusCode.INTERNAL,
            )
        picked = list(answer)
        if len(picked) != size or not set(must_ids) <= set(picked) or not set(picked) <= offered:
            raise AllocationError(
                prefix + "the plugin's preferred() broke its contract", grpc.StatusCode.INTERNAL
            )
        return picked

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        if request is MALFORMED_REQUEST:
            await refuse_malformed(context)
        response = pb.AllocateResponse()
        started = time.perf_counter()
        # The IDs are read once. The kubelet asks for one container per call, and
        # indexing the message's repeated field costs a tenth of iterating it.
        containers = request.container_requests
        if len(containers) == 1:
            asked = [list(containers[0].devices_ids)]
            count = len(asked[0])
        else:
            asked = [list(c.devices_ids) for c in containers]
            count = sum(map(len, asked))
        plugin = self.plugin
        answers = response.container_responses
        try:
            self._check_id_count(count)
            for index, ids in enumerate(asked):
                if not ids:
                    answers.add()
                    continue
                try:
                    devices = resolve(plugin, ids)
                except AllocationError as error:
                    raise AllocationError(
                        f"container request {index}: {error}", error.code
                    ) from None
                if self._check_edits:
                    edits = await plugin.allocate(devices)
                    if problem := edits_problem(edits):
                        raise AllocationError(
                            f"{hook(plugin, 'allocate')} {problem}", grpc.StatusCode.INTERNAL
                        )
                    edits_to_wire(edits, answers.add())
                else:
                    self._default_answer(devices, ids, answers.add())
        except AllocationError as error:
            await self._refuse(context, "Allocate", error, started)
        except Exception as error:  # a hook failed: the daemon keeps serving
            log.exception("%s: Allocate hook failed", self.plugin.resource_name)
            await self._refuse(
                context,
                "Allocate",
                AllocationError(f"allocate failed: {error}", grpc.StatusCode.INTERNAL),
                started,
            )
        if observe.heard():  # the message and the fields cost nothing when no one listens
            observe.emit(
                observe.ALLOCATED,
                self.plugin.resource_name,
                "allocated " + "; ".join(show_ids(ids) or "nothing" for ids in asked),
                containers=asked,
                seconds=time.perf_counter() - started,
            )
        return response

    def _default_answer(
        self, devices: Sequence[Device], ids: Sequence[str], into: pb.ContainerAllocateResponse
    ) -> None:
        """What `Plugin.allocate` answers (the devices' merged edits, the IDs in
        `ids_env`), written straight into the response with no ContainerEdits between:
        going through them cost a quarter of an Allocate's handler (callgrind).
        `test_the_served_default_answer_is_what_plugin_allocate_returns` holds the two
        to the same answer."""
        if any_edits(devices):
            edits_to_wire(merge_edits(devices), into)
        if self.plugin.ids_env:
            into.envs[self.plugin.ids_env] = ",".join(ids)

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[
            pb.PreStartContainerRequest, pb.PreStartContainerResponse
        ],
    ) -> pb.PreStartContainerResponse:
        if request is MALFORMED_REQUEST:
            await refuse_malformed(context)
        try:
            self._check_id_count(len(request.devices_ids))
            devices = resolve(self.plugin, list(request.devices_ids), need_healthy=False)
            await self.plugin.pre_start(devices)
        except AllocationError as error:
            await self._refuse(context, "PreStartContainer", error)
        except Exception as error:  # a hook failed: refused like a failed Allocate hook
            log.exception("%s: PreStartContainer hook failed", self.plugin.resource_name)
            await self._refuse(
                context,
                "PreStartContainer",
                AllocationError(f"pre-start failed: {error}", grpc.StatusCode.INTERNAL),
            )
        return pb.PreStartContainerResponse()

    def _check_id_count(self, count: int, at_least: int = 0) -> None:
        limit = self.plugin.limits.max_ids_per_request
        if count > limit and count > at_least:  # on every Allocate: no max()
            limit = max(limit, at_least)
            raise AllocationError(
                f"{count} device IDs in one request, the limit "
                f"(limits.maxIdsPerRequest) is {limit}",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            )

    async def _refuse(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        method: str,
        error: AllocationError,
        started: float | None = None,
    ) -> None:
        observe.emit(
            observe.REFUSED,
            self.plugin.resource_name,
            f"{method} refused ({error.code.name}): {error}",
            logging.WARNING,
            method=method,
            code=error.code.name,
            seconds=None if started is None else time.perf_counter() - started,
        )
        await context.abort(error.code, str(error))
