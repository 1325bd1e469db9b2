"""`devplug plan`: will a workload fit a fleet, and what is left stranded.

devplug plan -f fleet.yaml --workload pods.csv                  # the fit step
devplug plan -f fleet.yaml --workload jobs.yaml --kubeconfig K  # the real scheduler
devplug plan ... --vary replicas=1,4 --vary topologyPolicy=single-numa-node --html r.html
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, metavar="FILE", help="the fleet file")
    parser.add_argument(
        "--workload",
        required=True,
        metavar="FILE",
        help="pods to place: Pod/Job/Deployment YAML, or a CSV of pods (.csv)",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="place the pods with the real kube-scheduler of this cluster (the fleet is "
        "registered there for each run, and removed after); without it, the fit step",
    )
    parser.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KNOB=V1[,V2...]",
        help="one more run per value: topologyPolicy, preferredAllocation, replicaPolicy, "
        "replicas, migStrategy, mode (repeatable)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text: tables for people; json: the whole report as one JSON object",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as a self-contained HTML page with plots",
    )


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"devplug plan: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from devplug.fleet import quiet_node_logs

    quiet_node_logs(getattr(args, "log_level", "info"))
    from devplug.fleet.spec import load_fleet
    from devplug.plan.variants import KnobError, parse_vary
    from devplug.plan.workload import WorkloadError, load_workload
    from devplug.sources import ConfigError

    try:
        fleet = load_fleet(args.filename)
        workload = load_workload(args.workload)
        variants = parse_vary(args.vary)
    except (ConfigError, WorkloadError, KnobError) as error:
        return _fail(str(error))
    if args.html:
        try:
            import plotly  # noqa: F401
        except ImportError:
            return _fail("--html needs plotly: pip install 'devplug[report]'")
    api: Any = None
    if args.kubeconfig:
        from devplug.fleet.kube import KubeApi

        try:
            api = KubeApi.from_kubeconfig(args.kubeconfig)
        except ValueError as error:
            return _fail(str(error))
    folder = Path(tempfile.mkdtemp(prefix="devplug-plan-"))
    try:
        document = asyncio.run(_runs(fleet, workload, variants, folder, api))
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # the fleet could not start (FleetError), an API failure
        return _fail(f"{type(error).__name__}: {error}", EXIT_FAILED)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.html:
        from devplug.plan.html import report_html

        try:
            Path(args.html).write_text(report_html(document), encoding="utf-8")
        except OSError as error:
            return _fail(f"--html {args.html}: {error.strerror}", EXIT_FAILED)
    if args.output == "json":
        print(json.dumps(document))
    else:
        from devplug.plan.report import report_text

        print(report_text(document))
    return EXIT_OK


async def _runs(
    fleet: Any, workload: Any, variants: list[Any], folder: Path, api: Any
) -> dict[str, Any]:
    from devplug.plan.engine import ENGINE_FIT, ENGINE_SCHEDULER, run_fit, run_scheduler
    from devplug.plan.report import report_document, summarize

    summaries = []
    if api is None:
        for index, variant in enumerate(variants):
            result = await run_fit(fleet, workload, variant, folder / str(index))
            summaries.append(summarize(result))
        engine = ENGINE_FIT
    else:
        async with api:
            for index, variant in enumerate(variants):
                result = await run_scheduler(fleet, workload, variant, folder / str(index), api)
                summaries.append(summarize(result))
        engine = ENGINE_SCHEDULER
    return report_document(fleet.name, workload.source, engine, summaries)
