"""Entry point of the `devplug` command.

Each sub-command lives in its own module under devplug.cli with two functions,
`configure(parser)` and `run(args) -> int`; modules import their heavy dependencies
inside `run`, so `devplug --help` and `devplug check` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from devplug.cli import style

# sub-command -> (module in devplug.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "serve the resources of a config file to the kubelet"),
    "check": ("check", "validate a config file and print the devices it would serve"),
    "gpus": ("gpus", "show the NVIDIA GPUs NVML sees and what devplug would serve from them"),
    "kubelet": ("kubelet", "run the kubelet device-manager simulator"),
    "pods": ("pods", "apply, delete or list pods on a running kubelet simulator"),
    "node": ("node", "show a kubelet simulator's resources, allocations and registrations"),
    "kubelet-restart": ("kubelet_restart", "restart a kubelet simulator as a kubelet restarts"),
    "cluster": ("cluster", "place pods on N simulated nodes: scheduler fit, kubelet admission"),
    "fleet": ("fleet", "simulated device nodes for a real API server: check, up, down"),
    "plan": ("plan", "will a workload fit a fleet: devices used, free, stranded; pending pods"),
    "demo": ("demo", "run the kubelet simulator with real plugins and sample pods, as a story"),
    "status": ("status", "show a node's devices, their health and the pods holding them"),
    "extender": ("extender", "the kube-scheduler's extender: GPU shares placed by a policy"),
}

# The generic device plugin's flags: its DaemonSet gives them to the image without a
# sub-command, which then means `serve` (see docs/migrate.md).
GDP_FLAGS = ("--device", "--domain", "--plugin-directory", "--listen", "--config")

EXIT_USAGE = style.EXIT_USAGE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it

# Node daemons that talk over unix sockets only: they run without the ssl module,
# which saves about 4 MiB of RSS on every node.
WITHOUT_TLS = {"serve"}
# ...unless an option loads a library that imports ssl (prometheus-client does).
NEEDS_SSL_OPTIONS = {"--metrics-port"}


def _gdp_words(words: Sequence[str]) -> list[str]:
    """`words` with `serve` put before the first generic device plugin flag when no
    sub-command comes before it (`devplug --device ...`)."""
    i = 0
    while i < len(words):
        word, has_value = words[i].partition("=")[::2]
        if word in ("--log-level", "--log-format"):
            i += 1 if has_value else 2
            continue
        if word in GDP_FLAGS:
            return [*words[:i], "serve", *words[i:]]
        break
    return list(words)


def _command(argv: Sequence[str] | None) -> str | None:
    """The sub-command named in `argv`, found before the full parser imports anything."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    style.add_global_options(pre, top=True)
    pre.add_argument("command", nargs="?")
    try:
        known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    except argparse.ArgumentError:
        return None  # the full parser reports it
    name: str | None = known.command
    return name


class _Version(argparse.Action):
    """`--version`, reading the installed version only when asked (importlib.metadata
    costs the daemon memory)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help=str(kwargs.get("help", "")),
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("devplug")
        except PackageNotFoundError:
            found = "unknown"
        print(f"devplug {found}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole `devplug` parser (or, with `only`, the top and that one sub-command),
    every sub-command parser in the one style (see devplug.cli.style)."""
    parser = style.Parser(
        prog="devplug", description="Kubernetes device plugins and a kubelet simulator."
    )
    style.add_global_options(parser, top=True)
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        cmd = importlib.import_module(f"devplug.cli.{module}")
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        cmd.configure(command_parser)
        command_parser.set_defaults(_module=cmd)
    for each in style.parsers(parser):
        each.set_defaults(prog=each.prog)
        if each is not parser:
            style.add_global_options(each, top=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if _command(argv) == "serve":
        # First of all: SIGHUP asks a running daemon to reload, it must never end one
        # that is still starting.
        from devplug.ground.signals import hold_reload_signal

        hold_reload_signal()
    # gRPC's core logs (absl) bypass Python logging and would break the log format;
    # devplug reports each failure itself, so unless asked for (GRPC_VERBOSITY=debug to
    # see them) they are off. Read when grpc loads, so before any import of it.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    words = _gdp_words(sys.argv[1:] if argv is None else argv)
    argv = words
    if _command(argv) in WITHOUT_TLS and not any(
        w.partition("=")[0] in NEEDS_SSL_OPTIONS for w in words
    ):
        from devplug.ground.lazy import block_ssl

        block_ssl()
    # `serve` builds its own parser only: it is on the path of a node's reboot, where
    # every millisecond before registration can fail a pod's admission.
    args = build_parser(only="serve" if _command(argv) == "serve" else None).parse_args(argv)
    from devplug.ground import signals
    from devplug.ground.logs import setup_logging

    setup_logging(args.log_level, args.log_format)
    signals.terminate_like_interrupt()
    from devplug.ground.extras import MissingExtra

    try:
        code: int = args._module.run(args)
    except MissingExtra as error:  # any command: one line naming the extra to install
        return style.fail(args, str(error))
    except BrokenPipeError:
        # The reader went away (`devplug check ... | head`): quietly stop writing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM in a blocking wait (`node --wait-for`)
        stopped = signals.received() or signal.SIGINT
        said = "terminated" if stopped == signal.SIGTERM else "interrupted"
        print(f"{args.prog}: {said}", file=sys.stderr)
        return 128 + stopped
    if code == EXIT_INTERRUPTED and signals.received() == signal.SIGTERM:
        print(f"{args.prog}: terminated", file=sys.stderr)  # through Ctrl-C's path
        return 128 + signal.SIGTERM
    return code


if __name__ == "__main__":
    sys.exit(main())
