"""`devplug pods apply|delete|list`: pods on a running kubelet simulator."""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from devplug.cli import style

if TYPE_CHECKING:
    from devplug.simulator.control import ControlClient

CONTROL_ENV = "DEVPLUG_KUBELET_CONTROL"


def add_control_argument(parser: argparse.ArgumentParser) -> None:
    """`--control SOCKET`, from $DEVPLUG_KUBELET_CONTROL when set, else required: the
    simulator has no default folder (it never takes the real kubelet's)."""
    default = os.environ.get(CONTROL_ENV)
    parser.add_argument(
        "--control",
        metavar="SOCKET",
        type=style.socket_path,
        default=default,
        required=default is None,
        help=f"the simulator's control socket, as `devplug kubelet` printed it "
        f"(default: ${CONTROL_ENV})",
    )


def wait_reachable(path: str, timeout: float) -> None:
    """Wait until the simulator at `path` accepts connections (it may still be starting,
    as in `devplug kubelet & devplug node --wait-for ...`), up to `timeout` seconds;
    then the last OSError is raised. Nothing to be woken by before the folder exists:
    connection attempts, 10 ms apart at first, 200 ms at most."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() + delay > deadline:
                    raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def call(
    args: argparse.Namespace, action: Callable[[ControlClient], int], wait: bool = False
) -> int:
    """Run `action(client)`, turning an unreachable simulator or a refusal into exit 1;
    with `wait`, a simulator still starting is waited for (`args.timeout`)."""
    from devplug.simulator.control import ControlClient, ControlError

    client = ControlClient(args.control)
    try:
        if wait:
            wait_reachable(args.control, args.timeout)
        return action(client)
    except ControlError as error:
        return style.fail(args, str(error))
    except BrokenPipeError:
        raise  # our reader went away (`| head`), not the simulator
    except OSError as error:
        return style.fail(
            args,
            f"cannot reach the kubelet simulator at {args.control}: {error.strerror or error}",
        )


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pods_command", required=True, metavar="ACTION")
    about = "admit the pods of manifest files, as a kubelet admits a pod bound to its node"
    apply = sub.add_parser("apply", help=about, description=about)
    style.add_filenames(apply, "pod manifests (YAML, several per file)", required=True)
    style.add_output(apply)
    add_control_argument(apply)
    about = "delete a pod and free its devices"
    delete = sub.add_parser("delete", help=about, description=about)
    delete.add_argument("name", metavar="NAME", help="the pod's name")
    delete.add_argument("-n", "--namespace", default="default", help="the pod's namespace")
    add_control_argument(delete)
    about = "the pods the node runs, with their devices"
    listing = sub.add_parser("list", help=about, description=about)
    style.add_output(listing)
    add_control_argument(listing)


def run(args: argparse.Namespace) -> int:
    from devplug.simulator.report import pod_records, pod_summary_records, pods_text, results_text

    if args.pods_command == "apply":
        from devplug.cli.kubelet import read_pods

        problem, manifests = read_pods(args.filename)
        if problem:
            return style.fail(args, problem, style.EXIT_USAGE)

        def apply(client: ControlClient) -> int:
            for documents in manifests:
                results = client.apply(documents)
                style.print_result(
                    pod_records(results),
                    args.output,
                    text=functools.partial(results_text, results),
                    each=True,
                )
            return style.EXIT_OK

        return call(args, apply)

    if args.pods_command == "delete":

        def delete(client: ControlClient) -> int:
            if not client.delete(args.name, args.namespace):
                where = f"namespace {args.namespace}"
                return style.fail(args, f'pod "{args.name}" not found in {where}')
            print(f"pod {args.namespace}/{args.name} deleted")
            return style.EXIT_OK

        return call(args, delete)

    def listing(client: ControlClient) -> int:
        pods = client.pods()
        style.print_result(
            pod_summary_records(pods), args.output, text=lambda: pods_text(pods), each=True
        )
        return style.EXIT_OK

    return call(args, listing)
