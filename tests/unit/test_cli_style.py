"""Every sub-command follows the one CLI style (devplug.cli.style): the test walks the
whole parser, so a command added to COMMANDS later is held to it without a change here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from devplug.cli import style
from devplug.cli.main import COMMANDS, build_parser


def parsers() -> Iterator[argparse.ArgumentParser]:
    yield from style.parsers(build_parser())


def leaf_parsers() -> list[argparse.ArgumentParser]:
    return [
        p
        for p in parsers()
        if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    ]


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        yield action


def test_the_walk_reaches_every_command() -> None:
    progs = {p.prog for p in parsers()}
    assert {f"devplug {name}" for name in COMMANDS} <= progs
    assert {"devplug pods apply", "devplug pods delete", "devplug pods list"} <= progs


def test_every_option_has_help_and_its_default_shown() -> None:
    wrong = []
    for parser in parsers():
        text = parser.format_help()
        if parser.formatter_class is not style.Formatter:
            wrong.append(f"{parser.prog}: not made by style.Parser")
        if not parser.description:
            wrong.append(f"{parser.prog}: no description")
        if not text.rstrip().endswith(style.EXIT_EPILOG):
            wrong.append(f"{parser.prog}: --help does not end with the exit statuses")
        for action in options(parser):
            name = "/".join(action.option_strings) or action.dest
            if not action.help or action.help == argparse.SUPPRESS:
                wrong.append(f"{parser.prog} {name}: no help")
                continue
            default = action.default
            shows = parser._get_formatter()._expand_help(action)  # what --help prints
            if default not in (None, False, [], argparse.SUPPRESS) and "default" not in shows:
                wrong.append(f"{parser.prog} {name}: the default {default!r} is not shown")
    assert not wrong, "\n".join(wrong)


def test_output_is_the_same_everywhere() -> None:
    wrong, seen = [], 0
    for parser in parsers():
        for action in options(parser):
            if not {"-o", "--output"} & set(action.option_strings):
                continue
            seen += 1
            shape = (action.option_strings, tuple(action.choices or ()), action.default)
            if shape != (["-o", "--output"], style.OUTPUTS, style.DEFAULT_OUTPUT):
                wrong.append(f"{parser.prog}: {shape}")
    assert {"json", "yaml"} <= set(style.OUTPUTS)
    assert seen >= 9  # check, gpus, kubelet, pods apply/list, node, cluster, demo, status
    assert not wrong, "\n".join(wrong)


def test_files_are_passed_with_f_everywhere() -> None:
    wrong = []
    for parser in parsers():
        for action in options(parser):
            strings = set(action.option_strings)
            if {"-f", "--filename"} & strings or action.dest == "filename":
                ok = (
                    action.option_strings == ["-f", "--filename"]
                    and isinstance(action, argparse._AppendAction)
                    and action.type is style.input_file
                )
                if not ok:
                    wrong.append(f"{parser.prog}: {action.option_strings}")
            # a list of files after one option (`--pods A B`) is the old style
            if action.nargs in ("+", "*") and action.option_strings:
                wrong.append(f"{parser.prog} {action.option_strings}: nargs {action.nargs}")
    assert not wrong, "\n".join(wrong)


def test_numbers_and_paths_are_checked_when_parsed() -> None:
    """A typed option uses a style.OptionType, which knows values it refuses (the bad
    input test runs each command with them)."""
    wrong = []
    for parser in parsers():
        for action in options(parser):
            if action.type is not None and not isinstance(action.type, style.OptionType):
                wrong.append(f"{parser.prog} {action.option_strings}: type {action.type!r}")
            if action.metavar in ("FILE", "DIR", "SOCKET", "SECONDS", "PORT", "N") and not (
                isinstance(action.type, style.OptionType)
            ):
                wrong.append(f"{parser.prog} {action.option_strings}: {action.metavar} unchecked")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_flags_before_or_after_the_command(where: str) -> None:
    flags = ["--log-level", "debug", "--log-format", "json"]
    parser = build_parser()
    for leaf in leaf_parsers():
        words = leaf.prog.split()[1:]
        required = [a for a in options(leaf) if a.required or not a.option_strings]
        # only the global flags matter here: fill what the command requires
        filler: list[str] = []
        for action in required:
            value = "-" if action.type is style.input_file else "x"
            filler += [action.option_strings[0], value] if action.option_strings else [value]
        argv = flags + words + filler if where == "before" else words + filler + flags
        args = parser.parse_args(argv)
        assert (args.log_level, args.log_format) == ("debug", "json"), leaf.prog
        assert args.prog == leaf.prog
    defaults = parser.parse_args(["check"])
    assert (defaults.log_level, defaults.log_format) == ("info", "text")


def test_print_result_formats(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import yaml

    records = [{"pod": "a", "n": 1}, {"pod": "b", "n": 2}]
    style.print_result(records, "json", text=lambda: "unused", each=True)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == records
    style.print_result(records, "yaml", text=lambda: "unused", each=True)
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == records
    style.print_result(records, "yaml", text=lambda: "unused")
    assert yaml.safe_load(capsys.readouterr().out) == records
    style.print_result(records, "text", text=lambda: "a 1\nb 2")
    assert capsys.readouterr().out == "a 1\nb 2\n"


def test_serve_builds_only_its_own_parser() -> None:
    parser = build_parser(only="serve")
    assert {p.prog for p in style.parsers(parser)} == {"devplug", "devplug serve"}
