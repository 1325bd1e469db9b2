"""devplug's asyncio client of the Kubernetes API: the one way to talk to an API server.

The kubeconfig is read by devplug's one reader (`devplug.apiserver.kubeconfig`: the
context, TLS, a token from the file, a token file or a command, the in-cluster service
account); requests go through one aiohttp session (the HTTP library the official
asyncio client is built on) with bodies encoded and decoded by msgspec, without the
generated models. `make bench` (`kubeclient`) measures it beside the official client
(blocking in threads, and asyncio), kubernetes_asyncio and lightkube on the fleet's
call mix: it spends the least CPU per call and the least memory in a daemon, which is
why it is the one stack (the numbers are in bench/kubeclient.py and docs/architecture.md).

A call that cannot reach the API server raises `Unavailable`; one that cannot succeed
until someone changes something (the server's certificate not trusted) raises
`failures.Permanent`; an answer that is an error raises `ApiError` with the server's
status and message (401 only after the token was read again once). `retrying` repeats
a call with jittered backoff while the failure is transient: until the server is back,
or for `patience` seconds at most where a command must end.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import msgspec

from devplug.apiserver import backoff as timeouts
from devplug.apiserver import failures
from devplug.apiserver.backoff import Backoff, Deadline
from devplug.apiserver.kubeconfig import Target

log = logging.getLogger("devplug.apiserver.client")

# What a command that needs the client says when aiohttp is missing (the extra to install).
EXTRA = "fleet"
FEATURE = "a fleet on an API server (fleet up/down, plan --kubeconfig)"

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply (a JSON body is YAML)
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0
_T = TypeVar("_T")
# How long `retrying` waits out a transient failure (None: until the server is back).
_patience: contextvars.ContextVar[float | None] = contextvars.ContextVar("patience", default=None)


@contextlib.contextmanager
def patience(seconds: float | None) -> Iterator[None]:
    """`retrying` in this context (and tasks started from it) gives up after a
    transient failure lasted `seconds`: a command that must end, not a service."""
    token = _patience.set(seconds)
    try:
        yield
    finally:
        _patience.reset(token)


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Unavailable(Exception):
    """The API server could not be reached (refused, reset, timed out)."""


class GaveUp(Exception):
    """A transient failure lasted longer than the command's patience."""


class KubeApi:
    """One session to one API server; `concurrency` requests in flight at most."""

    def __init__(self, target: Target, *, concurrency: int = 32) -> None:
        self.target = target
        self.host: str = target.server
        self._ssl: Any = target.ssl_context() if target.server.startswith("https:") else False
        self._headers = {"Accept": JSON}
        # The name the server's certificate must carry, where it is not the URL's host.
        self._sni = {"server_hostname": target.tls_server_name} if target.tls_server_name else {}
        self.concurrency = concurrency
        self._session: Any = None
        self.calls = 0

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | None,
        context: str | None = None,
        *,
        extra: str = EXTRA,
        feature: str = FEATURE,
        **kwargs: Any,
    ) -> KubeApi:
        """ValueError with a one-line reason when the kubeconfig cannot be used;
        MissingExtra naming `extra` (for `feature`) when aiohttp is not there."""
        from devplug.apiserver.kubeconfig import load
        from devplug.ground.extras import require
        from devplug.ground.lazy import allow_ssl

        allow_ssl()  # `devplug serve` keeps ssl out until a feature needs the API server
        require("aiohttp", extra, feature)
        return cls(load(kubeconfig, context), **kwargs)

    async def _authorization(self) -> dict[str, str]:
        """The Authorization header now; a token to be read again (a command's, a
        file's) is read in a thread, not on the event loop."""
        credentials = self.target.credentials
        if credentials.fresh():
            value = credentials.authorization()
        else:
            value = await asyncio.to_thread(credentials.authorization)
        return {} if value is None else {"Authorization": value}

    async def __aenter__(self) -> KubeApi:
        import aiohttp

        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self.concurrency)
        self._session = aiohttp.ClientSession(
            base_url=self.host,
            connector=connector,
            headers=self._headers,
            read_bufsize=2**21,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.CONNECT_TIMEOUT_S),
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
        timeout: float | None = None,
    ) -> Any:
        """One request (`timeout`: the read timeout of the API server's); the decoded
        answer (None for an empty one)."""
        timeout = timeouts.READ_TIMEOUT_S if timeout is None else timeout
        data = None if body is None else msgspec.json.encode(body)
        status, raw = await self._request(method, path, data, params, content_type, timeout)
        if status == 401 and await asyncio.to_thread(self.target.credentials.refresh):
            status, raw = await self._request(method, path, data, params, content_type, timeout)
        if status >= 400:
            raise _error(status, raw)
        return msgspec.json.decode(raw) if raw else None

    async def _request(
        self,
        method: str,
        path: str,
        data: bytes | None,
        params: Mapping[str, str] | None,
        content_type: str,
        timeout: float,
    ) -> tuple[int, bytes]:
        import aiohttp

        headers = await self._authorization()
        if data is not None:
            headers["Content-Type"] = content_type
        self.calls += 1
        try:
            async with self._session.request(
                method,
                path,
                data=data,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                **self._sni,
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise _unreachable(f"{method} {self.host}{path}", error) from None

    async def watch(
        self, path: str, params: Mapping[str, str], timeout: float
    ) -> AsyncIterator[bytes]:
        """The raw JSON lines of a watch (each one event), until the server ends it."""
        import aiohttp

        query = {**params, "watch": "true", "timeoutSeconds": str(int(timeout))}
        for attempt in range(2):
            headers = await self._authorization()
            try:
                async with self._session.get(
                    path,
                    params=query,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout + timeouts.WATCH_MARGIN_S),
                    **self._sni,
                ) as response:
                    if (
                        response.status == 401
                        and attempt == 0
                        and await asyncio.to_thread(self.target.credentials.refresh)
                    ):
                        continue
                    if response.status >= 400:
                        raise _error(response.status, await response.read())
                    async for line in response.content:
                        if line.strip():
                            yield line
                    return
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                raise _unreachable(f"watch {self.host}{path}", error) from None


