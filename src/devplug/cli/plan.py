"""`devplug plan`: will a workload fit a fleet, and what is left stranded.

devplug plan -f fleet.yaml --workload pods.csv                  # the fit step
devplug plan -f fleet.yaml --workload jobs.yaml --kubeconfig K  # the real scheduler
devplug plan ... --vary replicas=1,4 --vary topologyPolicy=single-numa-node --html r.html
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from devplug.cli import style

EXIT_OK = style.EXIT_OK
EXIT_FAILED = style.EXIT_FAILED


def configure(parser: argparse.ArgumentParser) -> None:
    style.add_filenames(parser, "the fleet file (one)", required=True)
    parser.add_argument(
        "--workload",
        required=True,
        type=style.input_file,
        metavar="FILE",
        help="pods to place: Pod/Job/Deployment YAML, or a CSV of pods (.csv)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=style.file_path,
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
    style.add_output(parser)
    parser.add_argument(
        "--html",
        type=style.file_path,
        metavar="FILE",
        help="also write the report as a self-contained HTML page with plots",
    )


def _fail(message: str, code: int = style.EXIT_USAGE) -> int:
    return style.fail("devplug plan", message, code)


def run(args: argparse.Namespace) -> int:
    from devplug.fleet import quiet_node_logs

    quiet_node_logs(getattr(args, "log_level", "info"))
    from devplug.cli.fleet import read_fleet
    from devplug.plan.variants import KnobError, parse_vary
    from devplug.plan.workload import WorkloadError, load_workload

    fleet = read_fleet(args.filename, "devplug plan")
    if isinstance(fleet, int):
        return fleet
    try:
        workload = load_workload(args.workload)
        variants = parse_vary(args.vary)
    except (WorkloadError, KnobError) as error:
        return _fail(str(error))
    if args.html:
        from devplug.extras import require

        require("plotly", "report", "--html")
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
    from devplug.plan.report import report_text

    style.print_result(document, args.output, text=lambda: report_text(document))
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
