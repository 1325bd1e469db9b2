"""Placement policies on small clusters whose answers are worked out by hand, the
paper's fragmentation measure on hand-counted nodes, and the placer (which rescores
only changed nodes) against scoring every node for every pod."""

from __future__ import annotations

import random

import pytest

from devplug.placement import (
    REASONS,
    Demand,
    Node,
    Placer,
    TargetPod,
    TargetWorkload,
    make_policy,
)
from devplug.placement.policies import POLICY_NAMES, fgd_points
from devplug.placement.state import whole_gpus

SHARE = Demand(cpu=1000, gpus=1, gpu_milli=500)
WHOLE = Demand(cpu=1000, gpus=1, gpu_milli=1000)


def node(name: str, free: list[int], cpu: int = 8000, model: str = "T4", mem: int = 64) -> Node:
    return Node(name, cpu=cpu, memory=mem, model=model, gpu_free=list(free))


def halves() -> TargetWorkload:
    """Half the pods want half a GPU, half a whole GPU; one CPU each."""
    return TargetWorkload([TargetPod(SHARE, 1), TargetPod(WHOLE, 1)])


# -- the resource model ---------------------------------------------------------------


def test_a_share_of_a_gpu_is_a_share_of_one_gpu() -> None:
    with pytest.raises(ValueError, match="share of one GPU"):
        Demand(gpus=2, gpu_milli=500)
    with pytest.raises(ValueError, match="gpu_milli"):
        Demand(gpus=1, gpu_milli=0)
    # 300 + 400 free on two GPUs do not hold a share of 500
    assert node("n", [300, 400]).stage(SHARE) == REASONS.index("gpu share")
    assert node("n", [300, 500]).fits(SHARE)
    # a whole GPU is a fully free one
    assert node("n", [999, 999]).stage(WHOLE) == REASONS.index("whole gpus")
    assert [d.kind for d in (Demand(cpu=1), SHARE, WHOLE, Demand(gpus=8, gpu_milli=1000))] == [
        "cpu only",
        "share",
        "1 gpu",
        "8 gpus",
    ]


def test_checks_run_model_gpus_cpu_memory_in_that_order() -> None:
    v100 = Demand(cpu=1000, memory=8, gpus=1, gpu_milli=1000, models=frozenset({"V100"}))
    assert node("n", [1000]).stage(v100) == REASONS.index("gpu model")
    assert node("n", [1000], model="V100", cpu=500).stage(v100) == REASONS.index("cpu")
    assert node("n", [1000], model="V100", mem=4).stage(v100) == REASONS.index("memory")
    assert node("n", [], model="").stage(WHOLE) == REASONS.index("gpu model")
    assert node("n", [], model="").fits(Demand(cpu=1000))


# -- the fragmentation measure ------------------------------------------------------------


def test_fragmentation_counts_what_each_kind_of_pod_cannot_use() -> None:
    target = halves()
    # Both kinds fit; the GPU with 300 free holds neither: 300 of 1300 is fragmented.
    assert target.node(node("n", [1000, 300])) == pytest.approx(300)
    # A GPU with 500 free holds the share, not a whole-GPU pod: half of it counts.
    assert target.node(node("n", [1000, 500])) == pytest.approx(0.5 * 0 + 0.5 * 500)
    # Without the CPU neither kind fits: all 1300 free milli are fragmented.
    assert target.node(node("n", [1000, 300], cpu=500)) == pytest.approx(1300)
    # A pod without GPUs can use none of them; a model the pod refuses, none either.
    cpu_pod = Demand(cpu=1000)
    v100 = Demand(cpu=1000, gpus=1, gpu_milli=1000, models=frozenset({"V100"}))
    mixed = TargetWorkload([TargetPod(SHARE, 1), TargetPod(cpu_pod, 1), TargetPod(v100, 2)])
    # (the share cannot use the 300; the CPU pod and the V100 pod none of the 1300)
    assert mixed.node(node("n", [1000, 300])) == pytest.approx((300 + 1300 + 2 * 1300) / 4)
    # A node with nothing free has nothing fragmented.
    assert target.node(node("n", [0, 0])) == 0


