"""Requests whose bytes are no valid protobuf message get INTERNAL ("malformed
request"), as a Go gRPC server answers them, instead of grpc.aio's UNKNOWN and a
logged traceback per request (a local client could flood the log with those)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

MALFORMED = "malformed request: the message is no valid protobuf of its type"


class _Malformed:
    """Stands for a request that did not decode; the handler refuses it."""


_BAD = _Malformed()


def _safe(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def safe(data: bytes) -> Any:
        try:
            return decode(data)
        except DecodeError:
            return _BAD

    return safe


def _unary(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if request is _BAD:
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED)
        return await behavior(request, context)

    return guarded


def _streaming(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    async def guarded(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        if request is _BAD:
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED)
        async for item in behavior(request, context):
            yield item

    return guarded


class _Recorder:
    """Takes what a generated add_*Servicer_to_server function registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers also come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers[service] = handlers


def add_guarded(
    add_to_server: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server
) -> None:
    """`add_to_server(servicer, server)` (a generated function) with every unary
    request decoded safely."""
    recorder = _Recorder()
    add_to_server(servicer, recorder)
    for service, handlers in recorder.handlers.items():
        guarded = {}
        for name, handler in handlers.items():
            if handler.request_streaming or handler.request_deserializer is None:
                guarded[name] = handler
            elif handler.response_streaming:
                guarded[name] = handler._replace(
                    request_deserializer=_safe(handler.request_deserializer),
                    unary_stream=_streaming(handler.unary_stream),
                )
            else:
                guarded[name] = handler._replace(
                    request_deserializer=_safe(handler.request_deserializer),
                    unary_unary=_unary(handler.unary_unary),
                )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, guarded),))
        server.add_registered_method_handlers(service, guarded)
