"""What a Kubernetes 1.38 API server refuses in a ResourceSlice that 1.36 and 1.37 let
through, checked on the bodies devplug builds: attribute and capacity names with more
than one '/' or an empty part, a node selector (of the slice or of a device) that is not
exactly one term, and `skipNodeOperations` values the API does not define. `devplug
check` runs it over every slice it would publish, so none of these reaches a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from devplug.kube.dranames import attribute_name_problem

# ResourceSliceSpec.skipNodeOperations values (resource.k8s.io/v1, 1.37).
SKIP_VALUES = frozenset({"NodePrepareResources", "NodeUnprepareResources", "*"})


def _selector_problem(selector: Mapping[str, Any] | None, at: str) -> Iterator[str]:
    if selector is None:
        return
    terms = selector.get("nodeSelectorTerms") or []
    if len(terms) != 1:
        yield f"{at}.nodeSelector: {len(terms)} terms, the API allows exactly one"


def slice_problems(body: Mapping[str, Any]) -> list[str]:
    """Each thing of `body` (a ResourceSlice) that a 1.38 API server refuses, in one
    line naming the slice, the field and the problem."""
    spec = body.get("spec") or {}
    name = (body.get("metadata") or {}).get("name", "?")
    found: list[str] = list(_selector_problem(spec.get("nodeSelector"), "spec"))
    skip = list(spec.get("skipNodeOperations") or [])
    if unknown := sorted(set(skip) - SKIP_VALUES):
        found.append(f"spec.skipNodeOperations: unknown {unknown}")
    if "NodePrepareResources" in skip and not {"NodeUnprepareResources", "*"} & set(skip):
        found.append("spec.skipNodeOperations: NodePrepareResources without NodeUnprepareResources")
    for k, device in enumerate(spec.get("devices") or []):
        at = f"spec.devices[{k}]"
        found += _selector_problem(device.get("nodeSelector"), at)
        for key in ("attributes", "capacity"):
            for attribute in device.get(key) or {}:
                if problem := attribute_name_problem(attribute):
                    found.append(f"{at}.{key}: {problem}")
    return [f"ResourceSlice {name}: {problem}" for problem in found]
