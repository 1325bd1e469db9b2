"""`devplug kubelet`: run the kubelet device-manager simulator until stopped."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from devplug.api.constants import (
    DEVICE_PLUGIN_PATH,
    ENDPOINT_GRACE_PERIOD_S,
    REGISTER_DIAL_TIMEOUT_S,
)

log = logging.getLogger("devplug.kubelet")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin-dir",
        default=DEVICE_PLUGIN_PATH,
        metavar="DIR",
        help=f"the device-plugins folder to serve kubelet.sock in (default: {DEVICE_PLUGIN_PATH})",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="checkpoint, pod-resources/kubelet.sock, control.sock and the pod list "
        "(default: the plugin folder's parent)",
    )
    parser.add_argument("--topology-policy", choices=POLICIES, default="none")
    parser.add_argument(
        "--numa-nodes",
        type=int,
        metavar="N",
        help="NUMA nodes of the node (default: those the devices report)",
    )
    parser.add_argument(
        "--pods", nargs="+", default=[], metavar="FILE", help="pod manifests to apply at start"
    )
    parser.add_argument(
        "--wait-for",
        action="append",
        default=[],
        metavar="RESOURCE[=N]",
        help="before applying --pods, wait until RESOURCE is registered (with N healthy devices); "
        "a name without '/' is a DRA driver",
    )
    parser.add_argument(
        "--control", metavar="SOCKET", help="control socket (default: STATE_DIR/control.sock)"
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=ENDPOINT_GRACE_PERIOD_S,
        metavar="SECONDS",
        help="how long a resource whose plugin went away stays (default: 300, the kubelet's)",
    )
    parser.add_argument(
        "--dial-timeout",
        type=float,
        default=REGISTER_DIAL_TIMEOUT_S,
        metavar="SECONDS",
        help="how long Register waits to reach the plugin (default: 10, the kubelet's)",
    )
    parser.add_argument("--output", choices=["table", "json"], default="table")
    dra = parser.add_argument_group("DRA (the kubelet's plugin watcher and claims)")
    dra.add_argument(
        "--registry-dir",
        metavar="DIR",
        help="register DRA drivers whose sockets appear in DIR (plugins_registry); "
        "claims come from --claims-dir or --kubeconfig",
    )
    dra.add_argument(
        "--claims-dir", metavar="DIR", help="allocated ResourceClaims as YAML files in DIR"
    )
    dra.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="read claims from this API server, and run the pods bound to --node-name",
    )
    dra.add_argument("--node-name", metavar="NAME", help="the node whose pods to run")


def parse_wait(spec: str) -> tuple[str, int | None]:
    """'example.com/gpu=2' -> ('example.com/gpu', 2); 'example.com/gpu' -> (.., None)."""
    name, sep, count = spec.partition("=")
    if not sep:
        return name, None
    try:
        return name, int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected RESOURCE or RESOURCE=N") from None


def run(args: argparse.Namespace) -> int:
    manifests = []
    try:
        waits = [parse_wait(w) for w in args.wait_for]
        for name in args.pods:
            manifests.append(sys.stdin.read() if name == "-" else Path(name).read_text())
    except (OSError, argparse.ArgumentTypeError) as error:
        print(f"devplug kubelet: {error}", file=sys.stderr)
        return EXIT_INVALID
    import asyncio

    try:
        return asyncio.run(_serve(args, manifests, waits))
    except ValueError as error:
        print(f"devplug kubelet: {error}", file=sys.stderr)
        return EXIT_INVALID
    except Exception:
        log.exception("stopped on a failure")
        return EXIT_FAILED


async def _serve(
    args: argparse.Namespace, manifests: list[str], waits: list[tuple[str, int | None]]
) -> int:
    import asyncio

    from devplug.framework.signals import stop_on_signals
    from devplug.simulator import Kubelet, ManifestError, PodResult
    from devplug.simulator.report import json_lines, results_text

    def show(results: list[PodResult]) -> None:
        out = json_lines(results) if args.output == "json" else [results_text(results)]
        print("\n".join(out), flush=True)

    claims, api = _dra_sources(args)
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
    )
    code = EXIT_OK
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
            for resource, count in waits:
                try:
                    if "/" not in resource:  # a DRA driver's name
                        await kubelet.wait_for_registration(resource, timeout=60)
                        continue
                    await kubelet.wait_for_resource(resource, count=count, timeout=60)
                except TimeoutError as error:
                    log.error("%s", error)
            for text in manifests:
                try:
                    results = await kubelet.apply(text)
                except ManifestError as error:
                    print(f"devplug kubelet: --pods: {error}", file=sys.stderr)
                    code = EXIT_INVALID
                    continue
                show(results)
            if api is not None:
                from devplug.simulator.apipods import ApiPodFollower

                follower = asyncio.create_task(
                    ApiPodFollower(kubelet, api, args.node_name, lambda r: show([r])).run()
                )
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({follower, stopping}, return_when="FIRST_COMPLETED")
                stopping.cancel()
                if follower.done():
                    follower.result()  # a failure (the API server gone) is raised
                follower.cancel()
            else:
                await stop.wait()
        finally:
            await kubelet.stop()
            if api is not None:
                api.close()
    return code


def _dra_sources(args: argparse.Namespace) -> tuple[Any, Any]:
    """The claim source of the DRA options (and the API client, when there is one)."""
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
    from devplug.framework.dra.kube import api_client

    api = api_client(args.kubeconfig)
    return ApiClaims(api), api
