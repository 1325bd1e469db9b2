"""Every command's flags fuzzed from the argparse definitions themselves: for each
sub-command, hypothesis draws command lines of its options (each left out, given once
or twice, with a value of its own kind, of another kind, or any text) and its
positional arguments.

- Parsing, in-process, many lines per command: a line is parsed, or refused with exit
  status 2 and one line on stderr that names the command; never another exception.
- Running, through tests/cli_runner.py (one fork per line), for the commands that end
  by themselves: exit status 0, 1 or 2, no traceback, and a failure said in one line.

A command added later is fuzzed without a change here (serving commands are parsed
only: they run until stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devplug.cli import style
from devplug.cli.main import build_parser

RUNNER = Path(__file__).resolve().parents[1] / "cli_runner.py"
# Commands that run until stopped (or for minutes): their lines are parsed, not run.
SERVING = {("serve",), ("kubelet",), ("fleet", "up"), ("demo",), ("cluster",)}
# Files and folders a fuzzed path may name, made in the runner's working folder.
CONFIG = "resources:\n  - name: example.com/fake\n    virtual: 2\n"
FLEET = "name: f\npools:\n  - {name: p, count: 1, cpu: 4, memory: 8Gi,\n"
FLEET += "     config: {resources: [{name: example.com/a, virtual: 1}]}}\n"
FILES = {
    "config.yaml": CONFIG,
    "fleet.yaml": FLEET,
    "pods.csv": "name,count,cpu,memory,gpus,gpuShare\nweb,1,1,1Gi,,\n",
    "pod.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n",
    "empty": "",
    # a kubeconfig whose credential command fails: refused at once, nothing waits
    "kubeconfig": "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
    "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1,"
    " command: /bin/false}}}]\n"
    "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    "binary": "\udcff\udcfe",
}


def leaves() -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for parser in style.parsers(build_parser()):
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            yield tuple(parser.prog.split()[1:]), parser


LEAVES = dict(leaves())


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(
            a, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction
        )
    ]


texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=24,
)
numbers = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "1", "0.5", "65536", "1e309", "-0", "0x10", "1_000"]),
)
paths = st.one_of(
    st.sampled_from([*FILES, "missing.yaml", "sub/missing", "folder", "-", "", "/dev/null"]),
    st.sampled_from(["config.yaml/under", "folder/x.sock", "/proc/1/mem", "."]),
)


def good_value(action: argparse.Action, words: tuple[str, ...]) -> st.SearchStrategy[str]:
    """A value `action` takes, naming one of FILES where it reads one."""
    if action.choices:
        return st.sampled_from([str(c) for c in action.choices])
    kind = action.type
    if isinstance(kind, style.Number):
        low = kind.low + (1 if kind.kind is int and kind.open_low else 0)
        if kind.kind is int:
            return st.integers(int(low), int(min(kind.high, low + 50))).map(str)
        return st.floats(low, low + 3, exclude_min=kind.open_low).map(repr)
    if isinstance(kind, style.PathType):
        if kind.kind == "folder":
            return st.sampled_from(["folder", "new-folder"])
        if kind.kind == "socket":
            return st.just("folder/nobody.sock")
        by_option = {
            "config": "config.yaml",
            "workload": "pods.csv",
            "kubeconfig": "kubeconfig",
            "html": "report.html",
            "filename": "fleet.yaml" if words[0] in ("fleet", "plan") else "pod.yaml",
        }
        return st.just(by_option.get(action.dest, "empty"))
    return texts


def value_of(action: argparse.Action, words: tuple[str, ...]) -> st.SearchStrategy[str]:
    """A value for `action`: mostly one it takes; else of another kind, or any text."""
    bad = [texts, numbers, paths]
    if action.choices:
        bad.insert(0, st.sampled_from([str(c) for c in action.choices]))
    good = good_value(action, words)
    return st.one_of(good, good, good, *bad)


@st.composite
def command_lines(draw: st.DrawFn, words: tuple[str, ...]) -> list[str]:
    """One command line of `words`' sub-command: half of them with values of the right
    kind only (they get past parsing, to the command), half with mistakes anywhere."""
    parser = LEAVES[words]
    clean = draw(st.booleans())
    line = list(words)
    for action in options(parser):
        value = good_value(action, words) if clean else value_of(action, words)
        if not action.option_strings:  # positional: one value, or none at all
            if action.nargs not in ("?", "*") and (clean or draw(st.booleans())):
                line.append(draw(value))
            continue
        repeatable = isinstance(action, argparse._AppendAction | argparse._CountAction)
        times = draw(st.sampled_from([0, 0, 1, 1, 2] if repeatable or not clean else [0, 1]))
        if action.required:
            times = max(times, 1)
        for _ in range(times):
            flag = draw(st.sampled_from(action.option_strings))
            if action.nargs == 0:
                line.append(flag)
            elif not clean and draw(st.integers(0, 9)) == 0:
                line.append(flag)  # its value left out
            else:
                text = draw(value)
                line += [f"{flag}={text}"] if draw(st.booleans()) else [flag, text]
    if not clean and draw(st.integers(0, 9)) == 0:
        line.append(draw(st.sampled_from(["--no-such-flag", "extra", "-x", "--"])))
    return line


PARSE = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


@pytest.fixture
def in_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text, errors="surrogateescape")
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("in_files")
@pytest.mark.parametrize("words", sorted(LEAVES), ids=" ".join)
def test_every_commands_flags_parse_or_are_refused_in_one_line(words: tuple[str, ...]) -> None:
    @PARSE
    @given(command_lines(words))
    def parses(line: list[str]) -> None:
        err = io.StringIO()
        code: object = None
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                build_parser(only=words[0]).parse_args(line)
            except SystemExit as stop:
                code = stop.code
        said = [x for x in err.getvalue().splitlines() if x.strip()]
        if code is not None:
            assert code == style.EXIT_USAGE, (line, code, said)
            assert len(said) == 1, (line, said)
            assert said[0].startswith("devplug"), (line, said)

    parses()


DRAW = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
ENDING = sorted(w for w in LEAVES if w not in SERVING)
PER_COMMAND = 6  # lines run per command: most that parse, a few that do not


def drawn_lines(words: tuple[str, ...]) -> list[list[str]]:
    """Lines hypothesis draws for `words`, those that parse first."""
    parsed: list[list[str]] = []
    refused: list[list[str]] = []

    @DRAW
    @given(command_lines(words))
    def draw(line: list[str]) -> None:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            try:
                build_parser(only=words[0]).parse_args(line)
            except SystemExit:
                refused.append(line)
                return
        parsed.append(line)

    draw()
    unique = {tuple(x): x for x in parsed[:PER_COMMAND] + refused}
    return list(unique.values())[:PER_COMMAND]


@pytest.mark.timeout(600)
def test_every_command_that_ends_answers_fuzzed_flags_in_one_line(in_files: Path) -> None:
    lines = [line for words in ENDING for line in drawn_lines(words)]
    quiet = ["--log-level", "warning"]
    jobs = [{"argv": [*line, *quiet], "stdin": "", "timeout": 15} for line in lines]
    done = subprocess.run(
        [sys.executable, str(RUNNER)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=540,
        check=True,
        cwd=in_files,
    )
    results = json.loads(done.stdout)
    codes = {r["code"] for r in results}
    assert {0, 2} <= codes, codes  # lines that ran and lines refused, both drawn
    wrong = []
    for line, result in zip(lines, results, strict=True):
        code, err = result["code"], str(result["stderr"])
        said = [x for x in err.splitlines() if x.strip()]
        shown = f"devplug {' '.join(line)} -> {code}: {err.strip()[-400:]!r}"
        if code is None:
            continue  # waiting as asked (a --timeout drawn long): not an error
        if code not in (0, 1, 2) or "Traceback" in err:
            wrong.append(f"exit {code}: {shown}")
        elif code != 0 and len(said) != 1:
            wrong.append(f"not one line: {shown}")
    assert not wrong, "\n".join(wrong)
