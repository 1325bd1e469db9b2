"""`devplug node`: capacity, allocatable, allocations and registrations of a simulator."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from devplug.cli.pods import EXIT_INVALID, EXIT_OK, add_control_argument, call

if TYPE_CHECKING:
    from devplug.simulator.control import ControlClient


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", choices=["table", "json"], default="table")
    parser.add_argument(
        "--metrics", action="store_true", help="print the device-plugin metrics (Prometheus text)"
    )
    parser.add_argument(
        "--wait-for",
        action="append",
        default=[],
        metavar="RESOURCE[=N]",
        help="first wait until RESOURCE is registered and listed (with N healthy devices)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")
    add_control_argument(parser)


def run(args: argparse.Namespace) -> int:
    import msgspec

    from devplug.cli.kubelet import parse_wait
    from devplug.simulator.report import node_text

    try:
        waits = [parse_wait(w) for w in args.wait_for]
    except argparse.ArgumentTypeError as error:
        print(f"devplug node: {error}", file=sys.stderr)
        return EXIT_INVALID

    def show(client: ControlClient) -> int:
        for resource, count in waits:
            client.wait(resource, count, timeout=args.timeout)
        if args.metrics:
            sys.stdout.write(client.metrics())
            return EXIT_OK
        status = client.node()
        if args.output == "json":
            print(msgspec.json.encode(status).decode())
        else:
            print(node_text(status))
        return EXIT_OK

    return call(args, show)
