"""`devplug cluster`: place pods on N simulated nodes, each a kubelet simulator with its
own `devplug serve` process, through the scheduler's extended-resource fit step."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devplug.cluster import Cluster
    from devplug.simulator.pods import InvalidPod, PodSpec

from devplug.cli import style

log = logging.getLogger("devplug.cluster")

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
MAX_NODES = 100
MAX_NUMA_NODES = 8  # the topology manager's limit
QUIET_LOGGERS = ("devplug.simulator",)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=node_count, default=3, metavar="N", help="number of nodes")
    style.add_config(
        parser, "the devplug serve config every node runs, see docs/config.md", required=True
    )
    style.add_filenames(parser, "pod manifests to place, in order", required=True)
    style.add_output(parser)
    parser.add_argument(
        "--topology-policy",
        choices=POLICIES,
        default="none",
        help="the topology manager's policy on every node",
    )
    parser.add_argument(
        "--numa-nodes",
        type=style.count,
        metavar="N",
        help="NUMA nodes of each node (default: those the devices report)",
    )
    style.add_timeout(parser, "the nodes may take to register their resources")
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also show the simulators' and the plugins' info logs",
    )


node_count = style.Number(int, 1, f"a number of nodes, 1 to {MAX_NODES}", high=MAX_NODES)


def run(args: argparse.Namespace) -> int:
    from devplug.cli.kubelet import read_pods
    from devplug.cluster import Cluster
    from devplug.simulator.pods import parse_pods
    from devplug.sources import ConfigError, load_config

    if (
        args.numa_nodes is not None
        and args.topology_policy != "none"
        and args.numa_nodes > MAX_NUMA_NODES
    ):
        return style.fail(
            args,
            f"--numa-nodes: the topology manager supports at most {MAX_NUMA_NODES}",
            style.EXIT_USAGE,
        )
    try:
        config = load_config(args.config)
    except ConfigError as error:
        return style.fail(args, str(error), style.EXIT_USAGE)
    problem, manifests = read_pods(args.filename)
    if problem:
        return style.fail(args, problem, style.EXIT_USAGE)
    pods = [pod for documents in manifests for pod in parse_pods(documents)]

    cluster = Cluster(
        args.config,
        args.nodes,
        resources=[r.name for r in config.resources],
        topology_policy=args.topology_policy,
        numa_nodes=args.numa_nodes,
        timeout=args.timeout,
        serve_log_level=args.log_level if args.verbose else "warning",
    )
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    if not args.verbose:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return asyncio.run(_run(cluster, pods, args))
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through its path before the loop ran
        from devplug.ground.signals import received

        if received() == signal.SIGTERM:
            return style.fail(args, "terminated", EXIT_TERMINATED)
        return style.fail(args, "interrupted", EXIT_INTERRUPTED)
    except asyncio.CancelledError:
        return style.fail(args, "terminated", EXIT_TERMINATED)
    finally:
        cluster.kill_now()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


async def _run(cluster: Cluster, pods: list[PodSpec | InvalidPod], args: argparse.Namespace) -> int:
    from devplug.cluster import NodeFailed
    from devplug.cluster.report import report_records, report_text

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        async with cluster:
            placements = await cluster.place(pods)
            nodes = cluster.summaries()
    except NodeFailed as error:
        return style.fail(args, str(error))
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    style.print_result(
        report_records(placements, nodes),
        args.output,
        text=lambda: report_text(placements, nodes),
        each=True,
    )
    return style.EXIT_OK
