"""The Kubernetes API client of the DRA driver: the `kubernetes` package, imported
only here and only when a resource is served through DRA."""

from __future__ import annotations

from typing import Any


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A client for `kubeconfig` (or $KUBECONFIG) at `context`, else the in-cluster
    service account; ValueError with a one-line reason when neither can be used."""
    from devplug.apiserver import kubeconfig as kubeconfigs
    from devplug.apiserver.official import api_client as official
    from devplug.apiserver.official import need_client

    need_client()
    return official(kubeconfigs.load(kubeconfig, context))


def configuration(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """The `kubernetes` client's Configuration (server, TLS, credentials) for
    `kubeconfig` (or $KUBECONFIG) at `context`, else the in-cluster service account;
    ValueError with a one-line reason when neither can be used."""
    from devplug.apiserver import kubeconfig as kubeconfigs
    from devplug.apiserver.official import configuration as official
    from devplug.apiserver.official import need_client

    need_client()
    return official(kubeconfigs.load(kubeconfig, context))


def node_labels(api: Any, node: str) -> dict[str, str]:
    """The labels of Node `node` (blocking; nodeModeLabel, the NVIDIA config's node
    label); the client's errors are raised."""
    import json

    from kubernetes import client

    core: Any = client.CoreV1Api(api)  # read as JSON, not as models
    answer = core.read_node(node, _preload_content=False)
    labels = (json.loads(answer.data).get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}