def _unreachable(what: str, error: BaseException) -> Exception:
    """Unavailable, or Permanent where waiting cannot help (the certificate)."""
    if failures.kind(error) == failures.PERMANENT:
        return failures.Permanent(f"{what}: {failures.say(error)}")
    return Unavailable(f"{what}: {failures.reason(error)}")


def _error(status: int, raw: bytes) -> ApiError:
    try:
        answer = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return ApiError(status, raw.decode(errors="replace")[:200])
    if not isinstance(answer, dict):
        return ApiError(status, str(answer)[:200])
    return ApiError(status, str(answer.get("message", "")), str(answer.get("reason", "")))


FAILURES = (ApiError, Unavailable, GaveUp, failures.Permanent)


def explain(error: BaseException) -> str:
    """One line for a command that failed on the API server (one of FAILURES)."""
    if isinstance(error, Unavailable):  # "what: why": said as `say` says it, after what
        return f"{str(error).rpartition(': ')[0]}: {say(error)}"
    if isinstance(error, ApiError):
        return failures.say(error)
    return str(error)


def say(error: BaseException) -> str:
    """One line of what went wrong, for a caller that names what it was doing: why the
    API server could not be reached, or what it answered (failures.say)."""
    if isinstance(error, Unavailable):  # "what: why": the why is the problem
        return f"the API server cannot be reached ({str(error).rpartition(': ')[2]})"
    return failures.say(error)


def retriable(error: Exception) -> bool:
    """Worth trying again: the server is away, overloaded or had an internal error."""
    return failures.transient(error)


async def retrying(
    what: str, call: Callable[[], Awaitable[_T]], *, stop: asyncio.Event | None = None
) -> _T:
    """`call()` until it succeeds or fails for good; a server that is away or overloaded
    is waited for with jittered backoff (said once per outage), however long it takes,
    or, within `patience(seconds)`, that long at most, the attempts included (GaveUp)."""
    backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
    seconds = _patience.get()
    deadline = Deadline(seconds)
    told = False
    last: ApiError | Unavailable | None = None
    while True:
        left = deadline.left()
        try:
            if left is None:
                result = await call()
            else:
                result = await asyncio.wait_for(call(), left)
        except TimeoutError:  # the attempt itself outlasted the patience
            raise _gave_up(what, last, seconds) from None
        except (ApiError, Unavailable) as error:
            if not retriable(error) or (stop is not None and stop.is_set()):
                raise
            last = error
            if deadline.passed():
                raise _gave_up(what, last, seconds) from None
            if not told:
                # A command that ends says why when it gives up: until then, info.
                level = logging.WARNING if seconds is None else logging.INFO
                log.log(level, "%s: %s; retrying until the API server answers", what, error)
                told = True
            wait = backoff.next()
            left = deadline.left()
            await asyncio.sleep(wait if left is None else min(wait, left))
            if deadline.passed():
                raise _gave_up(what, last, seconds) from None
            continue
        if told:
            log.info("%s: done after the API server came back", what)
        return result


def _gave_up(what: str, last: ApiError | Unavailable | None, seconds: float | None) -> GaveUp:
    """The one line of a wait that ended: the last failure seen, and for how long."""
    if last is None:
        return GaveUp(f"{what}: no answer from the API server within {seconds:g} s")
    if isinstance(last, Unavailable):
        return GaveUp(f"{explain(last)}, for {seconds:g} s")
    return GaveUp(f"{what}: {failures.say(last)}, for {seconds:g} s")
