"""The Kubernetes API client of the DRA driver: the `kubernetes` package, imported
only here and only when a resource is served through DRA."""

from __future__ import annotations

import logging
import os
from typing import Any


def api_client(kubeconfig: str | None = None) -> Any:
    """A client for `kubeconfig` (or $KUBECONFIG), else the in-cluster service account;
    ValueError with a one-line reason when neither can be used."""
    settings = configuration(kubeconfig)  # first: it lets the ssl module in
    from kubernetes import client

    return client.ApiClient(settings)


def configuration(kubeconfig: str | None = None) -> Any:
    """The `kubernetes` client's Configuration (server, TLS, credentials) for
    `kubeconfig` (or $KUBECONFIG), else the in-cluster service account; ValueError
    with a one-line reason when neither can be used."""
    from devplug.lazy import allow_ssl

    allow_ssl()  # `devplug serve` keeps ssl out until a resource needs the API server
    from devplug.extras import require

    require("kubernetes", "dra", "the Kubernetes API (DRA, --kubeconfig)")
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    # urllib3 logs each of its retries; the driver logs the failure once, with its own
    # retry, so only urllib3's errors remain worth a line.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)

    path = kubeconfig or os.environ.get("KUBECONFIG")
    settings = client.Configuration()
    if path:
        _check_kubeconfigs(path)
    try:
        if path:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=settings
            )
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=settings
            )
    except (ConfigException, OSError, TypeError, AttributeError, KeyError) as error:
        # (the client's own errors for a mapping of the wrong shapes)
        where = f"kubeconfig {path}" if path else "in-cluster config (no --kubeconfig)"
        raise ValueError(f"cannot use the {where}: {error}") from None
    return settings


def _check_kubeconfigs(path: str) -> None:
    """Each file of a kubeconfig path read through devplug.inputs (size, nesting, YAML
    aliases) before the client parses it; ValueError with one line."""
    from devplug import inputs

    for file in filter(None, path.split(os.pathsep)):
        if not os.path.exists(file):
            continue  # the client names a missing file
        try:
            data = inputs.load_yaml(inputs.read_text(file, what="the kubeconfig"), file)
        except inputs.InputError as error:
            raise ValueError(f"cannot use the kubeconfig {error.name}: {error.problem}") from None
        if data is not None and not isinstance(data, dict):
            raise ValueError(
                f"cannot use the kubeconfig {file}: expected a mapping of clusters, users "
                "and contexts"
            )


def node_labels(api: Any, node: str) -> dict[str, str]:
    """The labels of Node `node` (blocking; nodeModeLabel, the NVIDIA config's node
    label); the client's errors are raised."""
    import json

    from kubernetes import client

    core: Any = client.CoreV1Api(api)  # read as JSON, not as models
    answer = core.read_node(node, _preload_content=False, _request_timeout=30)
    labels = (json.loads(answer.data).get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}
