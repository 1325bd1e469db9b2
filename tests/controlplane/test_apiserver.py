"""Talking to the API server: every way of not getting an answer is told apart and
said in one line, by both clients (the fleet's aiohttp one, the official one); tokens
from a command are read again at expiry and after a 401; the kubeconfig's context is
chosen; waits between attempts are jittered and made by one helper.

The misbehaving servers are small local ones (tests/api_servers.py); the exec
credential plugin and the context run against the real kube-apiserver of the
`kubeconfig` fixture.
"""

from __future__ import annotations

import ast
import asyncio
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_servers import (
    answering,
    closed_port,
    exec_plugin,
    exec_user,
    runs,
    self_signed,
    silent_port,
    write_kubeconfig,
)

from devplug.apiserver import backoff, failures
from devplug.apiserver.backoff import Backoff
from devplug.apiserver.client import KubeApi
from devplug.apiserver.kubeconfig import load

SRC = Path(__file__).resolve().parents[2] / "src" / "devplug"


@pytest.fixture
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connect and read timeouts of a second: a silent server costs a second or two."""
    monkeypatch.setattr(backoff, "CONNECT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(backoff, "READ_TIMEOUT_S", 1.0)


@contextmanager
def server_of(kind: str, folder: Path) -> Iterator[str]:
    """The URL of a server that fails in the way `kind` says."""
    if kind == "untrusted":
        with answering(200, tls=self_signed(folder)) as server:
            yield f"https://127.0.0.1:{server.port}"
    elif kind == "refused":
        yield f"https://127.0.0.1:{closed_port()}"
    elif kind == "silent":
        with silent_port() as port:
            yield f"https://127.0.0.1:{port}"
    else:
        with answering(int(kind)) as server:
            yield f"http://127.0.0.1:{server.port}"


# (failure, kind, words the line must hold)
FAILURES = [
    ("untrusted", failures.PERMANENT, "certificate is not trusted"),
    ("401", failures.PERMANENT, "401 Unauthorized"),
    ("403", failures.PERMANENT, "403 Forbidden"),
    ("429", failures.TRANSIENT, "429"),
    ("503", failures.TRANSIENT, "503"),
    ("refused", failures.TRANSIENT, "connection refused"),
    ("silent", failures.TRANSIENT, "timed out"),
]


def fleet_get(kubeconfig: Path, times: int = 1) -> Any:
    """The nodes, listed `times` times by one fleet client. Called from sync code on
    purpose: the table of failures calls each client the same way, the official one
    being sync."""

    async def get() -> Any:
        async with KubeApi.from_kubeconfig(str(kubeconfig)) as api:
            for _ in range(times):
                answer = await api.call("GET", "/api/v1/nodes")
            return answer

    return asyncio.run(get())


def official_get(kubeconfig: Path, times: int = 1) -> Any:
    """The nodes, listed `times` times by one official client."""
    from kubernetes import client

    from devplug.testing.official import api_client

    api = api_client(str(kubeconfig))
    try:
        for _ in range(times):
            answer = client.CoreV1Api(api).list_node(_preload_content=False)
        return answer
    finally:
        api.close()


CLIENTS: dict[str, Callable[..., Any]] = {"fleet": fleet_get, "official": official_get}


def failure_of(call: Callable[..., Any], kubeconfig: Path) -> BaseException:
    """What `call(kubeconfig)` raised (it must raise)."""
    try:
        answer = call(kubeconfig)
    except Exception as error:
        return error
    raise AssertionError(f"no failure: {answer!r}")


@pytest.mark.usefixtures("short_waits")
@pytest.mark.parametrize(("failure", "kind", "words"), FAILURES, ids=[f[0] for f in FAILURES])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_each_way_of_getting_no_answer_is_told_apart_in_one_line(
    tmp_path: Path, client: str, failure: str, kind: str, words: str
) -> None:
    with server_of(failure, tmp_path) as url:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        error = failure_of(CLIENTS[client], kubeconfig)
    line = failures.say(error)
    assert failures.kind(error) == kind, (type(error), line)
    assert words in line
    assert "\n" not in line


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_token_from_a_command_is_read_again_at_its_expiry(
    kubeconfig: str, tmp_path: Path, client: str
) -> None:
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    token = admin["users"][0]["user"]["token"]
    cluster = admin["clusters"][0]["cluster"]
    for seconds, expected in ((3600.0, 1), (-1.0, 3)):  # valid for an hour; expired at once
        folder = tmp_path / f"valid{seconds:g}"
        folder.mkdir()
        plugin = exec_plugin(folder, [token], seconds)
        config = write_kubeconfig(
            folder / "kubeconfig",
            cluster["server"],
            user=exec_user(plugin),
            ca=cluster["certificate-authority"],
        )
        CLIENTS[client](config, times=3)
        assert runs(plugin) == expected, seconds


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_token_refused_with_401_is_read_again_once(
    kubeconfig: str, tmp_path: Path, client: str
) -> None:
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    token = admin["users"][0]["user"]["token"]
    cluster = admin["clusters"][0]["cluster"]
    plugin = exec_plugin(tmp_path, ["revoked", token], None)  # no expiry: until a 401
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        cluster["server"],
        user=exec_user(plugin, "client.authentication.k8s.io/v1beta1"),
        ca=cluster["certificate-authority"],
    )
    CLIENTS[client](config, times=3)
    assert runs(plugin) == 2  # the revoked token, then the good one, kept


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_401_with_a_token_that_stays_wrong_is_not_tried_forever(
    tmp_path: Path, client: str
) -> None:
    plugin = exec_plugin(tmp_path, ["wrong"], None)
    with answering(401, good="right") as server:
        config = write_kubeconfig(
            tmp_path / "kubeconfig", f"http://127.0.0.1:{server.port}", user=exec_user(plugin)
        )
        error = failure_of(CLIENTS[client], config)
        assert server.seen == ["Bearer wrong", "Bearer wrong"]  # sent, read again, sent
    assert runs(plugin) == 2
    assert failures.kind(error) == failures.PERMANENT


def test_the_context_chooses_the_cluster(kubeconfig: str, tmp_path: Path) -> None:
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        "",
        token=admin["users"][0]["user"]["token"],
        ca=cluster["certificate-authority"],
        contexts={"away": f"https://127.0.0.1:{closed_port()}", "real": cluster["server"]},
        current="away",
    )
    assert load(str(config), "real").server == cluster["server"]
    away = failure_of(fleet_get, config)  # the current context
    assert "connection refused" in failures.say(away)
    assert fleet_get_context(config, "real")["kind"] == "NodeList"
    with pytest.raises(ValueError, match=r"no context 'nowhere' \(it has: away, real\)"):
        load(str(config), "nowhere")


def fleet_get_context(kubeconfig: Path, context: str) -> Any:
    """The nodes, listed by a fleet client of `context`; sync, as `fleet_get`."""

    async def get() -> Any:
        async with KubeApi.from_kubeconfig(str(kubeconfig), context) as api:
            return await api.call("GET", "/api/v1/nodes")

    return asyncio.run(get())


def test_waits_between_attempts_are_jittered_and_bounded() -> None:
    """A thousand clients failing together do not come back in step."""
    clients = [Backoff(1.0, 8.0) for _ in range(1000)]
    for step in (1.0, 2.0, 4.0, 8.0, 8.0):
        waits = [b.next() for b in clients]
        assert all(step / 2 <= w <= step for w in waits)
        assert len(set(waits)) > 990  # not in step
        assert statistics.pstdev(waits) > step / 10  # spread over the window
    one = clients[0]
    one.reset()
    assert one.next() <= 1.0


def _api_modules() -> Iterator[tuple[Path, ast.Module]]:
    """The modules that talk to an API server (through either client)."""
    markers = (
        "kubernetes",
        "devplug.apiserver.client",
        "devplug.testing.official",
        "devplug.apiserver",
    )
    for path in sorted(SRC.rglob("*.py")):
        if "apiserver" in path.parts or "api" in path.relative_to(SRC).parts[:1]:
            continue
        tree = ast.parse(path.read_text())
        names = {
            node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        } | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        if any(n == m or n.startswith(m + ".") for n in names for m in markers):
            yield path, tree


def test_every_retry_that_talks_to_the_api_server_uses_the_one_jittered_backoff() -> None:
    """No module that talks to an API server doubles a wait of its own: a new retry loop
    written by hand (in step across a thousand pods) fails here."""
    modules = list(_api_modules())
    assert len(modules) > 8
    doubling = []
    for path, tree in modules:
        for node in ast.walk(tree):
            grows = (
                isinstance(node, ast.BinOp | ast.AugAssign)
                and isinstance(node.op, ast.Mult)
                and isinstance(getattr(node, "right", getattr(node, "value", None)), ast.Constant)
                and getattr(getattr(node, "right", getattr(node, "value", None)), "value", 0) == 2
            )
            if grows:
                doubling.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not doubling, "hand-made backoff (use devplug.apiserver.backoff.Backoff): " + ", ".join(
        doubling
    )


NOT_PAST_THE_READER = ("load_kube_config", "load_incluster_config", "ApiClient(", "Configuration()")


def test_every_client_is_made_by_the_one_kubeconfig_reader() -> None:
    """Nothing reads a kubeconfig or builds the official client past devplug.apiserver
    (and the test kit's official client, built on its reader): its timeouts, context
    and token refresh would be missing."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if "apiserver" in path.parts or path == SRC / "testing" / "official.py":
            continue
        text = path.read_text()
        for needle in (
            "load_kube_config",
            "load_incluster_config",
            "client.ApiClient(",
            "Configuration()",
        ):
            if needle in text:
                found.append(f"{path.relative_to(SRC)}: {needle}")
    assert not found, found


@pytest.mark.usefixtures("short_waits")
def test_a_quiet_watch_is_not_cut_by_the_read_timeout(kubeconfig: str) -> None:
    """A watch is silent while nothing changes: the official client reads it for its
    own length (and a margin), not the read timeout of a request (1 s here)."""
    from kubernetes import client
    from kubernetes.watch.watch import iter_resp_lines

    from devplug.testing.official import api_client

    api = api_client(kubeconfig)
    core = client.CoreV1Api(api)
    selector = "metadata.name=no-such-node"
    try:
        for _ in range(20):  # the watch cache may be behind the list: 504, list again
            listed = core.list_node(field_selector=selector)
            response = core.list_node(
                watch=True,
                timeout_seconds=3,
                field_selector=selector,
                resource_version=listed.metadata.resource_version,
                _preload_content=False,
            )
            lines = list(iter_resp_lines(response))  # not cut after 1 s: ended by the server
            if not any('"code":504' in line for line in lines):
                break
        assert lines == []
    finally:
        api.close()
