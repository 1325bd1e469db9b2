"""`devplug demo`: the kubelet simulator with real plugin processes, told as a story."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        "-o",
        choices=["text", "json"],
        default="text",
        help="text: the story for people (default); json: one event per line, for scripts",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work folder (sockets, checkpoint, logs) and print where it is",
    )


def run(args: argparse.Namespace) -> int:
    from devplug.demo import run_demo

    return run_demo(args.output, keep=args.keep, log_level=args.log_level)
