"""`devplug plan`: will a workload fit a fleet, and what is left stranded.

devplug plan -f fleet.yaml --workload pods.csv                  # the fit step
devplug plan -f fleet.yaml --workload jobs.yaml --kubeconfig K  # the real scheduler
devplug plan ... --vary replicas=1,4 --vary topologyPolicy=single-numa-node --html r.html
devplug plan --nodes nodes.csv --workload pods.csv --policy bestfit,fgd --seed 42,43,44
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


POLICIES = ("default", "bestfit", "packing", "fgd")
DEFAULT_SEEDS = "42"
DEFAULT_INFLATE = 130.0


class _Listed(style.OptionType):
    """A comma-separated list of values, each checked by `item` (an OptionType) or one
    of `choices`."""

    def __init__(self, what: str, choices: tuple[str, ...] = (), item: Any = None) -> None:
        self.what, self.choices, self.item = what, choices, item
        self.__name__ = what

    def __call__(self, text: str) -> list[Any]:
        values: list[Any] = []
        for part in text.split(","):
            if self.choices and part not in self.choices:
                raise argparse.ArgumentTypeError(f"expected {self.what}, got {part!r}")
            values.append(self.item(part) if self.item else part)
        return values

    def bad_examples(self, scratch: Path) -> list[str]:
        return ["x", "1,,2"] if self.item else ["x", f"{self.choices[0]},x"]


policies = _Listed(f"policies among {', '.join(POLICIES)}, separated by commas", POLICIES)
seeds = _Listed(
    "seeds separated by commas", item=style.Number(int, 0, "a seed, a whole number, 0 or more")
)
percent = style.Number(float, 0, "a percentage, 0 or more (0: the pod list as it is)")


def configure(parser: argparse.ArgumentParser) -> None:
    style.add_filenames(parser, "the fleet file (one; or --nodes)")
    parser.add_argument(
        "--workload",
        required=True,
        type=style.input_file,
        metavar="FILE",
        help="pods to place: Pod/Job/Deployment YAML, or a CSV of pods (.csv); with "
        "--nodes, a trace pod list (columns name, cpu_milli, memory_mib, num_gpu, "
        "gpu_milli, gpu_spec)",
    )
    parser.add_argument(
        "--nodes",
        type=style.input_file,
        metavar="FILE",
        help="a trace node list (CSV: sn, cpu_milli, memory_mib, gpu, model) instead of a "
        "fleet: the trace's pods are placed GPU by GPU with --policy (docs/placement.md)",
    )
    parser.add_argument(
        "--policy",
        type=policies,
        metavar="P[,P...]",
        help=f"with --nodes: placement policies, one run each: {', '.join(POLICIES)} "
        "(default: all)",
    )
    parser.add_argument(
        "--seed",
        type=seeds,
        metavar="N[,N...]",
        help=f"with --nodes: shuffle the pods with each seed, one run each "
        f"(default: {DEFAULT_SEEDS})",
    )
    parser.add_argument(
        "--inflate",
        type=percent,
        metavar="PERCENT",
        help="with --nodes: add copies of random pods until the GPU request is this share "
        f"of GPU capacity, or draw pods out while above (0: as listed; default: "
        f"{DEFAULT_INFLATE:g})",
    )
    style.add_kubeconfig(
        parser,
        "place the pods with the real kube-scheduler of this cluster (the fleet is "
        "registered there for each run, and removed after); without it, the fit step",
    )
    style.add_api_timeout(parser)
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


def _run_trace(args: argparse.Namespace) -> int:
    from devplug.placement.trace import TraceError, is_pod_list
    from devplug.plan.replay import plan_trace
    from devplug.plan.trace_report import trace_text

    if args.filename or args.kubeconfig or args.vary:
        return _fail("--nodes places a trace by itself: no -f, --kubeconfig or --vary with it")
    if not is_pod_list(args.workload):
        return _fail(
            f"{args.workload}: not a trace pod list: --nodes needs the columns name, "
            "cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec"
        )
    if args.html:
        try:
            import plotly  # noqa: F401
        except ImportError:
            return _fail("--html needs plotly: pip install 'devplug[report]'")
    try:
        document = plan_trace(
            args.nodes,
            args.workload,
            args.policy or list(POLICIES),
            args.seed or seeds(DEFAULT_SEEDS),
            DEFAULT_INFLATE if args.inflate is None else args.inflate,
        )
    except TraceError as error:
        return _fail(str(error))
    if args.html:
        from devplug.plan.html import trace_html

        try:
            Path(args.html).write_text(trace_html(document), encoding="utf-8")
        except OSError as error:
            return _fail(f"--html {args.html}: {error.strerror}", EXIT_FAILED)
    style.print_result(document, args.output, text=lambda: trace_text(document))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.nodes:
        return _run_trace(args)
    if args.policy or args.seed or args.inflate is not None:
        return _fail("--policy, --seed and --inflate place a trace: they need --nodes")
    from devplug.fleet import quiet_node_logs

    quiet_node_logs(getattr(args, "log_level", "info"))
    from devplug.cli.fleet import read_fleet
    from devplug.placement.trace import is_pod_list
    from devplug.plan.variants import KnobError, parse_vary
    from devplug.plan.workload import WorkloadError, load_workload

    fleet = read_fleet(args.filename, "devplug plan")
    if isinstance(fleet, int):
        return fleet
    if args.workload.endswith(".csv") and is_pod_list(args.workload):
        return _fail(f"{args.workload}: a trace pod list: give its node list with --nodes")
    try:
        workload = load_workload(args.workload)
        variants = parse_vary(args.vary)
    except (WorkloadError, KnobError) as error:
        return _fail(str(error))
    if args.html:
        from devplug.ground.extras import require

        require("plotly", "report", "--html")
    api: Any = None
    if args.kubeconfig or args.context:
        from devplug.fleet import connect
        from devplug.ground.extras import MissingExtra

        try:
            api = connect(args.kubeconfig, args.context)
        except ValueError as error:
            return _fail(str(error))
        except MissingExtra as error:
            return _fail(str(error), EXIT_FAILED)
    from devplug.apiserver.client import FAILURES, explain, patience

    folder = Path(tempfile.mkdtemp(prefix="devplug-plan-"))
    try:
        with patience(args.api_timeout):
            document = asyncio.run(_runs(fleet, workload, variants, folder, api))
    except KeyboardInterrupt:
        return 130
    except FAILURES as error:
        return _fail(explain(error), EXIT_FAILED)
    except Exception as error:  # the fleet could not start (FleetError)
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
