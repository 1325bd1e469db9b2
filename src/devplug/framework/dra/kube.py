"""The official `kubernetes` client made from a kubeconfig, for the test kit (its
helpers, the benchmarks); devplug itself talks to API servers through
`devplug.apiserver.client`."""

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