def test_the_target_workload_is_the_most_popular_kinds_covering_95_percent() -> None:
    demands = [SHARE] * 60 + [WHOLE] * 36 + [Demand(cpu=1)] * 3 + [Demand(cpu=2)]
    target = TargetWorkload.of(demands)
    assert [(p.demand.kind, round(p.popularity, 4)) for p in target.pods] == [
        ("share", round(60 / 96, 4)),
        ("1 gpu", round(36 / 96, 4)),
    ]


# -- the policies, by hand ---------------------------------------------------------------------


def choose(policy: str, nodes: list[Node], demand: Demand) -> tuple[str, tuple[int, ...]]:
    placer = Placer(nodes, make_policy(policy, nodes, halves()))
    choice = placer.choose(demand)
    assert choice is not None
    return nodes[choice.node].name, choice.gpus


def test_fgd_puts_a_share_where_fragmentation_grows_least() -> None:
    # n0 [1000, 1000]: the share on a GPU leaves 500 the whole-GPU pods cannot use
    # (growth 250 milli, 43 points). n1 [600, 1000]: on the 600 GPU, 100 is left that
    # neither kind uses, but the 600 no whole-GPU pod could use is gone (growth -200,
    # 54 points); on its whole GPU the growth is 250 (43 points).
    assert fgd_points(250) == 43
    assert fgd_points(-200) == 54
    nodes = [node("n0", [1000, 1000]), node("n1", [600, 1000])]
    assert choose("fgd", nodes, SHARE) == ("n1", (0,))
    # best fit and packing agree here; the scheduler's default spreads by CPU and memory
    # (equal), so the first node, and its first GPU with room.
    assert choose("bestfit", nodes, SHARE) == ("n1", (0,))
    assert choose("packing", nodes, SHARE) == ("n1", (0,))
    assert choose("default", nodes, SHARE) == ("n0", (0,))


def test_best_fit_takes_the_node_left_with_least_and_the_default_the_emptiest() -> None:
    nodes = [node("roomy", [1000], cpu=8000), node("tight", [1000], cpu=2000)]
    assert choose("bestfit", nodes, WHOLE) == ("tight", (0,))
    assert choose("default", nodes, WHOLE) == ("roomy", (0,))
    # best fit counts the GPUs too: fewer GPUs left outweighs a little more CPU
    nodes = [node("big", [1000] * 8, cpu=4000), node("small", [1000, 1000], cpu=5000)]
    assert choose("bestfit", nodes, WHOLE) == ("small", (0,))


def test_packing_fills_used_gpus_then_used_nodes_then_the_smallest_empty_node() -> None:
    nodes = [node("empty8", [1000] * 8), node("empty2", [1000, 1000]), node("used", [1000, 0])]
    assert choose("packing", nodes, WHOLE) == ("used", (0,))
    nodes = [node("empty8", [1000] * 8), node("empty2", [1000, 1000])]
    assert choose("packing", nodes, WHOLE) == ("empty2", (0,))
    nodes = [node("whole", [1000, 0]), node("shared", [0, 700])]
    assert choose("packing", nodes, SHARE) == ("shared", (1,))


def test_whole_gpus_are_whole_free_ones_and_a_refused_pod_gets_its_reason() -> None:
    nodes = [node("a", [500, 1000, 1000]), node("b", [1000, 1000], cpu=500)]
    placer = Placer(nodes, make_policy("bestfit", nodes, None))
    pair = Demand(cpu=1000, gpus=2, gpu_milli=1000)
    choice = placer.place(pair)
    assert choice is not None
    assert (choice.node, choice.gpus) == (0, (1, 2))
    assert nodes[0].gpu_free == [500, 0, 0]
    assert nodes[0].cpu_free == 7000
    # now only b has two whole GPUs, and not the CPU: the furthest check passed is cpu
    assert placer.place(pair) is None
    assert placer.reason(pair) == "cpu"
    assert placer.reason(Demand(cpu=1, gpus=1, gpu_milli=600, models=frozenset({"A"}))) == (
        "gpu model"
    )


