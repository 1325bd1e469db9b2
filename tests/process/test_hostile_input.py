"""Hostile and malformed input against a real `devplug serve`: property tests of every
RPC (random IDs, unicode, huge lists, any allocation size) and raw bytes on the
socket (bad HTTP/2 preface, truncated frames, garbage protobuf). Each gets a proper
gRPC status or a closed connection, and the next good request is answered."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from fault_kubelet import grpc_headers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.framework.plugin import default_socket_name

RESOURCE = "hostile.devplug.io/dev"
DEVICES = [f"dev-{i}" for i in range(16)]
MAX_IDS = 64
MAX_BYTES = 256 * 1024
MAX_STREAMS = 3
CONFIG = f"""resources:
  - name: {RESOURCE}
    virtual: {len(DEVICES)}
limits:
  maxIdsPerRequest: {MAX_IDS}
  maxRequestBytes: {MAX_BYTES}
  maxStreams: {MAX_STREAMS}
"""
CALL_TIMEOUT_S = 30.0
PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Every status the daemon may answer a request with; UNKNOWN or a crash is never one.
PROPER = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNIMPLEMENTED,
}


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    socket_path: Path
    stub: pb_grpc.DevicePluginStub

    def still_serving(self) -> None:
        assert self.proc.poll() is None, "the daemon exited"
        answer = self.stub.Allocate(allocate("dev-0"), timeout=CALL_TIMEOUT_S)
        assert answer.container_responses[0].envs["DEVPLUG_HOSTILE_DEVPLUG_IO_DEV"] == "dev-0"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    root = Path(tempfile.mkdtemp(prefix="dp-"))
    (root / "config.yaml").write_text(CONFIG)
    plugin_dir = root / "plugins"
    args = ["serve", "--config", str(root / "config.yaml"), "--plugin-dir", str(plugin_dir)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "devplug.cli.main", *args], stderr=subprocess.DEVNULL
    )
    socket_path = plugin_dir / default_socket_name(RESOURCE)
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        yield Daemon(proc, socket_path, pb_grpc.DevicePluginStub(channel))
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=CALL_TIMEOUT_S)
        shutil.rmtree(root, ignore_errors=True)


def allocate(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


def code_of(call: object) -> grpc.StatusCode:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return, attr-defined]
    return grpc.StatusCode.OK


# IDs: known ones, near misses, unicode, empty, very long.
ids = st.one_of(
    st.sampled_from(DEVICES),
    st.text(max_size=80),
    st.sampled_from(["", "dev-16", "dev-0 ", "DEV-0", "dev-\u0660", "dev-0\x00", "x" * 300]),
)
id_lists = st.lists(ids, max_size=40) | st.lists(st.sampled_from(DEVICES), max_size=100)
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@PROPERTY
@given(containers=st.lists(id_lists, max_size=4))
def test_allocate_any_ids(daemon: Daemon, containers: list[list[str]]) -> None:
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )
    total = sum(len(c) for c in containers)
    size = request.ByteSize()
    answer: list[pb.AllocateResponse] = []
    code = code_of(lambda: answer.append(daemon.stub.Allocate(request, timeout=CALL_TIMEOUT_S)))
    if size > MAX_BYTES or total > MAX_IDS:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    elif all(set(c) <= set(DEVICES) and len(set(c)) == len(c) for c in containers):
        assert code == grpc.StatusCode.OK
        responses = answer[0].container_responses
        assert len(responses) == len(containers)
        for asked, response in zip(containers, responses, strict=True):
            if asked:
                assert response.envs["DEVPLUG_HOSTILE_DEVPLUG_IO_DEV"] == ",".join(asked)
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    daemon.still_serving()


@PROPERTY
@given(available=id_lists, must=st.lists(ids, max_size=6), size=int32)
def test_preferred_allocation_any_request(
    daemon: Daemon, available: list[str], must: list[str], size: int
) -> None:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    known = [i for i in dict.fromkeys(available) if i in DEVICES]
    wanted = list(dict.fromkeys(must))
    answer: list[pb.PreferredAllocationResponse] = []
    code = code_of(
        lambda: answer.append(daemon.stub.GetPreferredAllocation(request, timeout=CALL_TIMEOUT_S))
    )
    if request.ByteSize() > MAX_BYTES or len(available) + len(must) > MAX_IDS:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    elif not set(wanted) <= set(known) or not len(wanted) <= size <= len(known):
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert code == grpc.StatusCode.OK
        picked = list(answer[0].container_responses[0].deviceIDs)
        assert len(picked) == size
        assert set(wanted) <= set(picked) <= set(known)
    daemon.still_serving()


@PROPERTY
@given(devices=id_lists)
def test_pre_start_any_ids(daemon: Daemon, devices: list[str]) -> None:
    request = pb.PreStartContainerRequest(devices_ids=devices)
    code = code_of(lambda: daemon.stub.PreStartContainer(request, timeout=CALL_TIMEOUT_S))
    if request.ByteSize() > MAX_BYTES or len(devices) > MAX_IDS:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    elif set(devices) <= set(DEVICES) and len(set(devices)) == len(devices):
        assert code == grpc.StatusCode.OK
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    daemon.still_serving()


def test_options_and_list_and_watch_with_a_stream_limit(daemon: Daemon) -> None:
    options = daemon.stub.GetDevicePluginOptions(pb.Empty(), timeout=CALL_TIMEOUT_S)
    assert options.get_preferred_allocation_available
    streams = [daemon.stub.ListAndWatch(pb.Empty()) for _ in range(MAX_STREAMS)]
    try:
        for stream in streams:
            assert [d.ID for d in next(stream).devices] == DEVICES
        extra = daemon.stub.ListAndWatch(pb.Empty())
        with pytest.raises(grpc.RpcError) as refused:
            next(extra)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.maxStreams" in (refused.value.details() or "")
    finally:
        for stream in streams:
            stream.cancel()
    daemon.still_serving()


def test_oversized_request_is_refused(daemon: Daemon) -> None:
    request = allocate("x" * (MAX_BYTES + 1))
    assert code_of(lambda: daemon.stub.Allocate(request, timeout=30)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    daemon.still_serving()


# -- raw bytes on the socket ----------------------------------------------------------------


def exchange(socket_path: Path, data: bytes) -> bytes:
    """Send `data`, close our writing side, read until the daemon closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CALL_TIMEOUT_S)  # a safety net; the daemon closes long before
        sock.connect(os.fspath(socket_path))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return b""  # closed on us mid-send: also a proper answer
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@PROPERTY
@given(data=st.binary(max_size=2048))
def test_garbage_instead_of_http2(daemon: Daemon, data: bytes) -> None:
    exchange(daemon.socket_path, data)
    daemon.still_serving()


