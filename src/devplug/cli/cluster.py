"""`devplug cluster`: place pods on N simulated nodes, each a kubelet simulator with its
own `devplug serve` process, through the scheduler's extended-resource fit step."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devplug.cluster import Cluster
    from devplug.simulator.pods import InvalidPod, PodSpec

log = logging.getLogger("devplug.cluster")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
MAX_NODES = 100
MAX_NUMA_NODES = 8  # the topology manager's limit
QUIET_LOGGERS = ("devplug.simulator",)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=int, default=3, metavar="N", help="number of nodes (default: 3)"
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="the devplug serve config every node runs (see docs/config.md)",
    )
    parser.add_argument(
        "--pods",
        required=True,
        metavar="FILE",
        help="pod manifests to place, in order ('-': stdin)",
    )
    parser.add_argument("--output", "-o", choices=["table", "json"], default="table")
    parser.add_argument("--topology-policy", choices=POLICIES, default="none")
    parser.add_argument(
        "--numa-nodes",
        type=int,
        metavar="N",
        help="NUMA nodes of each node (default: those the devices report)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long the nodes may take to register their resources (default: 30)",
    )
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also show the simulators' and the plugins' info logs",
    )


def _fail(message: str) -> int:
    print(f"devplug cluster: {message}", file=sys.stderr)
    return EXIT_INVALID


def run(args: argparse.Namespace) -> int:
    from devplug.cluster import Cluster
    from devplug.simulator import ManifestError
    from devplug.simulator.pods import parse_pods
    from devplug.sources import ConfigError, load_config

    if not 1 <= args.nodes <= MAX_NODES:
        return _fail(f"--nodes: expected 1 to {MAX_NODES}, got {args.nodes}")
    if args.numa_nodes is not None and args.numa_nodes < 1:
        return _fail(f"--numa-nodes: expected at least 1, got {args.numa_nodes}")
    if (
        args.numa_nodes is not None
        and args.topology_policy != "none"
        and args.numa_nodes > MAX_NUMA_NODES
    ):
        return _fail(f"--numa-nodes: the topology manager supports at most {MAX_NUMA_NODES}")
    if args.timeout <= 0:
        return _fail("--timeout: expected a positive number of seconds")
    try:
        config = load_config(args.config)
    except ConfigError as error:
        return _fail(str(error))
    source = "stdin" if args.pods == "-" else args.pods
    try:
        text = sys.stdin.read() if args.pods == "-" else Path(args.pods).read_text()
        pods = parse_pods(text)
    except OSError as error:
        return _fail(f"{source}: cannot read the pods: {error.strerror or error}")
    except UnicodeDecodeError:
        return _fail(f"{source}: cannot read the pods: not UTF-8 text")
    except ManifestError as error:
        return _fail(f"{source}: {error}")
    if not pods:
        return _fail(f"{source}: no pods")

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
        return asyncio.run(_run(cluster, pods, args.output))
    except KeyboardInterrupt:
        print("devplug cluster: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:
        print("devplug cluster: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        cluster.kill_now()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


async def _run(cluster: Cluster, pods: list[PodSpec | InvalidPod], output: str) -> int:
    from devplug.cluster import NodeFailed
    from devplug.cluster.report import report_json_lines, report_text

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        async with cluster:
            placements = await cluster.place(pods)
            nodes = cluster.summaries()
    except NodeFailed as error:
        print(f"devplug cluster: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    if output == "json":
        print("\n".join(report_json_lines(placements, nodes)), flush=True)
    else:
        print(report_text(placements, nodes), flush=True)
    return EXIT_OK
