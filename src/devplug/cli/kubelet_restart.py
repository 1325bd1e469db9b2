"""`devplug kubelet-restart`: restart a running simulator as a kubelet restarts."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from devplug.cli import style
from devplug.cli.pods import add_control_argument, call

if TYPE_CHECKING:
    from devplug.simulator.control import ControlClient


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait-for",
        action="append",
        default=[],
        metavar="RESOURCE",
        help="then wait until RESOURCE has registered again",
    )
    style.add_timeout(parser, "--wait-for waits")
    add_control_argument(parser)


def run(args: argparse.Namespace) -> int:

    def restart(client: ControlClient) -> int:
        registered = client.restart(args.wait_for, timeout=args.timeout)
        print("kubelet restarted: plugin sockets removed, kubelet.sock served again")
        for resource, count in registered.items():
            print(f"{resource}: registered again ({count} registrations in all)")
        return style.EXIT_OK

    return call(args, restart)
