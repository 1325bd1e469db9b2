"""The extender's reads and writes through the API server (the official client, set up
by devplug.apiserver): Nodes, pods, the ASSIGNED annotation and the Binding; and the
lists and watches its cache follows (devplug.extender.cache). Every call the extender
makes to the API server is here, so the client under it can be changed in one place.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

LIVE = "status.phase!=Succeeded,status.phase!=Failed"  # the pods that hold their shares
KINDS = ("nodes", "pods")


class Expired(Exception):
    """410 Gone: the watch's resource version is too old; list again."""


class Behind(Exception):
    """504 "Too large resource version": the server's watch cache is behind the list."""


class Watch:
    """One open watch: `events()` yields (type, object) until the server ends it;
    `close()` from another thread ends it early."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        from kubernetes.watch.watch import iter_resp_lines

        try:
            for line in iter_resp_lines(self._response):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = str(event.get("type")), event.get("object") or {}
                if kind == "ERROR":
                    _raise_status(obj.get("code"), str(obj.get("message", "")))
                yield kind, obj
        finally:
            self._response.release_conn()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # only means the connection is gone
            self._response.shutdown()


def _raise_status(code: Any, message: str) -> None:
    from kubernetes.client.exceptions import ApiException

    if code == 410:
        raise Expired(message)
    if code == 504:
        raise Behind(message)
    raise ApiException(status=code, reason=message)


class KubeApi:
    """`verbs.Api` over a real API server."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        """ValueError (one line) when no kubeconfig or in-cluster account can be used."""
        from devplug.framework.dra.kube import api_client

        self._api = api_client(kubeconfig, context)

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api)

    def close(self) -> None:
        self._api.close()

    @staticmethod
    def _items(answer: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(answer.data).get("items") or []
        return items

    def nodes(self) -> list[dict[str, Any]]:
        return self._items(self._core().list_node(_preload_content=False))

    def pods(self) -> list[dict[str, Any]]:
        answer = self._core().list_pod_for_all_namespaces(
            field_selector=LIVE,
            _preload_content=False,
        )
        return self._items(answer)

    def _lister(self, kind: str) -> tuple[Any, dict[str, Any]]:
        core = self._core()
        if kind == "nodes":
            return core.list_node, {}
        if kind == "pods":
            return core.list_pod_for_all_namespaces, {"field_selector": LIVE}
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        """Every object of `kind` ("nodes", or "pods" not Succeeded nor Failed) and the
        list's resource version."""
        from kubernetes.client.exceptions import ApiException

        call, selector = self._lister(kind)
        try:
            answer = call(_preload_content=False, **selector)
        except ApiException as error:
            _raise_status(error.status, str(error.reason))
            raise
        document = json.loads(answer.data)
        return document.get("items") or [], str(document["metadata"]["resourceVersion"])

    def watch(self, kind: str, version: str, timeout_s: int) -> Watch:
        """A watch of `kind` from `version` (bookmarks asked for), which the server
        ends after `timeout_s`."""
        from kubernetes.client.exceptions import ApiException

        from devplug.apiserver.backoff import CONNECT_TIMEOUT_S, WATCH_MARGIN_S

        call, selector = self._lister(kind)
        try:
            response = call(
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _request_timeout=(CONNECT_TIMEOUT_S, timeout_s + WATCH_MARGIN_S),
                _preload_content=False,
                **selector,
            )
        except ApiException as error:
            _raise_status(error.status, str(error.reason))
            raise
        return Watch(response)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        answer = self._core().read_namespaced_pod(name, namespace, _preload_content=False)
        pod: dict[str, Any] = json.loads(answer.data)
        return pod

    def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        self._core().patch_namespaced_pod(name, namespace, body, _preload_content=False)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._core().create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
