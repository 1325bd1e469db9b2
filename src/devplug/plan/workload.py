"""A workload for a capacity run: pods, from Kubernetes YAML or from a CSV of pods.

YAML: Pods (`devplug.io/count` annotation: that many copies, default 1), Jobs
(`spec.parallelism` pods of the template, default 1), Deployments, ReplicaSets and
StatefulSets (`spec.replicas`). CSV: one row per pod (or per `count` pods) with the
columns `name`, `count`, `cpu`, `memory`, `gpus` (whole GPUs), `gpuShare` (a fraction of
one GPU: the pod takes one shared unit, a time-sliced replica or, with MIG, the
smallest MIG device of at least that share of the GPU's memory) and `gpuModel` (the
`nvidia.com/gpu.product` label the node must have); every column but one of `cpu`,
`memory`, `gpus`, `gpuShare` may be left out.

Bad input is one WorkloadError line naming the file, the document or row, and the field.
"""

from __future__ import annotations

import copy
import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devplug.ground import inputs
from devplug.kube.quantity import QuantityError, parse_quantity

COUNT_ANNOTATION = "devplug.io/count"
GPU = "nvidia.com/gpu"
MAX_PODS = 100_000
CSV_COLUMNS = ("name", "count", "cpu", "memory", "gpus", "gpushare", "gpumodel")
_TEMPLATED = {"Job": "parallelism", "Deployment": "replicas", "ReplicaSet": "replicas",
              "StatefulSet": "replicas"}  # fmt: skip


class WorkloadError(Exception):
    """The workload cannot be used; the message is one line."""


@dataclass(frozen=True)
class Workload:
    """The pods to place, in order (names unique), and where they came from."""

    source: str
    pods: list[dict[str, Any]]
    # pods of a CSV row that ask for a share of a GPU: pod name -> the share
    shares: dict[str, float] = field(default_factory=dict)


def load_workload(path: str) -> Workload:
    """The workload of a file ('-': YAML on stdin)."""
    try:
        text = inputs.read_text(path, inputs.LARGE_LIMITS, what="the workload")
    except inputs.InputError as error:
        raise WorkloadError(str(error)) from None
    if path == "-":
        return parse_yaml(text, "stdin")
    if path.endswith(".csv"):
        return parse_csv(text, path)
    return parse_yaml(text, path)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise WorkloadError(f"{where}: expected a whole number, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise WorkloadError(f"{where}: expected a whole number, got {value!r}") from None
    if not 0 <= number <= MAX_PODS:
        raise WorkloadError(f"{where}: expected 0 to {MAX_PODS}, got {number}")
    return number


def parse_yaml(text: str, source: str) -> Workload:
    try:
        loaded = inputs.load_yaml_all(text, source, inputs.LARGE_LIMITS)
    except inputs.InputError as error:
        raise WorkloadError(str(error)) from None
    documents = [d for d in loaded if d is not None]
    pods: list[dict[str, Any]] = []
    for index, doc in enumerate(documents):
        where = f"{source}: document {index + 1}"
        if not isinstance(doc, Mapping):
            raise WorkloadError(f"{where}: expected a Kubernetes object")
        kind = doc.get("kind")
        meta = doc.get("metadata") or {}
        name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
        if not name:
            raise WorkloadError(f"{where}: metadata.name: required")
        where = f"{where} ({kind} {name})"
        if kind == "Pod":
            annotations = meta.get("annotations") or {}
            copies = _count(annotations.get(COUNT_ANNOTATION, 1), f"{where}: {COUNT_ANNOTATION}")
            template: Mapping[str, Any] = {"metadata": meta, "spec": doc.get("spec") or {}}
        elif kind in _TEMPLATED:
            spec = doc.get("spec") or {}
            key = _TEMPLATED[kind]
            copies = _count(spec.get(key, 1), f"{where}: spec.{key}")
            template = spec.get("template") or {}
            if not isinstance(template, Mapping) or not template.get("spec"):
                raise WorkloadError(f"{where}: spec.template.spec: required")
        else:
            raise WorkloadError(
                f"{where}: kind {kind!r}: expected Pod, Job, Deployment, ReplicaSet or StatefulSet"
            )
        if not (template.get("spec") or {}).get("containers"):
            raise WorkloadError(f"{where}: spec.containers: required")
        for k in range(copies):
            pods.append(_copy(template, name if copies == 1 else f"{name}-{k}"))
        if len(pods) > MAX_PODS:
            raise WorkloadError(f"{source}: more than {MAX_PODS} pods")
    if not pods:
        raise WorkloadError(f"{source}: no pods")
    _unique(pods, source)
    return Workload(source, pods)


def _copy(template: Mapping[str, Any], name: str) -> dict[str, Any]:
    meta = dict(template.get("metadata") or {})
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != COUNT_ANNOTATION
    }
    labels = dict(meta.get("labels") or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": copy.deepcopy(dict(template.get("spec") or {})),
    }


