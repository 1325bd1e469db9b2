"""Every sub-command, given bad input, answers one line on stderr that names what was
wrong, with exit status 2 (usage, config) or 1 (runtime), and never a traceback.

The cases are made by walking the parser (every option of every command in COMMANDS:
an unknown option, a bad choice, the values each option's type refuses, a required
option left out), so a command added later is checked without a change here; the
runtime cases the walk cannot make (a port in use, a YAML error, a closed pipe...) are
listed below. All run through tests/cli_runner.py: one process, a fork per command line.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devplug.cli import style
from devplug.cli.main import build_parser

RUNNER = Path(__file__).resolve().parents[1] / "cli_runner.py"
CONFIG = "resources:\n  - name: example.com/fake\n    virtual: 2\n"
POD = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c}]\n"


@dataclass
class Case:
    argv: list[str]
    names: list[str]  # the message must name one of these
    code: int | tuple[int, ...] = (style.EXIT_USAGE, style.EXIT_FAILED)
    stdin: str | None = None
    block: list[str] = field(default_factory=list)
    closed_stdout: bool = False
    quiet: bool = False  # a closed stdout: nothing to say
    env: dict[str, str] = field(default_factory=dict)
    also: list[str] = field(default_factory=list)  # ...and all of these
    term_in: str | None = None  # SIGTERM at the first write in a temp folder of this prefix

    def job(self) -> dict[str, object]:
        # info lines (what a command starts) aside: the failure is the one line left
        quiet = [] if "--log-level" in self.argv else ["--log-level", "warning"]
        return {
            "argv": [*self.argv, *quiet],
            "stdin": self.stdin,
            "block": self.block,
            "closed_stdout": self.closed_stdout,
            "env": self.env,
            "term_in": self.term_in,
        }


def run_all(cases: list[Case]) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(RUNNER)],
        input=json.dumps([c.job() for c in cases]),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    results: list[dict[str, object]] = json.loads(done.stdout)
    return results


def problems(cases: list[Case]) -> list[str]:
    wrong = []
    for case, result in zip(cases, run_all(cases), strict=True):
        code, err = result["code"], str(result["stderr"])
        lines = [line for line in err.splitlines() if line.strip()]
        shown = f"devplug {' '.join(case.argv)} -> {code}: {err.strip()!r}"
        codes = case.code if isinstance(case.code, tuple) else (case.code,)
        if code is None:
            wrong.append(f"still running, the bad input accepted: {shown}")
        elif "Traceback" in err or code not in codes:
            wrong.append(f"exit {code}, expected {codes}: {shown}")
        elif case.quiet:
            if lines:
                wrong.append(f"expected nothing on stderr: {shown}")
        elif len(lines) != 1:
            wrong.append(f"not one line: {shown}")
        elif not any(name in lines[0] for name in case.names):
            wrong.append(f"does not name {' or '.join(case.names)}: {shown}")
        elif not all(name in lines[0] for name in case.also):
            wrong.append(f"does not say {' and '.join(case.also)}: {shown}")
    return wrong


@dataclass
class Files:
    scratch: Path
    config: Path
    pods: Path


@pytest.fixture
def files(short_tmp: Path) -> Files:
    scratch = short_tmp / "scratch"
    scratch.mkdir()
    config, pods = short_tmp / "config.yaml", short_tmp / "pod.yaml"
    config.write_text(CONFIG)
    pods.write_text(POD)
    return Files(scratch, config, pods)


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            yield action


def leaves() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    for parser in style.parsers(build_parser()):
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            yield parser.prog.split()[1:], parser


def good_value(action: argparse.Action, files: Files) -> str:
    """A value that passes parsing, for the options a command requires."""
    if action.type is style.input_file:
        return str(files.config if action.dest == "config" else files.pods)
    if action.type is style.socket_path:
        return str(files.scratch / "nobody.sock")
    return "x"


def required_args(parser: argparse.ArgumentParser, files: Files, skip: object = None) -> list[str]:
    words: list[str] = []
    for action in options(parser):
        if action is skip or not (action.required or not action.option_strings):
            continue
        value = good_value(action, files)
        words += [action.option_strings[-1], value] if action.option_strings else [value]
    return words


def walked_cases(files: Files) -> list[Case]:
    cases = []
    for words, parser in leaves():
        base = required_args(parser, files)
        cases.append(Case([*words, *base, "--no-such-option"], ["--no-such-option"]))
        for action in options(parser):
            if not action.option_strings:
                continue
            option = action.option_strings[-1]
            rest = required_args(parser, files, skip=action)
            if action.required:
                cases.append(Case([*words, *rest], action.option_strings, style.EXIT_USAGE))
            values: list[str] = []
            if action.choices:
                values.append("no-such-choice")
            if isinstance(action.type, style.OptionType):
                values += action.type.bad_examples(files.scratch)
            for value in values:
                cases.append(
                    Case([*words, *rest, option, value], [option, value], style.EXIT_USAGE)
                )
    return cases


def test_every_command_refuses_bad_options_in_one_line(files: Files) -> None:
    cases = walked_cases(files)
    assert len(cases) > 100
    wrong = problems(cases)
    assert not wrong, "\n".join(wrong)


def test_runtime_mistakes_get_one_line(files: Files) -> None:
    scratch = files.scratch
    not_yaml = scratch / "not-yaml.yaml"
    not_yaml.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [\n")
    empty = scratch / "empty.yaml"
    empty.write_text("# nothing\n")
    service = scratch / "service.yaml"
    service.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    binary = scratch / "binary.yaml"
    binary.write_bytes(b"\xff\xfe kind: Pod\n")
    stale = scratch / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # a socket file nobody listens on
    nobody = str(scratch / "nobody.sock")
    control = ["--control", nobody]
    cases = [
        # pod files: named, with the line of a YAML error; no pod at all is an error
        Case(["pods", "apply", "-f", str(not_yaml), *control], [f"{not_yaml}:4"], 2),
        Case(["pods", "apply", "-f", str(empty), *control], [str(empty)], 2),
        Case(["pods", "apply", "-f", str(service), *control], [str(service)], 2),
        Case(["pods", "apply", "-f", str(binary), *control], [str(binary)], 2),
        Case(["pods", "apply", "-f", "-", *control], ["stdin"], 2, stdin="a: [\n"),
        Case(["cluster", "--config", str(files.config), "-f", str(not_yaml)], [str(not_yaml)], 2),
        Case(["cluster", "--config", str(files.config), "-f", str(empty)], [str(empty)], 2),
        Case(["kubelet", "--plugin-dir", str(scratch / "p"), "-f", str(not_yaml)], [str(not_yaml)]),
        # unreachable simulators and kubelets: the socket named, exit 1
        Case(["pods", "list", *control], [nobody], 1),
        Case(["node", "--control", str(stale)], [str(stale)], 1),
        Case(["kubelet-restart", *control], [nobody], 1),
        Case(["pods", "delete", "p", *control], [nobody], 1),
        Case(["status", "--pod-resources", nobody, "--timeout", "0.5"], [nobody], 1),
        # configs
        Case(["check", "--config", str(not_yaml)], [f"{not_yaml}:4"], 2),
        Case(["serve", "--config", str(empty), "--plugin-dir", str(scratch)], [str(empty)], 2),
        Case(["gpus", "--config", str(files.config)], [str(files.config)], 2),
    ]
    wrong = problems(cases)
    assert not wrong, "\n".join(wrong)


def test_a_missing_extra_is_named(files: Files) -> None:
    """Without aiohttp (the `dra` extra, under devplug's client of the API server), DRA
    says which extra to install."""
    scratch = files.scratch
    dra = scratch / "dra.yaml"
    dra.write_text(
        "resources:\n  - {name: example.com/a, virtual: 1, mode: dra,\n"
        "     dra: {driver: a.example.com}}\n"
    )
    kubeconfig = scratch / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    hint = "pip install 'devplug[dra]'"
    folders = ["--plugin-dir", str(scratch / "dp"), "--registry-dir", str(scratch / "reg")]
    cases = [
        Case(
            ["serve", "--config", str(dra), *folders, "--kubeconfig", str(kubeconfig)],
            [hint],
            1,
            block=["aiohttp"],
        ),
        Case(
            ["kubelet", *folders, "--kubeconfig", str(kubeconfig), "--node-name", "n"],
            [hint],
            1,
            block=["aiohttp"],
        ),
    ]
    wrong = problems(cases)
    assert not wrong, "\n".join(wrong)


def test_a_closed_output_pipe_is_no_error(files: Files) -> None:
    """`devplug check | head -1`: the reader went away; nothing to report."""
    cases = [Case(["check", "--config", str(files.config)], [], 1, closed_stdout=True, quiet=True)]
    wrong = problems(cases)
    assert not wrong, "\n".join(wrong)


# -- the API server: kubeconfigs, contexts, servers that do not answer -----------------

FLEET = "name: f\npools:\n  - {name: p, count: 1, cpu: 4, memory: 8Gi,\n"
FLEET += "     config: {resources: [{name: example.com/a, virtual: 1}]}}\n"
DRA_CONFIG = "resources:\n  - {name: example.com/a, virtual: 1, mode: dra,\n"
DRA_CONFIG += "     dra: {driver: a.example.com}}\n"
GOOD_CLUSTER = "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
GOOD_CONTEXT = "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
# (what is wrong, the kubeconfig's text, words the line must also hold)
BAD_KUBECONFIGS = [
    ("not YAML", "clusters: [\n", "invalid YAML"),
    ("a list", "- a\n- b\n", "not a kubeconfig"),
    ("no context", "apiVersion: v1\nkind: Config\n", "current-context"),
    ("context unknown", GOOD_CLUSTER + "current-context: y\n", "no context 'y'"),
    ("no server", "clusters: [{name: c, cluster: {}}]\n" + GOOD_CONTEXT, "server: missing"),
    (
        "not base64",
        "clusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: '%%'}}]\n"
        + GOOD_CONTEXT,
        "not base64",
    ),
    ("no cluster", "users: []\n" + GOOD_CONTEXT, "no cluster 'c'"),
    ("entry not a mapping", "clusters: [7]\n" + GOOD_CONTEXT, "clusters[0]"),
    (
        "exec without command",
        GOOD_CLUSTER
        + "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1}}}]\n"
        + GOOD_CONTEXT,
        "command: missing",
    ),
    (
        "exec of an old API",
        GOOD_CLUSTER
        + "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1alpha1,"
        + " command: x}}}]\n"
        + GOOD_CONTEXT,
        "v1alpha1",
    ),
    (
        "auth-provider",
        GOOD_CLUSTER + "users: [{name: u, user: {auth-provider: {name: oidc}}}]\n" + GOOD_CONTEXT,
        "auth-provider",
    ),
    (
        "a certificate without its key",
        GOOD_CLUSTER + "users: [{name: u, user: {client-certificate-data: YQ==}}]\n" + GOOD_CONTEXT,
        "key",
    ),
    (
        "a missing CA file",
        "clusters: [{name: c, cluster: {server: 'https://h',\n"
        + "  certificate-authority: nothere.crt}}]\n"
        + GOOD_CONTEXT,
        "nothere.crt",
    ),
]


def kube_commands(files: Files) -> dict[tuple[str, ...], list[str]]:
    """Every command that talks to an API server, with what it needs besides
    --kubeconfig; the walk checks that none is missing."""
    scratch = files.scratch
    fleet, dra, pods = scratch / "fleet.yaml", scratch / "dra.yaml", scratch / "pods.csv"
    fleet.write_text(FLEET)
    dra.write_text(DRA_CONFIG)
    pods.write_text("name,count,cpu,memory,gpus,gpuShare\nweb,1,1,1Gi,,\n")
    folders = ["--plugin-dir", str(scratch / "dp"), "--registry-dir", str(scratch / "reg")]
    return {
        ("fleet", "up"): ["-f", str(fleet)],
        ("fleet", "down"): ["-f", str(fleet), "--api-timeout", "2"],
        ("plan",): ["-f", str(fleet), "--workload", str(pods), "--api-timeout", "2"],
        ("serve",): ["--config", str(dra), *folders, "--node-name", "n",
                     "--dra-socket-dir", str(scratch / "dra"), "--cdi-dir", str(scratch / "cdi")],
        ("kubelet",): [*folders, "--node-name", "n"],
        ("extender",): ["--port", "0"],
    }  # fmt: skip


def test_every_command_with_a_kubeconfig_has_a_context(files: Files) -> None:
    with_kubeconfig = {
        tuple(words)
        for words, parser in leaves()
        if any("--kubeconfig" in a.option_strings for a in options(parser))
    }
    assert with_kubeconfig == set(kube_commands(files)), "a new command: add it to kube_commands"
    for words, parser in leaves():
        flags = {flag for a in options(parser) for flag in a.option_strings}
        if "--kubeconfig" in flags:
            assert "--context" in flags, words


@pytest.mark.timeout(180)
def test_every_command_refuses_a_bad_kubeconfig_in_one_line(files: Files) -> None:
    """Every mistake against one command (one reader serves them all), and a few
    against every command (each goes through that reader)."""
    cases = []
    good = files.scratch / "kubeconfig-good"
    good.write_text(GOOD_CLUSTER + GOOD_CONTEXT)
    commands = kube_commands(files)
    for words, rest in commands.items():
        every = words == ("fleet", "down")
        for index, (_, text, said) in enumerate(BAD_KUBECONFIGS):
            if not every and index not in (0, 2, 8):
                continue
            kubeconfig = files.scratch / f"kubeconfig-{index}"
            kubeconfig.write_text(text)
            argv = [*words, *rest, "--kubeconfig", str(kubeconfig)]
            cases.append(Case(argv, [f"kubeconfig {kubeconfig}"], 2, also=[said]))
        argv = [*words, *rest, "--kubeconfig", str(good), "--context", "nowhere"]
        cases.append(Case(argv, [f"kubeconfig {good}"], 2, also=["no context 'nowhere'"]))
    wrong = problems(cases)
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(180)
def test_commands_that_end_give_up_on_the_api_server_in_one_line(files: Files) -> None:
    """A server not trusted, refusing the token, failing, refusing connections or
    silent: `fleet down` and `plan` end within --api-timeout saying which, `fleet up`
    at once where waiting cannot help; a credential command that fails is named."""
    from api_servers import answering, closed_port, self_signed, silent_port, write_kubeconfig

    scratch = files.scratch
    commands = kube_commands(files)
    ending = [("fleet", "down"), ("plan",)]
    failing = scratch / "login"
    failing.write_text("#!/bin/sh\necho 'error: login required' >&2\nexit 3\n")
    failing.chmod(0o755)
    with (
        answering(200, tls=self_signed(scratch)) as untrusted,
        answering(401) as unauthorized,
        answering(503) as failed,
        silent_port() as silent,
    ):
        servers = {
            "untrusted": (f"https://127.0.0.1:{untrusted.port}", "certificate is not trusted"),
            "401": (f"http://127.0.0.1:{unauthorized.port}", "401 Unauthorized"),
            "503": (f"http://127.0.0.1:{failed.port}", "for 2 s"),
            "refused": (f"https://127.0.0.1:{closed_port()}", "connection refused"),
            "silent": (f"https://127.0.0.1:{silent}", "within 2 s"),
        }
        cases = []
        for name, (url, said) in servers.items():
            kubeconfig = write_kubeconfig(scratch / f"kubeconfig-{name}", url)
            permanent = name in ("untrusted", "401")
            for words in [*ending, ("fleet", "up")] if permanent else ending:
                argv = [*words, *commands[words], "--kubeconfig", str(kubeconfig)]
                cases.append(Case(argv, [said], 1))
        user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(failing)}}
        kubeconfig = write_kubeconfig(scratch / "kubeconfig-exec", servers["401"][0], user=user)
        for words in ending:
            argv = [*words, *commands[words], "--kubeconfig", str(kubeconfig)]
            cases.append(
                Case(argv, [str(failing)], 1, also=["exit status 3: error: login required"])
            )
        wrong = problems(cases)
    assert not wrong, "\n".join(wrong)


@pytest.fixture
async def no_rights_token(kubeconfig: str) -> str:
    """A token of a service account with no rights on the test run's API server."""
    import contextlib

    from devplug.apiserver.client import ApiError, KubeApi

    async with KubeApi.from_kubeconfig(kubeconfig) as api:
        path = "/api/v1/namespaces/default/serviceaccounts"
        with contextlib.suppress(ApiError):
            await api.call("POST", path, {"metadata": {"name": "no-rights"}})
        answer = await api.call("POST", f"{path}/no-rights/token", {"spec": {}})
        return str(answer["status"]["token"])


@pytest.mark.timeout(180)
def test_the_real_api_servers_refusals_are_said_and_the_context_chosen(
    kubeconfig: str, files: Files, no_rights_token: str
) -> None:
    """Against a real kube-apiserver: a wrong token (401) and a service account with no
    rights (403) fail at once in one line; --context picks the cluster."""

    import yaml
    from api_servers import closed_port, write_kubeconfig

    admin = yaml.safe_load(Path(kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]["server"]
    ca = admin["clusters"][0]["cluster"]["certificate-authority"]

    scratch = files.scratch
    forbidden = write_kubeconfig(scratch / "kc-403", server, token=no_rights_token, ca=ca)
    wrong = write_kubeconfig(scratch / "kc-401", server, token="not-a-token", ca=ca)
    contexts = {"away": f"https://127.0.0.1:{closed_port()}", "real": server}
    token = admin["users"][0]["user"]["token"]
    two = write_kubeconfig(
        scratch / "kc-two", "", token=token, ca=ca, contexts=contexts, current="away"
    )
    rest = kube_commands(files)[("fleet", "down")]
    down = ["fleet", "down", *rest, "--kubeconfig"]
    cases = [
        Case([*down, str(forbidden)], ["403 Forbidden"], 1, also=["no-rights"]),
        Case([*down, str(wrong)], ["401 Unauthorized"], 1),
        Case([*down, str(two), "--context", "real"], [], 0, quiet=True),
        Case([*down, str(two)], ["connection refused"], 1),  # its current context: away
    ]
    wrong_lines = problems(cases)
    assert not wrong_lines, "\n".join(wrong_lines)


# -- signals: SIGTERM (a CI timeout, `kill`) cleans up as Ctrl-C does ---------------------

GPU_FLEET = "name: g\npools:\n  - {name: h, count: 2, cpu: 8, memory: 64Gi,\n"
GPU_FLEET += "     gpus: {model: H100-SXM5-80GB, count: 2}, config: {resources: [{nvidia: {}}]}}\n"


def temp_state_commands(files: Files) -> dict[str, list[str]]:
    """Each command that keeps state in a temporary folder, by the folder's prefix."""
    scratch = files.scratch
    fleet, pods = scratch / "gpus.yaml", scratch / "gpus.csv"
    fleet.write_text(GPU_FLEET)
    pods.write_text("name,count,cpu,memory,gpus,gpuShare\ntrain,2,1,1Gi,1,\n")
    from api_servers import closed_port, write_kubeconfig

    away = write_kubeconfig(scratch / "kc-away", f"https://127.0.0.1:{closed_port()}")
    return {
        "devplug-plan-": ["plan", "-f", str(fleet), "--workload", str(pods)],
        "devplug-fleet-": ["fleet", "check", "-f", str(fleet)],
        "devplug-fleet-up-": ["fleet", "up", "-f", str(fleet), "--kubeconfig", str(away)],
        "devplug-cluster-": ["cluster", "--config", str(files.config), "-f", str(files.pods)],
        "devplug-demo-": ["demo"],
    }


def test_every_temporary_folder_is_known_to_the_signal_test(files: Files) -> None:
    """A new command that keeps state in a temporary folder joins the test below."""
    import re

    src = Path(__file__).resolve().parents[2] / "src" / "devplug"
    made = set()
    for path in src.rglob("*.py"):
        if "testing" in path.parts:  # the pytest fixtures' folders: their teardown
            continue
        made |= set(re.findall(r"mkdtemp\(prefix=\"([^\"]+)\"", path.read_text()))
    removed_at_exit = {"devplug-kubeconfig-"}  # credentials' files: atexit, on any stop
    assert made - removed_at_exit <= set(temp_state_commands(files)), made


@pytest.mark.timeout(240)
def test_sigterm_cleans_up_as_ctrl_c_does_for_every_command(files: Files) -> None:
    """SIGTERM sent the moment each command writes into its temporary folder: the folder
    is gone when it exits, with 143 (128 + SIGTERM) and at most one line."""
    cases, folders = [], []
    for index, (prefix, argv) in enumerate(temp_state_commands(files).items()):
        tmp = files.scratch / f"tmp-{index}"
        tmp.mkdir()
        folders.append(tmp)
        case = Case(argv, ["terminated", "SIGTERM"], 143, env={"TMPDIR": str(tmp)})
        case.term_in = prefix.removesuffix("up-")
        cases.append(case)
    results = run_all(cases)
    wrong = []
    for case, result, tmp in zip(cases, results, folders, strict=True):
        err = str(result["stderr"])
        shown = f"devplug {' '.join(case.argv)} -> {result['code']}: {err.strip()[-300:]!r}"
        if result["code"] != 143 or "Traceback" in err:
            wrong.append(f"not ended as by SIGTERM: {shown}")
        if len([line for line in err.splitlines() if line.strip()]) > 1:
            wrong.append(f"more than one line: {shown}")
        if left := sorted(p.name for p in tmp.iterdir()):
            wrong.append(f"left {left} behind: {shown}")
    assert not wrong, "\n".join(wrong)
