"""The one style of every `devplug` sub-command, kept in one place so commands cannot drift
apart (tests/unit/test_cli_style.py walks every parser and holds them to it).

A sub-command module uses it like this:

    from devplug.cli import style

    def configure(parser: argparse.ArgumentParser) -> None:
        style.add_output(parser)                          # -o/--output text|json|yaml
        style.add_filenames(parser, "pod manifests to apply")  # -f/--filename, repeatable
        parser.add_argument(
            "--timeout", type=style.seconds, default=30.0, metavar="SECONDS",
            help="how long to wait for the node",          # "(default: 30.0)" is added
        )

    def run(args: argparse.Namespace) -> int:
        if problem:
            return style.fail(args, f"{path}: not a pod manifest", style.EXIT_USAGE)
        style.print_result(report, args.output, text=lambda: render(report))
        return style.EXIT_OK

The conventions:
- `-o/--output text|json|yaml` everywhere: `text` is the view for people (the default);
  `json` prints each result as one JSON object on one line (JSON Lines, for `jq` and
  scripts); `yaml` prints each result as one YAML document that starts with `---`.
- `-f/--filename FILE` (repeatable, `-` for stdin) names the manifests a command reads;
  `--config FILE` is devplug's own config, the packaged default when left out.
- `--log-level` and `--log-format` are accepted before or after the sub-command.
- Every option has a help text; the formatter adds its default.
- Exit statuses: 0 done, 1 a runtime failure, 2 a usage or config error; every `--help`
  ends with them. A failure is one line on stderr, `devplug COMMAND: what was wrong`,
  naming the offending input, never a traceback.
- Values are checked when parsed (`seconds`, `count`, `port`, `folder`, `input_file`,
  `file_path`, `socket_path`), so a bad one is a usage error naming its option.

This module stays light (argparse and the standard library only): `devplug serve` parses
its command line with it on a node's reboot path.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path  # not imported at run time: `serve` parses before it needs it

EXIT_OK = 0
EXIT_FAILED = 1  # a runtime failure: the kubelet unreachable, a port in use, a folder read-only
EXIT_USAGE = 2  # a bad option, value, file or config: nothing was started

EXIT_EPILOG = "exit status: 0 done, 1 a runtime failure, 2 a usage or config error"

OUTPUTS = ("text", "json", "yaml")
DEFAULT_OUTPUT = "text"

LOG_LEVELS = ("debug", "info", "warning", "error")
# Other spellings accepted (the generic device plugin's levels).
LOG_LEVEL_ALIASES = {"all": "debug", "warn": "warning", "none": "error"}
LOG_FORMATS = ("text", "json")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows every option's default (unless its help already says it), with
    descriptions and epilogs kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and "default" not in text
            and default not in (None, False, argparse.SUPPRESS)
            and default != []
        ):
            shown = ", ".join(map(str, default)) if isinstance(default, list) else default
            text += f" (default: {str(shown).replace('%', '%%')})"
        return text


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that ends its help with the exit statuses and reports a usage
    error on one line, saying where the help is. Sub-command parsers are made of the same
    class (argparse creates them with the class of their parent)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        epilog = kwargs.pop("epilog", None)
        kwargs["epilog"] = f"{epilog}\n\n{EXIT_EPILOG}" if epilog else EXIT_EPILOG
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        said = one_line(message)
        self.exit(EXIT_USAGE, f"{self.prog}: {said} (see '{self.prog} --help')\n")


def fail(args: argparse.Namespace | str, message: str, code: int = EXIT_FAILED) -> int:
    """Print `devplug COMMAND: message` on stderr; return `code` for `run` to return."""
    prog = args if isinstance(args, str) else getattr(args, "prog", None) or "devplug"
    print(f"{prog}: {one_line(message)}", file=sys.stderr)
    return code


def one_line(text: str) -> str:
    """`text` with its line breaks and other control characters escaped (a file name or
    value given with a newline must not split an error into two lines)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# -- options every command spells the same way ---------------------------------------


