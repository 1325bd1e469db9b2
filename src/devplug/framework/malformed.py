"""Requests whose bytes are no valid protobuf message get INTERNAL ("malformed
request"), as a Go gRPC server answers them, instead of grpc.aio's UNKNOWN and a
logged traceback per request (a local client could flood the log with those).

The decoder turns such bytes into MALFORMED_REQUEST and each method of the servicer
refuses it first thing (`refuse_malformed`): one identity test per call, where a
coroutine wrapped around every handler cost each Allocate ~4 % of its handler's time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

MALFORMED = "malformed request: the message is no valid protobuf of its type"


class _Malformed:
    """Stands for a request that did not decode; the servicer refuses it."""


MALFORMED_REQUEST: Any = _Malformed()


async def refuse_malformed(context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
    await context.abort(grpc.StatusCode.INTERNAL, MALFORMED)


def _safe(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def safe(data: bytes) -> Any:
        try:
            return decode(data)
        except DecodeError:
            return MALFORMED_REQUEST

    return safe


class _Recorder:
    """Takes what a generated add_*Servicer_to_server function registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers also come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers[service] = handlers


def add_decoding_safely(
    add_to_server: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server
) -> None:
    """`add_to_server(servicer, server)` (a generated function) with every request
    that does not decode handed to `servicer` as MALFORMED_REQUEST, which each of its
    methods must refuse with `refuse_malformed`."""
    recorder = _Recorder()
    add_to_server(servicer, recorder)
    for service, handlers in recorder.handlers.items():
        safe = {}
        for name, handler in handlers.items():
            if handler.request_streaming or handler.request_deserializer is None:
                safe[name] = handler
            else:
                safe[name] = handler._replace(
                    request_deserializer=_safe(handler.request_deserializer)
                )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, safe),))
        server.add_registered_method_handlers(service, safe)
