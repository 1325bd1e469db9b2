"""The Kubernetes API client of the DRA driver: the `kubernetes` package, imported
only here and only when a resource is served through DRA."""

from __future__ import annotations

import os
from typing import Any


def api_client(kubeconfig: str | None = None) -> Any:
    """A client for `kubeconfig` (or $KUBECONFIG), else the in-cluster service account."""
    from kubernetes import client, config

    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration
        )
        return client.ApiClient(configuration)
    configuration = client.Configuration()
    config.load_incluster_config(  # type: ignore[no-untyped-call]
        client_configuration=configuration
    )
    return client.ApiClient(configuration)
