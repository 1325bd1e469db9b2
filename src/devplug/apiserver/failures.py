"""What a failure to talk to the API server means, for either client (the fleet's
aiohttp one, the official `kubernetes` one).

- permanent: trying again cannot help until someone changes something: the server's
  certificate is not trusted, the credentials are refused (401), the user may not do
  it (403), the server speaks no TLS;
- transient: the server is away or overloaded (refused, reset, timed out, 429, 5xx),
  worth waiting for;
- an answer: any other status (404, 409, 422...), for the caller to handle.

`say(error)` is the one line that tells an operator which, and what to look at.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

PERMANENT = "permanent"
TRANSIENT = "transient"
ANSWER = "answer"

_LINKS = ("__cause__", "__context__", "reason", "os_error", "certificate_error")
_VERIFY = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed")


class Permanent(Exception):
    """A failure that waiting does not cure (raised by devplug's own clients)."""


def chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and the errors it was caused by (exception chaining, urllib3's
    `reason`, aiohttp's `os_error` and `certificate_error`), each once."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        one = todo.pop(0)
        if id(one) in seen:
            continue
        seen.add(id(one))
        yield one
        for name in _LINKS:
            linked = getattr(one, name, None)
            if isinstance(linked, BaseException):
                todo.append(linked)
        todo.extend(a for a in getattr(one, "args", ()) if isinstance(a, BaseException))


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an answer that was an error (either client's exception)."""
    status = getattr(error, "status", None)
    return status if isinstance(status, int) and status >= 100 else None


def tls_problem(error: BaseException) -> str | None:
    """Why TLS with the server failed for good, or None (no TLS failure, or a
    connection dropped during the handshake, which is transient)."""
    ssl = sys.modules.get("ssl")  # not loaded: no TLS was tried
    for one in chain(error):
        detail = getattr(one, "verify_message", None)  # ssl's own, deepest in the chain
        if isinstance(detail, str) and detail:
            return f"the API server's certificate is not trusted ({detail})"
    for one in chain(error):
        text = str(getattr(one, "reason", "") or one)
        if any(marker in text for marker in _VERIFY):
            return f"the API server's certificate is not trusted ({_first_line(text)})"
        if ssl is not None and isinstance(one, ssl.SSLError):
            if isinstance(one, ssl.SSLEOFError | ssl.SSLZeroReturnError):
                return None
            return f"TLS with the API server failed ({_first_line(text)})"
    return None


def kind(error: BaseException) -> str:
    """PERMANENT, TRANSIENT or ANSWER (see the module's docstring)."""
    if isinstance(error, Permanent) or tls_problem(error) is not None:
        return PERMANENT
    status = status_of(error)
    if status is None:
        return TRANSIENT  # no answer at all: refused, reset, timed out, dropped
    if status in (401, 403):
        return PERMANENT
    if status == 429 or status >= 500:
        return TRANSIENT
    return ANSWER


def transient(error: BaseException) -> bool:
    return kind(error) == TRANSIENT


def say(error: BaseException) -> str:
    """One line: what went wrong and, for a permanent failure, what to look at."""
    if isinstance(error, Permanent):
        return str(error)
    tls = tls_problem(error)
    if tls is not None:
        return f"{tls}: check the kubeconfig's certificate-authority and server"
    status = status_of(error)
    if status is None:
        return f"the API server cannot be reached ({reason(error)})"
    message = _message(error)
    if status == 401:
        return (
            "the API server refused the credentials (401 Unauthorized): the kubeconfig's "
            "token or client certificate is wrong or expired"
        )
    if status == 403:
        return f"not allowed by the API server (403 Forbidden): {message}"
    if status == 429:
        return f"the API server is overloaded (429 Too Many Requests): {message}"
    phrase = getattr(error, "reason", None)
    answered = f"{status} {phrase}" if isinstance(phrase, str) and phrase else str(status)
    return answered if message in ("", phrase) else f"{answered}: {message}"


def reason(error: BaseException) -> str:
    """Why no answer came, in a few words: 'connection refused', 'timed out'..."""
    import errno as errnos
    import os

    for one in chain(error):
        if isinstance(one, TimeoutError) or type(one).__name__.endswith("TimeoutError"):
            return "timed out"
        number = getattr(one, "errno", None)
        if isinstance(one, OSError) and isinstance(number, int) and number in errnos.errorcode:
            return os.strerror(number).lower()
    return _message(error)


def _message(error: BaseException) -> str:
    for name in ("message", "reason"):
        text = getattr(error, name, None)
        if isinstance(text, str) and text.strip():
            return _first_line(text)
    text = str(error) or type(error).__name__
    return _first_line(text)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1 if lines and lines[0] in ("SSLError", "MaxRetryError") else 0] if lines else ""