def add_output(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """`-o/--output text|json|yaml`, text by default (see `print_result`)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default=DEFAULT_OUTPUT,
        help=help
        or "text: for people; json: one JSON object per line; yaml: one YAML document each",
    )


def add_filenames(parser: argparse.ArgumentParser, help: str, *, required: bool = False) -> None:
    """`-f/--filename FILE`, repeatable, '-' for stdin; `args.filename` is a list."""
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        required=required,
        type=input_file,
        metavar="FILE",
        help=f"{help} (repeatable; '-' reads stdin)",
    )


def add_config(
    parser: argparse.ArgumentParser, help: str | None = None, *, required: bool = False
) -> None:
    """`--config FILE`: devplug's config; None in `args.config` means the packaged default."""
    parser.add_argument(
        "--config",
        type=file_path,
        metavar="FILE",
        required=required,
        help=help or "the config file (default: the packaged default config)",
    )


def add_timeout(parser: argparse.ArgumentParser, what: str, default: float = 30.0) -> None:
    """`--timeout SECONDS` of a wait: `what` says what waits; past it the command fails."""
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=default,
        metavar="SECONDS",
        help=f"how long {what}; past it the command fails (exit 1)",
    )


def add_kubeconfig(parser: argparse.ArgumentParser | Any, help: str) -> None:
    """`--kubeconfig FILE` with its `--context NAME`: every command that talks to an API
    server takes the two together."""
    parser.add_argument("--kubeconfig", type=file_path, metavar="FILE", help=help)
    add_context(parser)


def add_context(parser: argparse.ArgumentParser | Any) -> None:
    """`--context NAME`, beside every `--kubeconfig`: the kubeconfig's context to use."""
    parser.add_argument(
        "--context",
        metavar="NAME",
        help="the kubeconfig's context to use (default: its current-context)",
    )


def add_api_timeout(parser: argparse.ArgumentParser) -> None:
    """`--api-timeout SECONDS` of a command that ends: how long it waits out an API
    server that is away or overloaded before it fails."""
    parser.add_argument(
        "--api-timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long the API server may stay unreachable or overloaded; past it the "
        "command fails (exit 1)",
    )


