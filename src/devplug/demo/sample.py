"""The demo's sample pods (package data), with what the demo says of each, and the
resources of the config described in words."""

from __future__ import annotations

import importlib.resources
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from devplug.sources import ResourceSpec

STORY_ANNOTATION = "demo.devplug.io/story"


def sample_pods() -> str:
    """The YAML of the pods the demo applies (package data)."""
    return importlib.resources.files("devplug.demo").joinpath("pods.yaml").read_text()


def stories(manifests: str) -> dict[str, str]:
    """Pod name -> what the demo says about it (its story annotation)."""
    found = {}
    for doc in yaml.safe_load_all(manifests):
        if not isinstance(doc, dict):
            continue
        meta = doc.get("metadata") or {}
        found[str(meta.get("name"))] = str(
            (meta.get("annotations") or {}).get(STORY_ANNOTATION, "")
        )
    return found


def describe(spec: ResourceSpec) -> str:
    """What a resource of the config serves, in words."""
    if spec.virtual is not None:
        what = f"{spec.virtual} virtual device{'s' if spec.virtual > 1 else ''}"
        if spec.count == 1:
            what += " (no device node)"
    else:
        groups = [" + ".join(p.path for p in g.paths) for g in spec.groups or []]
        if len(groups) == 1:
            shared = f" shared by up to {spec.count} containers" if spec.count > 1 else ""
            return f"{groups[0]}, one device{shared}"
        what = "; ".join(groups)
    if spec.count > 1:
        what += f", each shared by up to {spec.count} containers"
    return what
