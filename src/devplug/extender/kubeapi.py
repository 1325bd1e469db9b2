"""The extender's reads and writes through the API server (the official client, set up
by devplug.apiserver): Nodes, pods, the ASSIGNED annotation and the Binding."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


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
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
            _preload_content=False,
        )
        return self._items(answer)

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