def add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """`--log-level` and `--log-format`: with their defaults on the top parser; on a
    sub-command's parser without (SUPPRESS), so that a value given after the sub-command
    replaces the top one and leaving it out keeps it."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=LogLevel(),
        default="info" if top else argparse.SUPPRESS,
        help="the lowest level of log lines shown on stderr (default: info)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text" if top else argparse.SUPPRESS,
        help="text: for people; json: one JSON object per log line (default: text)",
    )


def read_inputs(names: list[str]) -> list[tuple[str, str]]:
    """(name, text) of each `-f` file, 'stdin' for '-', bounded (devplug.ground.inputs).
    Raises InputError; `input_problem` words it."""
    from devplug.ground import inputs

    return [
        ("stdin" if name == "-" else name, inputs.read_text(name, inputs.LARGE_LIMITS))
        for name in names
    ]


def input_problem(name: str, error: Exception) -> str:
    """One line for a file that could not be read."""
    from devplug.ground.inputs import InputError

    if isinstance(error, InputError):
        return str(error)
    if isinstance(error, UnicodeDecodeError):
        return f"{name}: cannot read it: not UTF-8 text"
    if isinstance(error, OSError):
        return f"{name}: cannot read it: {error.strerror or error}"
    return f"{name}: {error}"


# -- printing --------------------------------------------------------------------------


def print_result(result: Any, output: str, *, text: Callable[[], str], each: bool = False) -> None:
    """Print `result` (plain data or msgspec structs) in the format `-o` chose.

    text: `text()`, the view for people. json: one JSON object on one line. yaml: one
    document starting with `---`. With `each`, `result` is a list whose items are printed
    as one object or document each (a stream of records, as `pods apply` prints).
    """
    if output == "text":
        shown = text()
        if shown:
            print(shown, flush=True)
        return
    from devplug.ground.formats import render

    sys.stdout.write("".join(render(item, output) for item in (result if each else [result])))
    sys.stdout.flush()


# -- value types: checked when parsed, each with bad examples for the tests ------------


class OptionType:
    """An option's `type=`: turns the text into the value or raises ArgumentTypeError
    with a message naming the value; `bad_examples` are values it refuses (the CLI tests
    run every command with them)."""

    __name__ = "value"

    def __call__(self, text: str) -> Any:
        raise NotImplementedError

    def bad_examples(self, scratch: Path) -> list[str]:
        """Values to refuse; `scratch` is an empty folder to make bad paths in."""
        raise NotImplementedError


class Number(OptionType):
    """A number from `low` (excluded when `open_low`) to `high`, finite."""

    def __init__(
        self,
        kind: type[int] | type[float],
        low: float,
        what: str,
        *,
        high: float = math.inf,
        open_low: bool = False,
    ) -> None:
        self.kind, self.low, self.high, self.open_low, self.what = kind, low, high, open_low, what
        self.__name__ = what

    def __call__(self, text: str) -> int | float:
        try:
            value: float | None = self.kind(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or value < self.low
            or (self.open_low and value == self.low)
            or value > self.high
        ):
            raise argparse.ArgumentTypeError(f"expected {self.what}, got {text!r}")
        return value

    def bad_examples(self, scratch: Path) -> list[str]:
        examples = ["x", "-1"]
        if self.open_low:
            examples.append(str(self.kind(self.low)))
        examples += ["nan", "inf"] if self.kind is float else ["1.5"]
        if math.isfinite(self.high):
            examples.append(str(self.kind(self.high) + 1))
        return examples


class LogLevel(OptionType):
    """A log level; its other spellings (`warn`, `all`, `none`) as devplug names them."""

    __name__ = "log level"

    def __call__(self, text: str) -> str:
        level = LOG_LEVEL_ALIASES.get(text, text)
        if level not in LOG_LEVELS:
            raise argparse.ArgumentTypeError(
                f"{text!r} is no log level: expected one of {', '.join(LOG_LEVELS)}"
            )
        return level

    def bad_examples(self, scratch: Path) -> list[str]:
        return ["loud", ""]


seconds = Number(float, 0, "a number of seconds above 0", open_low=True)
seconds_or_zero = Number(float, 0, "a number of seconds, 0 or more")
count = Number(int, 1, "a whole number, 1 or more")
port = Number(int, 0, "a TCP port, 0 to 65535 (0: any free port)", high=65535)


def _parent_problem(path: str) -> str | None:
    """Why nothing can be made at `path`: its nearest existing folder is no folder."""
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            if parent == os.path.dirname(parent):
                return None
            parent = os.path.dirname(parent)
            continue
        except OSError as error:
            return f"{parent}: {error.strerror}"
        return None if stat.S_ISDIR(st.st_mode) else f"{parent} is not a folder"


class PathType(OptionType):
    """A path that must be of one kind when it exists (and creatable when it does not)."""

    def __init__(self, kind: str, *, must_exist: bool = False, dash: bool = False) -> None:
        self.kind, self.must_exist, self.dash = kind, must_exist, dash
        self.__name__ = kind

    def __call__(self, text: str) -> str:
        if self.dash and text == "-":
            return text
        if not text:
            raise argparse.ArgumentTypeError(f"expected a {self.kind} path, got ''")
        if self.kind == "socket":
            from pathlib import Path

            from devplug.ground.unixserver import socket_path_problem

            if problem := socket_path_problem(Path(text)):
                raise argparse.ArgumentTypeError(problem)
        try:
            st = os.stat(text)
        except FileNotFoundError:
            problem = _parent_problem(text)
            if problem is None and self.must_exist:
                problem = "no such file"
            if problem:
                raise argparse.ArgumentTypeError(f"{text}: {problem}") from None
            return text
        except OSError as error:
            raise argparse.ArgumentTypeError(f"{text}: {error.strerror}") from None
        wrong = {
            "folder": not stat.S_ISDIR(st.st_mode),
            "file": stat.S_ISDIR(st.st_mode),
            "socket": not stat.S_ISSOCK(st.st_mode),
        }[self.kind]
        if wrong:
            raise argparse.ArgumentTypeError(f"{text}: exists and is not a {self.kind}")
        if self.must_exist and not os.access(text, os.R_OK):
            raise argparse.ArgumentTypeError(f"{text}: permission denied")
        return text

    def bad_examples(self, scratch: Path) -> list[str]:
        a_file = scratch / "a-file"
        a_file.touch()
        examples = [str(a_file / "under-a-file")]
        if self.kind == "folder" or self.kind == "socket":
            examples.append(str(a_file))
        if self.kind == "file":
            examples.append(str(scratch))
        if self.must_exist:
            examples.append(str(scratch / "missing.yaml"))
        return examples


class JsonObject(OptionType):
    """A JSON object given on the command line."""

    __name__ = "JSON object"

    def __call__(self, text: str) -> dict[str, Any]:
        import json

        try:
            value = json.loads(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{text!r}: not JSON: {error}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a JSON object")
        return value

    def bad_examples(self, scratch: Path) -> list[str]:
        return ["{", "[1]", "nul"]


json_object = JsonObject()
folder = PathType("folder")
# `-f` manifests: there and readable when parsed.
input_file = PathType("file", must_exist=True, dash=True)
# A file read later by a loader that names a missing one in its own words (a config, a
# kubeconfig), or a file written: a folder or a path under a file is refused when parsed.
file_path = PathType("file")
socket_path = PathType("socket")


# -- the parser tree -------------------------------------------------------------------


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every sub-command parser below it, depth first."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from parsers(sub)
