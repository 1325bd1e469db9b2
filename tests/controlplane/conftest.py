"""What the control-plane tier shares: the official client of the test run's API
server, through which tests read what devplug wrote (a client that shares none of
devplug's code); and the fleets a test starts, undone at its end."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug.apiserver.client import KubeApi
from devplug.testing.official import api_client
from tests.fleet_helpers import Fleets


@pytest.fixture(scope="session")
def api(kubeconfig: str) -> Iterator[Any]:
    client = api_client(kubeconfig)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def fleets(kubeconfig: str, tmp_path: Path) -> AsyncIterator[Fleets]:
    """The fleets a test starts, on the loop of the test, stopped and removed at its end."""
    async with (
        KubeApi.from_kubeconfig(kubeconfig) as client,
        contextlib.AsyncExitStack() as stack,
    ):
        yield Fleets(client, tmp_path, stack)
