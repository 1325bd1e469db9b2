"""`devplug extender`: the kube-scheduler's HTTP extender placing shares of GPUs with a
placement policy, over what the nodes' devplug publish (docs/placement.md)."""

from __future__ import annotations

import argparse

from devplug.cli import style

DEFAULT_PORT = 8888


def configure(parser: argparse.ArgumentParser) -> None:
    from devplug.placement import POLICY_NAMES

    parser.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default="default",
        help="how nodes and GPUs are ranked (docs/placement.md; default: the scheduler's own)",
    )
    parser.add_argument(
        "--port",
        type=style.port,
        default=DEFAULT_PORT,
        metavar="PORT",
        help="the port the scheduler reaches the extender on (0: any free port)",
    )
    parser.add_argument(
        "--address",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address to serve on ('' or 0.0.0.0: all)",
    )
    parser.add_argument(
        "--workload",
        type=style.file_path,
        metavar="FILE",
        help="fgd: the pod list (devplug plan's format) whose kinds fragmentation is "
        "measured against (default: the kinds of the pods placed so far)",
    )
    style.add_kubeconfig(
        parser,
        "kubeconfig of the API server (default: $KUBECONFIG, else in-cluster)",
    )


def run(args: argparse.Namespace) -> int:
    import logging

    from devplug.extender.cache import Cache
    from devplug.extender.kubeapi import KubeApi
    from devplug.extender.server import ExtenderServer
    from devplug.extender.verbs import Extender
    from devplug.ground.extras import MissingExtra

    target = None
    if args.workload:
        from devplug.placement import TargetWorkload
        from devplug.plan.trace import TraceError, read_pods

        try:
            target = TargetWorkload.of(p.demand for p in read_pods(args.workload))
        except (TraceError, ValueError) as error:
            return style.fail(args, f"--workload: {error}", style.EXIT_USAGE)
    try:
        api = KubeApi(args.kubeconfig, args.context)
    except (MissingExtra, ValueError) as error:
        return style.fail(args, str(error), style.EXIT_USAGE)
    cache = Cache(api)
    try:
        server = ExtenderServer(
            (args.address, args.port), Extender(api, args.policy, target, cache)
        )
    except OSError as error:
        where = f"{args.address}:{args.port}"
        return style.fail(args, f"cannot listen on {where}: {error.strerror or error}")
    # Lists and watches Nodes and pods; /readyz says ready once both are listed.
    cache.start()
    log = logging.getLogger("devplug.extender")
    log.info("extender serving on %s, policy %s", server.url, args.policy)
    print(server.url, flush=True)  # the address, port 0 resolved: for scripts
    try:  # until SIGTERM or Ctrl-C (KeyboardInterrupt, answered by devplug.cli.main)
        server.serve_forever()
    finally:
        server.server_close()
        cache.stop()
        api.close()
    return style.EXIT_OK
