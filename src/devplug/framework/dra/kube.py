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
    try:
        if path:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=settings
            )
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=settings
            )
    except (ConfigException, OSError) as error:
        where = f"kubeconfig {path}" if path else "in-cluster config (no --kubeconfig)"
        raise ValueError(f"cannot use the {where}: {error}") from None
    return settings
