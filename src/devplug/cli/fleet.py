"""`devplug fleet`: simulated device nodes for a real API server and scheduler.

devplug fleet check -f fleet.yaml                      # pools, nodes, what each serves
devplug fleet up -f fleet.yaml --kubeconfig K          # register, run until Ctrl-C
devplug fleet down -f fleet.yaml --kubeconfig K        # remove what up created
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug.fleet.runner import FleetRunner
    from devplug.fleet.spec import Fleet

from devplug.cli import style

EXIT_OK = style.EXIT_OK
EXIT_FAILED = style.EXIT_FAILED
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


lease_seconds = style.Number(int, 1, "a whole number of seconds, 1 or more")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions = {
        "check": "check a fleet file and show its pools, nodes and what each serves",
        "up": "register the fleet's nodes with an API server and run them until stopped",
        "down": "remove the Nodes, Leases, ResourceSlices and Events that up created",
    }
    made = {
        name: sub.add_parser(name, help=text, description=text) for name, text in actions.items()
    }
    up, down = made["up"], made["down"]
    for command in made.values():
        style.add_filenames(command, "the fleet file (one)", required=True)
        style.add_output(command)
    for command in (up, down):
        style.add_kubeconfig(
            command,
            "the cluster (default: $KUBECONFIG, else the in-cluster service account)",
        )
        command.add_argument(
            "--concurrency",
            type=style.count,
            default=32,
            metavar="N",
            help="API requests in flight at most",
        )
    style.add_api_timeout(down)
    up.add_argument(
        "--work-dir",
        type=style.folder,
        metavar="DIR",
        help="where GPU pools keep their fake NVML host and nodes their DRA state "
        "(default: a temporary folder, removed at exit)",
    )
    up.add_argument(
        "--renew-seconds",
        type=style.seconds,
        default=10.0,
        metavar="SECONDS",
        help="how often each node renews its Lease (the kubelet's 10 s)",
    )
    up.add_argument(
        "--lease-seconds",
        type=lease_seconds,
        default=40,
        metavar="SECONDS",
        help="the Leases' duration (the kubelet's 40 s)",
    )
    up.add_argument(
        "--status-seconds",
        type=style.seconds,
        default=300.0,
        metavar="SECONDS",
        help="how often each node reports its status when nothing changed",
    )
    up.add_argument(
        "--topology-policy",
        choices=POLICIES,
        help="the topology manager's policy on every node (default: each pool's)",
    )


def _fail(message: str, code: int = style.EXIT_USAGE) -> int:
    return style.fail("devplug fleet", message, code)


def read_fleet(names: list[str], prog: str) -> Fleet | int:
    """The one fleet file of `-f` ('-': stdin, its paths from the current folder), or a
    cluster trace's node list (CSV, as `devplug plan --nodes` reads it); or the exit
    status of a one-line error."""
    from devplug.fleet.nodelist import node_list_fleet
    from devplug.fleet.spec import load_fleet, parse_fleet
    from devplug.placement.trace import is_node_list
    from devplug.sources import ConfigError

    if len(names) != 1:
        return style.fail(prog, f"-f: expected one fleet file, got {len(names)}", style.EXIT_USAGE)
    try:
        if names[0] == "-":
            return parse_fleet(sys.stdin.read(), "stdin", Path.cwd())
        if is_node_list(names[0]):
            return node_list_fleet(names[0])
        return load_fleet(names[0])
    except ConfigError as error:
        return style.fail(prog, str(error), style.EXIT_USAGE)


def run(args: argparse.Namespace) -> int:
    from devplug.fleet import quiet_node_logs

    quiet_node_logs(getattr(args, "log_level", "info"))
    fleet = read_fleet(args.filename, "devplug fleet")
    if isinstance(fleet, int):
        return fleet
    if args.action == "check":
        return _check(fleet, args.output)
    from devplug.apiserver.client import FAILURES, explain, patience
    from devplug.fleet import connect
    from devplug.ground.extras import MissingExtra

    try:
        api = connect(args.kubeconfig, args.context, concurrency=args.concurrency)
    except ValueError as error:
        return _fail(str(error))
    except MissingExtra as error:
        return _fail(str(error), EXIT_FAILED)
    try:
        if args.action == "down":
            with patience(args.api_timeout):
                return asyncio.run(_down(api, fleet, args.output))
        return asyncio.run(_up(api, fleet, args))
    except KeyboardInterrupt:
        return 130
    except FAILURES as error:
        return _fail(explain(error), EXIT_FAILED)


def _emit(output: str, record: dict[str, Any], text: str) -> None:
    style.print_result(record, output, text=lambda: text)


def _check(fleet: Fleet, output: str) -> int:
    from devplug.fleet.hardware import build_pool

    folder = Path(tempfile.mkdtemp(prefix="devplug-fleet-"))
    try:
        for pool in fleet.pools:
            hardware = build_pool(pool, folder)
            plugins = hardware.capacity()
            drivers = {
                d.name: sum(x.healthy for x in d.plugin.devices.values()) for d in hardware.drivers
            }
            record = {
                "pool": pool.name,
                "nodes": len(pool.nodes),
                "first": pool.nodes[0],
                "last": pool.nodes[-1],
                "cpu": str(pool.spec.cpu),
                "memory": pool.spec.memory,
                "devicePlugins": plugins,
                "draDrivers": drivers,
            }
            served = ", ".join(
                [f"{k} {v}" for k, v in plugins.items()]
                + [f"{k} {v} (DRA)" for k, v in drivers.items()]
            )
            _emit(
                output,
                record,
                f"pool {pool.name}: {len(pool.nodes)} nodes {pool.nodes[0]} .. {pool.nodes[-1]},"
                f" cpu {pool.spec.cpu}, memory {pool.spec.memory};"
                f" each serves {served or 'nothing'}",
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return EXIT_OK


async def _down(api: Any, fleet: Fleet, output: str) -> int:
    from devplug.fleet.runner import remove_fleet

    async with api:
        removed = await remove_fleet(api, fleet.name)
    text = ", ".join(f"{n} {kind}" for kind, n in removed.items())
    _emit(output, {"event": "removed", "fleet": fleet.name, **removed}, f"removed {text}")
    return EXIT_OK


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def _up(api: Any, fleet: Fleet, args: argparse.Namespace) -> int:
    """Run the fleet until SIGINT or SIGTERM."""
    from devplug.ground.signals import stop_on_signals

    with stop_on_signals() as stop:
        return await _run_up(api, fleet, args, stop)


async def _run_up(api: Any, fleet: Fleet, args: argparse.Namespace, stop: asyncio.Event) -> int:
    from devplug.fleet.runner import FleetError, FleetRunner, Options

    own = args.work_dir is None
    folder = Path(tempfile.mkdtemp(prefix="devplug-fleet-")) if own else Path(args.work_dir)
    options = Options(
        lease_duration_s=args.lease_seconds,
        renew_s=args.renew_seconds,
        status_report_s=args.status_seconds,
        topology_policy=args.topology_policy,
    )
    rss_before = _rss_mib()
    try:
        async with api:
            runner = FleetRunner(fleet, api, folder, options)
            starting = asyncio.create_task(runner.start())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                return 130
            stopping.cancel()
            try:
                starting.result()
            except FleetError as error:
                return _fail(str(error), EXIT_FAILED)
            _ready(runner, args.output, rss_before)
            await runner.serve(stop)
            _stopped(runner, args.output)
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
    return EXIT_OK


def _ready(runner: FleetRunner, output: str, rss_before: float) -> None:
    counters = runner.counters
    record = {
        "event": "ready",
        "fleet": runner.fleet.name,
        "nodes": len(runner.nodes),
        "pools": len(runner.fleet.pools),
        "register_s": round(counters.register_s, 2),
        "api_calls": runner.api.calls,
        "rss_before_nodes_mib": rss_before,
        "rss_mib": _rss_mib(),
        "pid": os.getpid(),
    }
    _emit(
        output,
        record,
        f"fleet {runner.fleet.name}: {len(runner.nodes)} nodes in {len(runner.fleet.pools)} "
        f"pools registered in {counters.register_s:.1f} s (Ctrl-C stops; the nodes stay "
        "until `devplug fleet down`)",
    )


def _stopped(runner: FleetRunner, output: str) -> None:
    c = runner.counters
    times = os.times()
    record = {
        "event": "stopped",
        "admitted": c.admitted,
        "claims_prepared": c.claims_prepared,
        "rejected": c.rejected,
        "waiting": c.waiting,
        "deleted": c.deleted,
        "status_writes": c.status_writes,
        "lease_renewals": c.lease_renewals,
        "lease_failures": c.lease_failures,
        "lease_late": c.lease_late,
        "relists": c.relists,
        "claim_reads_s": round(c.claim_reads_s, 2),
        "admit_s": round(c.admit_s, 2),
        "api_calls": runner.api.calls,
        "cpu_s": round(times.user + times.system, 2),
        "rss_mib": _rss_mib(),
        "time": time.time(),
    }
    _emit(
        output,
        record,
        f"stopped: {c.admitted} pods admitted, {c.rejected} rejected, {c.deleted} deleted",
    )
