"""`devplug node`: capacity, allocatable, allocations and registrations of a simulator."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from devplug.cli import style
from devplug.cli.kubelet import wait_spec
from devplug.cli.pods import add_control_argument, call

if TYPE_CHECKING:
    from devplug.simulator.control import ControlClient


def configure(parser: argparse.ArgumentParser) -> None:
    style.add_output(parser)
    parser.add_argument(
        "--metrics", action="store_true", help="print the device-plugin metrics (Prometheus text)"
    )
    parser.add_argument(
        "--wait-for",
        action="append",
        default=[],
        type=wait_spec,
        metavar="RESOURCE[=N]",
        help="first wait until RESOURCE is registered and listed (with N healthy devices), "
        "the simulator itself too if it is still starting; a name without '/' is a DRA driver",
    )
    style.add_timeout(parser, "each --wait-for waits")
    add_control_argument(parser)


def run(args: argparse.Namespace) -> int:
    from devplug.simulator.report import node_text

    def show(client: ControlClient) -> int:
        for resource, count in args.wait_for:
            if "/" not in resource:  # a DRA driver's name
                client.wait_driver(resource, timeout=args.timeout)
            else:
                client.wait(resource, count, timeout=args.timeout)
        if args.metrics:
            sys.stdout.write(client.metrics())
            return style.EXIT_OK
        status = client.node()
        style.print_result(status, args.output, text=lambda: node_text(status))
        return style.EXIT_OK

    return call(args, show, wait=bool(args.wait_for))
