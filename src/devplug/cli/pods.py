"""`devplug pods apply|delete|list`: pods on a running kubelet simulator."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devplug.simulator.control import ControlClient

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
CONTROL_ENV = "DEVPLUG_KUBELET_CONTROL"
DEFAULT_CONTROL = "/var/lib/kubelet/control.sock"


def add_control_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--control",
        metavar="SOCKET",
        default=os.environ.get(CONTROL_ENV, DEFAULT_CONTROL),
        help=f"the simulator's control socket (default: ${CONTROL_ENV} or {DEFAULT_CONTROL})",
    )


def call(args: argparse.Namespace, action: Callable[[ControlClient], int]) -> int:
    """Run `action(client)`, turning an unreachable simulator or a refusal into exit 1."""
    from devplug.simulator.control import ControlClient, ControlError

    client = ControlClient(args.control)
    try:
        return action(client)
    except ControlError as error:
        print(f"devplug {args.command}: {error}", file=sys.stderr)
    except OSError as error:
        print(
            f"devplug {args.command}: cannot reach the kubelet simulator at {args.control}: "
            f"{error.strerror or error}",
            file=sys.stderr,
        )
    return EXIT_FAILED


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pods_command", required=True, metavar="ACTION")
    apply = sub.add_parser("apply", help="admit the pods of manifest files")
    apply.add_argument(
        "-f", "--filename", action="append", required=True, metavar="FILE", help="'-' for stdin"
    )
    apply.add_argument("--output", "-o", choices=["table", "json"], default="table")
    add_control_argument(apply)
    delete = sub.add_parser("delete", help="delete a pod and free its devices")
    delete.add_argument("name")
    delete.add_argument("--namespace", "-n", default="default")
    add_control_argument(delete)
    listing = sub.add_parser("list", help="the pods the node runs, with their devices")
    listing.add_argument("--output", "-o", choices=["table", "json"], default="table")
    add_control_argument(listing)


def run(args: argparse.Namespace) -> int:
    from devplug.simulator.report import json_lines, pods_json_lines, pods_text, results_text

    if args.pods_command == "apply":
        texts = []
        try:
            for name in args.filename:
                texts.append(sys.stdin.read() if name == "-" else Path(name).read_text())
        except OSError as error:
            print(f"devplug pods apply: {error}", file=sys.stderr)
            return EXIT_INVALID

        def apply(client: ControlClient) -> int:
            for text in texts:
                results = client.apply(text)
                out = json_lines(results) if args.output == "json" else [results_text(results)]
                print("\n".join(out), flush=True)
            return EXIT_OK

        return call(args, apply)

    if args.pods_command == "delete":

        def delete(client: ControlClient) -> int:
            if not client.delete(args.name, args.namespace):
                print(f'pod "{args.name}" not found in namespace {args.namespace}', file=sys.stderr)
                return EXIT_FAILED
            print(f"pod {args.namespace}/{args.name} deleted")
            return EXIT_OK

        return call(args, delete)

    def listing(client: ControlClient) -> int:
        pods = client.pods()
        if args.output == "json":
            lines = pods_json_lines(pods)
            if lines:
                print("\n".join(lines))
        else:
            print(pods_text(pods))
        return EXIT_OK

    return call(args, listing)
