"""A lean asyncio client of the Kubernetes API for a whole fleet in one process.

The kubeconfig is read by the official `kubernetes` package (server, TLS, token or
client certificate, in-cluster service account); requests go through one aiohttp
session (the HTTP library the official asyncio client is built on) with bodies
encoded and decoded by msgspec, without the generated models. `make bench` measures
this path beside the official asyncio client on the same calls (`fleet.client`).

A call that cannot reach the API server raises `Unavailable`; an answer that is an
error raises `ApiError` with the server's status and message. `retrying` repeats a
call with backoff until the server is back, for writes that must not be lost.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec

log = logging.getLogger("devplug.fleet.kube")

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0
_T = TypeVar("_T")


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Unavailable(Exception):
    """The API server could not be reached (refused, reset, timed out)."""


class KubeApi:
    """One session to one API server; `concurrency` requests in flight at most."""

    def __init__(self, settings: Any, *, concurrency: int = 32) -> None:
        self.host: str = settings.host
        context = ssl.create_default_context(cafile=settings.ssl_ca_cert)
        if settings.cert_file:
            context.load_cert_chain(settings.cert_file, keyfile=settings.key_file)
        if not settings.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self._ssl = context
        self._headers = {"Accept": JSON}
        token = settings.auth_settings().get("BearerToken")
        if token and token.get("value"):
            self._headers["Authorization"] = token["value"]
        self.concurrency = concurrency
        self._session: Any = None
        self.calls = 0

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **kwargs: Any) -> KubeApi:
        """ValueError with a one-line reason when the kubeconfig cannot be used;
        MissingExtra naming the `fleet` extra when its client libraries are not there."""
        from devplug.extras import require
        from devplug.framework.dra.kube import configuration

        for module in ("kubernetes", "aiohttp"):
            require(module, "fleet", "a fleet on an API server (fleet up/down, plan --kubeconfig)")

        return cls(configuration(kubeconfig), **kwargs)

    async def __aenter__(self) -> KubeApi:
        import aiohttp

        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self.concurrency)
        self._session = aiohttp.ClientSession(
            base_url=self.host,
            connector=connector,
            headers=self._headers,
            read_bufsize=2**21,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = JSON,
        timeout: float = 30.0,
    ) -> Any:
        """One request; the decoded answer (None for an empty one)."""
        import aiohttp

        data = None if body is None else msgspec.json.encode(body)
        headers = {"Content-Type": content_type} if data is not None else None
        self.calls += 1
        try:
            async with self._session.request(
                method,
                path,
                data=data,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise Unavailable(f"{method} {path}: {type(error).__name__}: {error}") from None
        if status >= 400:
            raise _error(status, raw)
        return msgspec.json.decode(raw) if raw else None

    async def watch(
        self, path: str, params: Mapping[str, str], timeout: float
    ) -> AsyncIterator[bytes]:
        """The raw JSON lines of a watch (each one event), until the server ends it."""
        import aiohttp

        query = {**params, "watch": "true", "timeoutSeconds": str(int(timeout))}
        try:
            async with self._session.get(
                path, params=query, timeout=aiohttp.ClientTimeout(total=timeout + 30)
            ) as response:
                if response.status >= 400:
                    raise _error(response.status, await response.read())
                async for line in response.content:
                    if line.strip():
                        yield line
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise Unavailable(f"watch {path}: {type(error).__name__}: {error}") from None


def _error(status: int, raw: bytes) -> ApiError:
    try:
        answer = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return ApiError(status, raw.decode(errors="replace")[:200])
    if not isinstance(answer, dict):
        return ApiError(status, str(answer)[:200])
    return ApiError(status, str(answer.get("message", "")), str(answer.get("reason", "")))


def retriable(error: Exception) -> bool:
    """Worth trying again: the server is away, overloaded or had an internal error."""
    if isinstance(error, Unavailable):
        return True
    return isinstance(error, ApiError) and (error.status == 429 or error.status >= 500)


async def retrying(
    what: str, call: Callable[[], Awaitable[_T]], *, stop: asyncio.Event | None = None
) -> _T:
    """`call()` until it succeeds or fails for good; a server that is away or overloaded
    is waited for with backoff (logged once per outage), however long it takes."""
    delay = RETRY_FIRST_S
    told = False
    while True:
        try:
            result = await call()
        except (ApiError, Unavailable) as error:
            if not retriable(error) or (stop is not None and stop.is_set()):
                raise
            if not told:
                log.warning("%s: %s; retrying until the API server answers", what, error)
                told = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        if told:
            log.info("%s: done after the API server came back", what)
        return result
