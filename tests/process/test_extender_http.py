"""`devplug extender` over real HTTP without an API server to read: bad requests
answered 400 in one line, an API server away answered 503 (filter, prioritize) or in
the bind's Error, bad options refused in one line; an API server's 410 and a gateway's
504 told apart, so the cache lists again at once only when it should."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug.apiserver.client import ApiError
from devplug.extender.kubeapi import KubeApi
from devplug.extender.server import ExtenderServer
from devplug.extender.verbs import Extender


def post(url: str, verb: str, body: bytes | Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/{verb}", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def served(short_tmp: Path) -> Iterator[ExtenderServer]:
    """The extender over an API server that refuses connections."""
    from api_servers import closed_port, write_kubeconfig

    kubeconfig = write_kubeconfig(short_tmp / "kc", f"https://127.0.0.1:{closed_port()}")
    api = KubeApi(str(kubeconfig))
    server = ExtenderServer(("127.0.0.1", 0), Extender(api, "fgd"))
    server.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        api.close()


@pytest.mark.parametrize(
    ("verb", "body", "said"),
    [
        ("filter", b"{not json", "/filter: the body is not JSON"),
        ("filter", [], "/filter: the request: expected an object, got list"),
        ("filter", {"Pod": 3}, "/filter: Pod: expected an object, got int"),
        ("prioritize", {"Pod": {}}, "/prioritize: the request has neither Nodes nor NodeNames"),
        ("bind", {"PodName": "x"}, "/bind: PodNamespace: expected a non-empty string, got None"),
        ("nothing", {}, "no such verb '/nothing'"),
    ],
)
def test_bad_requests_get_400_and_one_line(
    served: ExtenderServer, verb: str, body: Any, said: str
) -> None:
    status, text = post(served.url, verb, body)
    assert status == (404 if verb == "nothing" else 400)
    assert text.startswith(said), text
    assert text.count("\n") == 1
    assert "Traceback" not in text


def test_the_command_refuses_a_bad_listen_address_and_an_unknown_policy_in_one_line() -> None:
    for args, said in (
        (["--port", "70000"], "expected a TCP port, 0 to 65535"),
        (["--policy", "random"], "invalid choice: 'random'"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "devplug.cli.main", "extender", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert said in done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_an_api_server_away_is_503_for_filter_and_an_error_for_bind_in_one_line(
    served: ExtenderServer,
) -> None:
    status, text = post(served.url, "filter", {"Pod": {}, "NodeNames": ["a"]})
    assert status == 503
    assert text == "/filter: the API server cannot be reached (connection refused)\n"
    bind = {"PodName": "p", "PodNamespace": "n", "PodUID": "u", "Node": "a"}
    assert post(served.url, "bind", bind) == (
        200,
        {"Error": "the API server cannot be reached (connection refused)"},
    )


def test_shares_without_an_api_server_to_publish_to_refuse_to_start(short_tmp: Path) -> None:
    import os

    from devplug.fakes.gpus import FakeGpuHost
    from tests.controlplane.test_extender_node import config, two_linked_gpus

    host = FakeGpuHost(short_tmp / "gpus", two_linked_gpus())
    path = short_tmp / "config.yaml"
    path.write_text(config(host))
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "serve",
            "--config",
            str(path),
            "--plugin-dir",
            str(short_tmp / "dp"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env | host.env,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("devplug serve: replicaPolicy extender: no kubeconfig")


@pytest.mark.parametrize(("status", "expired"), [(410, True), (504, False)])
def test_a_list_answered_410_lists_again_at_once_and_a_gateways_504_waits_its_backoff(
    short_tmp: Path, status: int, expired: bool
) -> None:
    """A 410 (the version too old) is listed again at once; a 504 that is not the watch
    cache behind ("Too large resource version": a gateway's timeout) is a failure."""
    from api_servers import answering, write_kubeconfig

    from devplug.apiserver import informer

    with answering(status) as server:
        kubeconfig = write_kubeconfig(short_tmp / "kc", f"http://127.0.0.1:{server.port}")
        api = KubeApi(str(kubeconfig))
        try:
            with pytest.raises(ApiError) as raised:
                api.pods()
        finally:
            api.close()
    assert informer.expired(raised.value) == expired
    assert not informer.behind(raised.value)
