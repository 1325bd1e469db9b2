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

RUNNER = Path(__file__).with_name("cli_runner.py")
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

    def job(self) -> dict[str, object]:
        # info lines (what a command starts) aside: the failure is the one line left
        quiet = [] if "--log-level" in self.argv else ["--log-level", "warning"]
        return {
            "argv": [*self.argv, *quiet],
            "stdin": self.stdin,
            "block": self.block,
            "closed_stdout": self.closed_stdout,
            "env": self.env,
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
    """Without the Kubernetes client (the `dra` extra), DRA says which extra to install."""
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
            block=["kubernetes"],
        ),
        Case(
            ["kubelet", *folders, "--kubeconfig", str(kubeconfig), "--node-name", "n"],
            [hint],
            1,
            block=["kubernetes"],
        ),
    ]
    wrong = problems(cases)
    assert not wrong, "\n".join(wrong)


def test_a_closed_output_pipe_is_no_error(files: Files) -> None:
    """`devplug check | head -1`: the reader went away; nothing to report."""
    cases = [Case(["check", "--config", str(files.config)], [], 1, closed_stdout=True, quiet=True)]
    wrong = problems(cases)
    assert not wrong, "\n".join(wrong)
