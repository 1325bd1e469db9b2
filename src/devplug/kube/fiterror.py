"""The scheduler's FitError message for a pod that no node fits ('0/3 nodes are
available: 3 Insufficient example.com/gpu.'), as the cluster view and the planner's fit
step both print it."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence


def fit_error(total_nodes: int, unfit: Mapping[str, Sequence[str]]) -> str:
    """The scheduler's FitError message for a pod no node fits."""
    histogram = collections.Counter(reason for reasons in unfit.values() for reason in reasons)
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    message = f"0/{total_nodes} nodes are available:"
    if parts:
        message += " " + ", ".join(parts) + "."
    return message