def _unique(pods: Sequence[Mapping[str, Any]], source: str) -> None:
    seen: set[str] = set()
    for pod in pods:
        name = pod["metadata"]["name"]
        if name in seen:
            raise WorkloadError(f"{source}: pod {name!r} comes twice")
        seen.add(name)


def parse_csv(text: str, source: str) -> Workload:
    try:
        return _parse_csv(text, source)
    except csv.Error as error:  # a field over csv's 128 KiB, a quote left open...
        raise WorkloadError(f"{source}: invalid CSV: {error}") from None


def _parse_csv(text: str, source: str) -> Workload:
    inputs.check_text(text, source, inputs.LARGE_LIMITS)
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip().lower() for c in reader.fieldnames or []]
    unknown = [c for c in columns if c.replace("_", "") not in CSV_COLUMNS]
    if unknown:
        raise WorkloadError(
            f"{source}: column {unknown[0]!r}: expected columns among "
            "name, count, cpu, memory, gpus, gpuShare, gpuModel"
        )
    pods: list[dict[str, Any]] = []
    shares: dict[str, float] = {}
    for number, raw in enumerate(reader, start=2):
        row = {k.strip().lower().replace("_", ""): (v or "").strip() for k, v in raw.items() if k}
        where = f"{source}: row {number}"
        name = row.get("name") or f"pod-{number - 1}"
        copies = _count(row.get("count") or 1, f"{where}: count")
        requests: dict[str, str] = {}
        for column in ("cpu", "memory"):
            if row.get(column):
                try:
                    parse_quantity(row[column])
                except QuantityError as error:
                    raise WorkloadError(f"{where}: {column}: {error}") from None
                requests[column] = row[column]
        limits: dict[str, Any] = {}
        gpus = _count(row.get("gpus") or 0, f"{where}: gpus")
        share = _share(row.get("gpushare", ""), f"{where}: gpuShare")
        if gpus and share:
            raise WorkloadError(f"{where}: gpus and gpuShare: a pod asks for one of them")
        if gpus:
            limits[GPU] = gpus
        if share:
            limits[GPU] = 1
        container: dict[str, Any] = {"name": "main", "image": "registry.example/workload:1"}
        if requests or limits:
            container["resources"] = {
                k: v for k, v in (("requests", requests), ("limits", limits)) if v
            }
        spec: dict[str, Any] = {"containers": [container]}
        if row.get("gpumodel"):
            spec["nodeSelector"] = {"nvidia.com/gpu.product": row["gpumodel"]}
        if GPU in limits:
            spec["tolerations"] = [{"key": GPU, "operator": "Exists"}]
        for k in range(copies):
            pod_name = name if copies == 1 else f"{name}-{k}"
            pods.append(_copy({"metadata": {}, "spec": spec}, pod_name))
            if share:
                shares[pod_name] = share
    if not pods:
        raise WorkloadError(f"{source}: no pods")
    _unique(pods, source)
    return Workload(source, pods, shares)


def _share(value: str, where: str) -> float:
    if not value:
        return 0.0
    try:
        share = float(value)
    except ValueError:
        raise WorkloadError(f"{where}: expected a number between 0 and 1, got {value!r}") from None
    if not 0 < share < 1 or math.isnan(share):
        raise WorkloadError(f"{where}: expected a number between 0 and 1, got {value!r}")
    return share
