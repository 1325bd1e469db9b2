"""What the control-plane tier shares: the official client of the test run's API
server, through which tests read what devplug wrote (a client that shares none of
devplug's code)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devplug.testing.official import api_client


@pytest.fixture(scope="session")
def api(kubeconfig: str) -> Iterator[Any]:
    client = api_client(kubeconfig)
    try:
        yield client
    finally:
        client.close()
