"""Placement policies over device-level node state: which node a pod goes to, and which
of its GPUs, under the scheduler's default, best fit, packing or Fragmentation
Gradient Descent (docs/placement.md).

Pure Python with no I/O, no cluster and no clock: the planner (`devplug plan`) and a
scheduler extender make the same decision from the same state.
"""

from devplug.placement.fragmentation import TargetPod, TargetWorkload, cluster_fragmentation
from devplug.placement.placer import Choice, Placer
from devplug.placement.policies import POLICY_NAMES, Policy, make_policy
from devplug.placement.state import MILLI, REASONS, Demand, Node

__all__ = [
    "MILLI",
    "POLICY_NAMES",
    "REASONS",
    "Choice",
    "Demand",
    "Node",
    "Placer",
    "Policy",
    "TargetPod",
    "TargetWorkload",
    "cluster_fragmentation",
    "make_policy",
]