def test_whole_gpus_stay_in_one_nvlink_group_then_one_numa_node() -> None:
    """Two NVLink groups of four (0-3, 4-7), GPUs 1 and 2 taken: a pair goes to the group
    with fewer free GPUs (0 and 3), keeping 4-7 whole for a pod of four; four go to 4-7,
    not the first four free. Without links, one NUMA node; without either, the first."""
    links = [0, 0, 0, 0, 4, 4, 4, 4]
    free = [1000, 0, 0, 1000, 1000, 1000, 1000, 1000]
    pair, four = Demand(gpus=2, gpu_milli=1000), Demand(gpus=4, gpu_milli=1000)
    eight = Node("n", 64000, 512, "H100", list(free), gpu_link=links, gpu_numa=[0] * 8)
    placer = Placer([eight], make_policy("bestfit", [eight], None))
    assert [getattr(placer.place(d), "gpus", None) for d in (pair, four)] == [
        (0, 3),
        (4, 5, 6, 7),
    ]
    numa = Node("n", 64000, 512, "H100", [0, 1000, 1000, 1000], gpu_link=[-1] * 4,
                gpu_numa=[0, 0, 1, 1])  # fmt: skip
    assert whole_gpus(numa, 2) == (2, 3)
    assert whole_gpus(Node("n", 1, 1, "H100", [0, 1000, 1000, 1000]), 2) == (1, 2)
    # no group holds them: the first free ones
    assert whole_gpus(numa, 3) == (1, 2, 3)


def test_fgd_needs_a_target_workload_and_names_are_checked() -> None:
    with pytest.raises(ValueError, match="target workload"):
        make_policy("fgd", [], None)
    with pytest.raises(ValueError, match="unknown policy 'worst'"):
        make_policy("worst", [], None)


# -- the placer against scoring every node ---------------------------------------------------


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_the_placer_picks_what_scoring_every_node_picks(policy: str) -> None:
    rng = random.Random(7)
    kinds = [
        Demand(cpu=rng.choice([500, 2000, 6000]), memory=rng.choice([1, 8]), gpus=1,
               gpu_milli=rng.choice([100, 250, 500, 700]))
        for _ in range(6)
    ] + [Demand(cpu=2000, memory=4, gpus=g, gpu_milli=1000) for g in (1, 2, 4)] + [
        Demand(cpu=3000, memory=2), Demand(cpu=1000, gpus=1, gpu_milli=1000,
                                           models=frozenset({"T4"}))
    ]  # fmt: skip
    pods = [rng.choice(kinds) for _ in range(400)]

    def cluster() -> list[Node]:
        return [
            node(f"n{i}", [1000] * rng.choice([1, 2, 4, 8]), cpu=rng.choice([16000, 32000]),
                 model=rng.choice(["T4", "P100"]), mem=rng.choice([32, 64]))
            for i in range(12)
        ]  # fmt: skip

    target = TargetWorkload.of(pods)
    fast, slow = cluster(), None
    slow = [Node(n.name, n.cpu, n.memory, n.model, list(n.gpu_free)) for n in fast]
    placer = Placer(fast, make_policy(policy, fast, target))
    reference = make_policy(policy, slow, target)
    placed = 0
    for pod in pods:
        scored = [(reference.score(n, pod), i) for i, n in enumerate(slow) if n.fits(pod)]
        choice = placer.place(pod)
        if not scored:
            assert choice is None
            continue
        _, index = max(scored, key=lambda s: (s[0], -s[1]))
        gpus = reference.gpus(slow[index], pod)
        assert choice is not None
        assert (choice.node, choice.gpus) == (index, gpus)
        slow[index].take(pod, gpus)
        placed += 1
    assert [n.gpu_free for n in fast] == [n.gpu_free for n in slow]
    assert 50 < placed < len(pods)  # the cluster filled up: refusals were checked too
