"""The official `kubernetes` client made from a kubeconfig, for the test kit: tests and
benchmarks read what devplug wrote through a client that is not devplug's own (which
is `devplug.apiserver.client`), a witness that shares none of its code.

Every request gets a connect and read timeout unless the caller gave one (a watch
gives its own); its bearer token comes from the target's credentials on each request
(so a token from a file or a command stays current), and a request refused with 401
is sent once more with a token read again before the refusal counts.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from devplug.apiserver import backoff
from devplug.apiserver import kubeconfig as kubeconfigs
from devplug.apiserver.credentials import Credentials
from devplug.apiserver.kubeconfig import Target


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A client for `kubeconfig` (or $KUBECONFIG) at `context`, else the in-cluster
    service account; ValueError with a one-line reason when neither can be used."""
    need_client()
    return client_for(kubeconfigs.load(kubeconfig, context))


def configuration(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """The client's Configuration (server, TLS, credentials) for `kubeconfig` (or
    $KUBECONFIG) at `context`, else the in-cluster service account."""
    need_client()
    return configuration_for(kubeconfigs.load(kubeconfig, context))


def need_client() -> None:
    """MissingExtra naming the extra when the `kubernetes` package is not installed
    (checked before the kubeconfig is read: the missing package is the first thing to
    fix)."""
    from devplug.ground.lazy import allow_ssl

    allow_ssl()  # `devplug serve` keeps ssl out until a resource needs the API server
    from devplug.ground.extras import require

    require("kubernetes", "envtest", "the test kit's official Kubernetes client")


def configuration_for(target: Target) -> Any:
    """The client's Configuration for `target`."""
    need_client()
    from kubernetes import client

    # urllib3 logs each of its retries; devplug logs the failure once, with its own
    # retry, so only urllib3's errors remain worth a line.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)

    settings = client.Configuration()
    settings.host = target.server
    ca, cert, key = target.files()
    settings.ssl_ca_cert = ca
    settings.cert_file = cert
    settings.key_file = key
    settings.verify_ssl = not target.insecure
    if target.tls_server_name:
        settings.tls_server_name = target.tls_server_name
    from urllib3.util.retry import Retry

    # Once more after a failed connect (a connection found closed); never again after
    # a request was sent: devplug's own retries decide that, with jitter.
    settings.retries = Retry(total=1, connect=1, read=0, status=0, redirect=0)
    credentials = target.credentials
    if type(credentials) is Credentials:
        return settings  # a client certificate, or anonymous: no header

    def refresh(config: Any) -> None:
        config.api_key["authorization"] = credentials.authorization()

    settings.api_key = {"authorization": ""}  # set before each request by the hook
    settings.refresh_api_key_hook = refresh  # type: ignore[assignment]
    return settings


def client_for(target: Target) -> Any:
    """An ApiClient for `target` with the timeouts and the 401 refresh."""
    from kubernetes import client
    from kubernetes.client import rest

    settings = configuration_for(target)
    api = client.ApiClient(settings)
    api.rest_client = _rest_class(rest.RESTClientObject)(settings, target)
    return api


def _read_timeout(url: str, params: Any = None) -> float | None:
    """How long an answer may keep silent: READ_TIMEOUT_S, but a watch's length and
    WATCH_MARGIN_S for a watch (it is silent while nothing changes), and no limit for
    a watch of the server's own length (the server ends it)."""
    from urllib.parse import parse_qs, urlsplit

    query = parse_qs(urlsplit(url).query)
    for key, value in params or ():  # the older client passes them apart
        query.setdefault(str(key), []).append(str(value).lower())
    if query.get("watch", [""])[0].lower() not in ("true", "1"):
        return backoff.READ_TIMEOUT_S
    length = query.get("timeoutSeconds", [""])[0]
    return float(length) + backoff.WATCH_MARGIN_S if length.isdigit() else None


_classes: dict[type, type] = {}


def _rest_class(base: type) -> type:
    """RESTClientObject with default timeouts and one retry after a 401."""
    if base in _classes:
        return _classes[base]

    class TimedRest(base):  # type: ignore[misc]
        def __init__(self, settings: Any, target: Target) -> None:
            super().__init__(settings)
            self._target = target

        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_request_timeout") is None:
                kwargs["_request_timeout"] = (
                    backoff.CONNECT_TIMEOUT_S,
                    _read_timeout(url, kwargs.get("query_params")),
                )
            try:
                response = super().request(method, url, *args, **kwargs)
            except Exception as error:
                if getattr(error, "status", None) != 401 or not self._retry_401(kwargs):
                    raise
                return super().request(method, url, *args, **kwargs)
            if getattr(response, "status", None) == 401 and self._retry_401(kwargs):
                raw = getattr(response, "response", response)  # not read yet: let it go
                with contextlib.suppress(Exception):
                    raw.drain_conn()
                return super().request(method, url, *args, **kwargs)
            return response

        def _retry_401(self, kwargs: dict[str, Any]) -> bool:
            """Read the token again; whether the request is worth sending again."""
            credentials = self._target.credentials
            if not credentials.refresh():
                return False
            headers = kwargs.get("headers")
            value = credentials.authorization()
            if isinstance(headers, dict) and value is not None:
                for name in list(headers):
                    if name.lower() == "authorization":
                        del headers[name]
                headers["authorization"] = value
            return True

    _classes[base] = TimedRest
    return TimedRest
