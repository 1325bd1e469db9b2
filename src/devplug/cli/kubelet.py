"""`devplug kubelet`: run the kubelet device-manager simulator until stopped."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

from devplug.api.constants import (
    ENDPOINT_GRACE_PERIOD_S,
    REGISTER_DIAL_TIMEOUT_S,
)
from devplug.cli import style

log = logging.getLogger("devplug.kubelet")

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
# What needs the API server's client, for the one line naming the extra when it is missing.
FEATURE = "the Kubernetes API (a kubelet's pods and claims, --kubeconfig)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin-dir",
        required=True,
        type=style.folder,
        metavar="DIR",
        help="the device-plugins folder to serve kubelet.sock in (never the real kubelet's: "
        "the simulator refuses to start beside a kubelet that answers)",
    )
    parser.add_argument(
        "--state-dir",
        type=style.folder,
        metavar="DIR",
        help="checkpoint, pod-resources/kubelet.sock, control.sock and the pod list "
        "(default: the plugin folder's parent)",
    )
    parser.add_argument(
        "--topology-policy",
        choices=POLICIES,
        default="none",
        help="the topology manager's policy for device requests",
    )
    parser.add_argument(
        "--numa-nodes",
        type=style.count,
        metavar="N",
        help="NUMA nodes of the node (default: those the devices report)",
    )
    style.add_filenames(parser, "pod manifests to apply once the --wait-for resources are there")
    parser.add_argument(
        "--wait-for",
        action="append",
        default=[],
        type=wait_spec,
        metavar="RESOURCE[=N]",
        help="before applying -f, wait until RESOURCE is registered (with N healthy devices); "
        "a name without '/' is a DRA driver",
    )
    style.add_timeout(parser, "--wait-for waits (then no pod is applied)")
    parser.add_argument(
        "--control",
        type=style.socket_path,
        metavar="SOCKET",
        help="control socket (default: STATE_DIR/control.sock)",
    )
    parser.add_argument(
        "--grace-period",
        type=style.seconds_or_zero,
        default=ENDPOINT_GRACE_PERIOD_S,
        metavar="SECONDS",
        help="how long a resource whose plugin went away stays (the kubelet's: 300)",
    )
    parser.add_argument(
        "--dial-timeout",
        type=style.seconds,
        default=REGISTER_DIAL_TIMEOUT_S,
        metavar="SECONDS",
        help="how long Register waits to reach the plugin (the kubelet's: 10)",
    )
    style.add_output(parser)
    dra = parser.add_argument_group("DRA (the kubelet's plugin watcher and claims)")
    dra.add_argument(
        "--registry-dir",
        type=style.folder,
        metavar="DIR",
        help="register DRA drivers whose sockets appear in DIR (plugins_registry); "
        "claims come from --claims-dir or --kubeconfig",
    )
    dra.add_argument(
        "--claims-dir",
        type=style.folder,
        metavar="DIR",
        help="allocated ResourceClaims as YAML files in DIR",
    )
    style.add_kubeconfig(
        dra,
        "read claims from this API server, and run the pods bound to --node-name",
    )
    dra.add_argument("--node-name", metavar="NAME", help="the node whose pods to run")


class WaitSpec(style.OptionType):
    """`RESOURCE[=N]`: 'example.com/gpu=2' -> ('example.com/gpu', 2), 'example.com/gpu'
    -> ('example.com/gpu', None)."""

    __name__ = "RESOURCE[=N]"

    def __call__(self, text: str) -> tuple[str, int | None]:
        name, sep, number = text.partition("=")
        if not name:
            raise argparse.ArgumentTypeError(f"{text!r}: expected RESOURCE or RESOURCE=N")
        if not sep:
            return name, None
        try:
            return name, int(style.count(number)) if number != "0" else 0
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected RESOURCE or RESOURCE=N, N a whole number"
            ) from None

    def bad_examples(self, scratch: Path) -> list[str]:
        return ["example.com/x=many", "example.com/x=-1", "=2"]


wait_spec = WaitSpec()


def run(args: argparse.Namespace) -> int:
    problem, manifests = read_pods(args.filename)
    if problem:
        return style.fail(args, problem, style.EXIT_USAGE)
    waits: list[tuple[str, int | None]] = args.wait_for
    import asyncio

    from devplug.ground.extras import MissingExtra

    try:
        return asyncio.run(_serve(args, manifests, waits))
    except MissingExtra as error:
        return style.fail(args, str(error))
    except ValueError as error:
        return style.fail(args, str(error), style.EXIT_USAGE)
    except OSError as error:
        return style.fail(args, str(error))
    except Exception as error:  # an API server gone, a bug: one line, the trace at debug
        log.debug("stopped on a failure", exc_info=True)
        return style.fail(args, f"stopped on a failure: {error!r}")


def read_pods(names: list[str]) -> tuple[str, list[list[Any]]]:
    """('', the pod documents of each `-f` file), or (the problem, []): a file that cannot
    be read, is no YAML, holds something other than pods, or no pod at all."""
    from devplug.ground.inputs import InputError
    from devplug.simulator import ManifestError
    from devplug.simulator.pods import load_documents, parse_pods

    manifests = []
    for name in names:
        try:
            [(shown, text)] = style.read_inputs([name])
            documents = load_documents(text, shown)
            if not parse_pods(documents, shown):
                return f"{shown}: no pods in it", []
        except (OSError, UnicodeDecodeError, InputError) as error:
            return style.input_problem(name, error), []
        except ManifestError as error:
            return str(error), []
        manifests.append(documents)
    return "", manifests


def _node_slices(kube: Any, node: str | None) -> Any:
    """With an API server, the node's slices are the kubelet's to wipe at start."""
    if kube is None or not node:
        return None
    from devplug.simulator.dra import NodeSlices

    return NodeSlices(kube, node)


async def _serve(
    args: argparse.Namespace, manifests: list[list[Any]], waits: list[tuple[str, int | None]]
) -> int:
    claims, kube = _dra_sources(args)
    async with contextlib.AsyncExitStack() as stack:
        if kube is not None:
            await stack.enter_async_context(kube)
        return await _run_kubelet(args, manifests, waits, claims, kube)


async def _run_kubelet(
    args: argparse.Namespace,
    manifests: list[list[Any]],
    waits: list[tuple[str, int | None]],
    claims: Any,
    kube: Any,
) -> int:
    from devplug.ground.signals import stop_on_signals
    from devplug.simulator import Kubelet, PodResult
    from devplug.simulator.report import pod_records, results_text

    def show(results: list[PodResult]) -> None:
        style.print_result(
            pod_records(results), args.output, text=lambda: results_text(results), each=True
        )

    kubelet = Kubelet(
        args.plugin_dir,
        args.state_dir,
        topology_policy=args.topology_policy,
        numa_nodes=args.numa_nodes,
        grace_period=args.grace_period,
        dial_timeout=args.dial_timeout,
        control_socket=args.control,
        dra_registry_dir=args.registry_dir,
        claims=claims,
        node_slices=_node_slices(kube, args.node_name),
    )
    from devplug.ground.unixserver import socket_path_problem

    for path in kubelet.sockets():  # said up front, before anything is made
        if problem := socket_path_problem(path):
            return style.fail(args, problem, style.EXIT_USAGE)
    code = style.EXIT_OK
    with stop_on_signals() as stop:
        try:
            await kubelet.start()
            print(
                f"kubelet simulator ready: registration {kubelet.registration_socket}, "
                f"pod resources {kubelet.pod_resources_socket}, control {kubelet.control_socket}",
                flush=True,
            )
            if kubelet.checkpoint_problem:
                print(f"checkpoint not used: {kubelet.checkpoint_problem}", file=sys.stderr)
            waited = await _until_stopped(_wait_all(kubelet, waits, args.timeout), stop)
            if waited is None:
                return code  # stopped by a signal while waiting: nothing applied
            if waited:
                return style.fail(args, waited)
            for documents in manifests:
                show(await kubelet.apply(documents))
            if kube is not None:
                from devplug.simulator.apipods import ApiPodFollower

                follower = ApiPodFollower(kubelet, kube, args.node_name, lambda r: show([r]))
                await _until_stopped(follower.run(), stop)
            else:
                await stop.wait()
        finally:
            await kubelet.stop()
    return code


async def _wait_all(kubelet: Any, waits: list[tuple[str, int | None]], timeout: float) -> str:
    """Wait for every `--wait-for` within `timeout` seconds in all; '' when they are all
    there, else what is missing."""
    import asyncio

    try:
        async with asyncio.timeout(timeout):
            for resource, count in waits:
                if "/" not in resource:  # a DRA driver's name
                    await kubelet.wait_for_registration(resource, timeout=timeout)
                else:
                    await kubelet.wait_for_resource(resource, count=count, timeout=timeout)
    except TimeoutError:
        want = f"={count}" if count is not None else ""
        return (
            f"--wait-for {resource}{want}: not registered and listed within --timeout "
            f"{timeout:g} s; no pod applied"
        )
    return ""


async def _until_stopped(work: Any, stop: Any) -> Any:
    """Run the coroutine `work` until it ends (its result, or its failure raised) or
    `stop` is set (None, `work` cancelled)."""
    import asyncio

    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


def _dra_sources(args: argparse.Namespace) -> tuple[Any, Any]:
    """The claim source of the DRA options, and the API server's client (not entered
    yet) when there is one."""
    if args.registry_dir is None:
        if args.claims_dir or args.kubeconfig:
            raise ValueError("--claims-dir and --kubeconfig need --registry-dir")
        return None, None
    if bool(args.claims_dir) == bool(args.kubeconfig):
        raise ValueError("--registry-dir needs one of --claims-dir and --kubeconfig")
    from devplug.framework.dra.claims import ApiClaims, FileClaims

    if args.claims_dir:
        return FileClaims(args.claims_dir), None
    if not args.node_name:
        raise ValueError("--kubeconfig needs --node-name: the node whose pods to run")
    from devplug.apiserver.client import KubeApi

    kube = KubeApi.from_kubeconfig(args.kubeconfig, args.context, extra="dra", feature=FEATURE)
    return ApiClaims(kube), kube
