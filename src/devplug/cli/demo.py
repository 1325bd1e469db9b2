"""`devplug demo`: the kubelet simulator with real plugin processes, told as a story."""

from __future__ import annotations

import argparse

from devplug.cli import style


def configure(parser: argparse.ArgumentParser) -> None:
    style.add_output(
        parser,
        "text: the story for people; json: one event per line; yaml: one document per event",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work folder (sockets, checkpoint, logs) and print where it is",
    )


def run(args: argparse.Namespace) -> int:
    from devplug.demo import run_demo

    return run_demo(args.output, keep=args.keep, log_level=args.log_level)
