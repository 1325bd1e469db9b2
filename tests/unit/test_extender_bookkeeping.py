"""The extender cache's bookkeeping, fed as its watches would feed it (no API server):
a bind assumed until the watch shows it, dropped when a list no longer has the pod;
a pod placed by its GPUs alone following the node that publishes them."""

from __future__ import annotations

import copy
from typing import Any

from devplug.extender.cache import Cache
from tests.unit.test_extender_state import inventory, node_object, pod_object


def fed(*nodes: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> Cache:
    cache = Cache(source=None)  # never started: fed by hand
    cache.replace("nodes", list(nodes))
    cache.replace("pods", pods or [])
    return cache


def free(cache: Cache, node: str) -> list[int]:
    view = cache.node_view(node)
    assert view is not None
    return list(view.node.gpu_free)


def test_a_bind_counts_until_the_watch_shows_it_and_is_dropped_when_the_pod_is_gone() -> None:
    pod = pod_object("p", 600)
    cache = fed(node_object("n1", inventory("g0", "g1")), pods=[pod])
    assert cache.synced
    cache.assume(pod, "n1", ["g1"])
    assert free(cache, "n1") == [1000, 400]
    # An older version of the pod (before the bind) does not undo the assumption.
    cache.apply("pods", "MODIFIED", copy.deepcopy(pod))
    assert (cache.assumed, free(cache, "n1")) == (1, [1000, 400])
    # A list still without the bind keeps it; a list without the pod drops it.
    cache.replace("pods", [pod])
    assert (cache.assumed, free(cache, "n1")) == (1, [1000, 400])
    cache.replace("pods", [])
    assert (cache.assumed, free(cache, "n1")) == (0, [1000, 1000])


def test_the_watch_showing_the_bind_confirms_it() -> None:
    pod = pod_object("p", 600)
    cache = fed(node_object("n1", inventory("g0", "g1")), pods=[pod])
    cache.assume(pod, "n1", ["g0"])
    cache.apply("pods", "MODIFIED", pod_object("p", 600, assigned="g0"))
    assert (cache.assumed, free(cache, "n1")) == (0, [400, 1000])
    cache.apply("pods", "DELETED", pod_object("p", 600, assigned="g0"))
    assert free(cache, "n1") == [1000, 1000]


def test_a_pod_placed_by_its_gpus_alone_follows_the_node_that_publishes_them() -> None:
    unbound = pod_object("p", 300, assigned="g9")  # its binding under way
    cache = fed(
        node_object("n1", inventory("g0")), node_object("n2", inventory("g1")), pods=[unbound]
    )
    assert (free(cache, "n1"), free(cache, "n2")) == ([1000], [1000])  # nobody has g9
    cache.apply("nodes", "MODIFIED", node_object("n2", inventory("g1", "g9")))
    assert free(cache, "n2") == [1000, 700]
    cache.apply("nodes", "MODIFIED", node_object("n2", inventory("g1")))
    cache.apply("nodes", "MODIFIED", node_object("n1", inventory("g0", "g9")))
    assert (free(cache, "n1"), free(cache, "n2")) == ([1000, 700], [1000])
    cache.apply("nodes", "DELETED", node_object("n1", inventory("g0", "g9")))
    assert cache.node_view("n1") is None
    assert "n1" not in cache.cluster().nodes
