"""What "Beware of Fragmentation" (Weng et al., USENIX ATC '23) published on openb's
default trace, to read a run beside: means over seeds 42-51 of its simulator's runs
(GPU node list, workload inflated to 130 % of GPU capacity), from the paper and its
artifact's `experiments/analysis/expected_results` (hkust-adsl/kubernetes-scheduler-simulator).

Percentages are of the cluster's 6,212 GPUs; allocation by request.
"""

from __future__ import annotations

from collections.abc import Sequence

from devplug.placement import MILLI, Node
from devplug.placement.trace import TracePod

OPENB_NODES = 1213
OPENB_GPUS = 6212
OPENB_PODS = 8152

# policy of the paper -> allocated % at 100 % arrived, at 130 %, unallocated GPUs at
# 130 %, fragmented % at 100 % arrived
TABLE = {
    "Random fit": (86.3, 87.5, 778, 13.5),
    "Dot product": (90.6, 90.9, 568, 9.3),
    "GPU clustering": (91.7, 91.9, 504, 8.2),
    "GPU packing": (91.8, 92.0, 497, 8.1),
    "Best fit": (92.9, 93.1, 430, 7.1),
    "FGD": (95.2, 95.4, 286, 4.7),
}
# devplug's policy -> the paper's (devplug's packing is a packing of its own, the
# paper's GPU packing is the nearest)
SAME = {"bestfit": "Best fit", "fgd": "FGD", "packing": "GPU packing"}

# allocated % of GPU capacity against arrived GPU demand (% of capacity), per policy
ARRIVED = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 100, 110, 120, 130)
CURVES = {
    "Random fit": (0.25, 10.01, 20.0, 30.02, 40.01, 49.97, 59.73, 69.21, 78.66, 85.02, 85.72,
                   86.3, 86.88, 87.28, 87.47),
    "Dot product": (0.25, 10.01, 20.0, 30.02, 40.01, 50.01, 60.0, 70.0, 80.02, 89.98, 90.58,
                    90.62, 90.7, 90.77, 90.85),
    "GPU clustering": (0.25, 10.01, 20.0, 30.02, 40.01, 50.01, 60.0, 70.0, 80.02, 89.98, 91.61,
                       91.65, 91.73, 91.8, 91.88),
    "GPU packing": (0.25, 10.01, 20.0, 30.02, 40.01, 50.01, 60.0, 70.0, 80.02, 89.98, 91.74,
                    91.78, 91.86, 91.92, 92.0),
    "Best fit": (0.25, 10.01, 20.0, 30.02, 40.01, 50.01, 60.0, 70.0, 80.02, 89.99, 92.82,
                 92.86, 92.94, 93.0, 93.08),
    "FGD": (0.25, 10.01, 20.0, 30.02, 40.01, 50.01, 60.0, 70.0, 80.02, 89.98, 94.91, 95.23,
            95.3, 95.35, 95.39),
}  # fmt: skip


def is_openb_default(nodes: Sequence[Node], pods: Sequence[TracePod]) -> bool:
    """Whether the inputs are openb's GPU node list and default pod list (what the
    published numbers are for)."""
    return (
        len(nodes) == OPENB_NODES
        and sum(n.gpus for n in nodes) == OPENB_GPUS
        and len(pods) == OPENB_PODS
        and not any(p.demand.models for p in pods)
        and all(p.name.startswith("openb-pod-") for p in pods)
    )


def reference() -> dict[str, object]:
    """The published numbers as the report carries them."""
    return {
        "source": 'Weng et al., "Beware of Fragmentation", USENIX ATC \'23 (seeds 42-51)',
        "policies": {
            name: {
                "allocated_percent_at_100": row[0],
                "allocated_percent_at_130": row[1],
                "unallocated_gpus_at_130": row[2],
                "fragmented_percent_at_100": row[3],
            }
            for name, row in TABLE.items()
        },
        "same_as": SAME,
        "curves": {
            name: [[a, v] for a, v in zip(ARRIVED, values, strict=True)]
            for name, values in CURVES.items()
        },
        "gpus": OPENB_GPUS,
        "milli": MILLI,
    }