@PROPERTY
@given(frames=st.binary(min_size=1, max_size=2048), cut=st.integers(min_value=0, max_value=9))
def test_truncated_and_random_frames_after_a_good_preface(
    daemon: Daemon, frames: bytes, cut: int
) -> None:
    # A settings frame cut short, then random frame bytes.
    settings_frame = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    exchange(daemon.socket_path, PREFACE + settings_frame[:cut] + frames)
    daemon.still_serving()


def grpc_call(socket_path: Path, path: str, body: bytes) -> str | None:
    """One raw HTTP/2 request carrying `body` as its message bytes; the grpc-status
    the daemon answered ("0" once a message comes back), or None when it reset the
    stream or closed the connection instead."""
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, grpc_headers(path))
    conn.send_data(stream, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CALL_TIMEOUT_S)
        sock.connect(os.fspath(socket_path))
        sock.sendall(conn.data_to_send())
        while chunk := sock.recv(65536):
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.DataReceived):
                    return "0"  # a message answered (ListAndWatch stays open after)
                if isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                    return None
                if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    headers = {bytes(k).decode(): bytes(v).decode() for k, v in event.headers}
                    if "grpc-status" in headers:
                        return headers["grpc-status"]
            sock.sendall(conn.data_to_send())
    return None


METHODS = [
    "/v1beta1.DevicePlugin/Allocate",
    "/v1beta1.DevicePlugin/GetPreferredAllocation",
    "/v1beta1.DevicePlugin/PreStartContainer",
    "/v1beta1.DevicePlugin/GetDevicePluginOptions",
    "/v1beta1.DevicePlugin/ListAndWatch",
    "/v1beta1.DevicePlugin/NoSuchMethod",
]


@PROPERTY
@given(method=st.sampled_from(METHODS), body=st.binary(max_size=512))
def test_garbage_protobuf(daemon: Daemon, method: str, body: bytes) -> None:
    status = grpc_call(daemon.socket_path, method, body)
    if status is not None:
        assert grpc.StatusCode(_code(int(status))) in PROPER | {grpc.StatusCode.CANCELLED}
    daemon.still_serving()


def _code(number: int) -> tuple[int, str]:
    return next(c.value for c in grpc.StatusCode if c.value[0] == number)


def test_undecodable_request_gets_internal(daemon: Daemon) -> None:
    # 0x0a announces field 1 (length-delimited) and then the bytes end: no message.
    status = grpc_call(daemon.socket_path, "/v1beta1.DevicePlugin/Allocate", b"\x0a")
    assert status == str(grpc.StatusCode.INTERNAL.value[0])
    daemon.still_serving()
