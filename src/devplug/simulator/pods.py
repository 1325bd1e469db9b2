"""Pod manifests: YAML documents of kind Pod (or a List of them) reduced to what the
device manager reads, with the API server's checks on extended resources.

The kubelet only ever sees pods the API server accepted, so the checks the API server
makes on extended resources (integer quantities, requests equal to limits, limits set)
are made here and reported the way it reports them: reason `Invalid`, message
`Pod "name" is invalid: <field>: <problem>`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from devplug.kube.names import is_dns_label, is_dns_subdomain, resource_name_problem
from devplug.kube.quantity import QuantityError, parse_quantity
from devplug.kube.requests import pod_requests

DEFAULT_NAMESPACE = "default"


class ManifestError(ValueError):
    """The input is not YAML, or holds something other than pods."""


def _show(value: object) -> str:
    return str(value)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    init: bool = False
    # An init container with restartPolicy Always (a sidecar): it keeps its devices.
    restartable: bool = False
    # extended resource -> count (the limit, which the API server made equal to the request)
    devices: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    namespace: str
    uid: str
    init_containers: tuple[ContainerSpec, ...]
    containers: tuple[ContainerSpec, ...]
    manifest: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def all_containers(self) -> tuple[ContainerSpec, ...]:
        """Init containers first, then app containers: the order the kubelet admits them."""
        return self.init_containers + self.containers

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class InvalidPod:
    """A pod document the API server would refuse; `message` is its answer."""

    name: str
    namespace: str
    message: str


def load_documents(
    source: str | Mapping[str, Any] | Sequence[Mapping[str, Any]], name: str = "<pods>"
) -> list[Any]:
    """The YAML documents of `source` (text, `name` in an error), or `source` itself (dicts)."""
    if isinstance(source, str):
        from devplug.ground import inputs

        try:
            documents = inputs.load_yaml_all(source, name, inputs.LARGE_LIMITS)
        except inputs.InputError as error:
            raise ManifestError(str(error)) from None
        return [d for d in documents if d is not None]
    if isinstance(source, Mapping):
        return [source]
    return list(source)


def parse_pods(
    source: str | Mapping[str, Any] | Sequence[Mapping[str, Any]], name: str = "<pods>"
) -> list[PodSpec | InvalidPod]:
    """Pods from YAML text or dicts: kind Pod, several per text, or kind List of pods.
    A ManifestError starts with `name`, the text's file."""
    pods: list[PodSpec | InvalidPod] = []
    for index, doc in enumerate(_flatten(load_documents(source, name))):
        if not isinstance(doc, Mapping):
            raise ManifestError(f"{name}: document {index + 1} is not a mapping")
        kind = doc.get("kind", "Pod")
        if kind != "Pod":
            raise ManifestError(
                f"{name}: document {index + 1}: kind {kind!r} is not supported, only Pod"
            )
        pods.append(parse_pod(doc))
    return pods


def _flatten(docs: Iterable[Any]) -> Iterable[Any]:
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == "List":
            yield from _flatten(doc.get("items") or [])
        else:
            yield doc


def parse_pod(doc: Mapping[str, Any]) -> PodSpec | InvalidPod:
    """One pod manifest, or the API server's refusal of it."""
    meta = doc.get("metadata") or {}
    name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
    namespace = (
        str(meta.get("namespace") or DEFAULT_NAMESPACE)
        if isinstance(meta, Mapping)
        else DEFAULT_NAMESPACE
    )
    problems: list[str] = []
    if not name:
        problems.append("metadata.name: Required value: name or generateName is required")
    elif not is_dns_subdomain(name):
        problems.append(
            f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must "
            "consist of lower case alphanumeric characters, '-' or '.', and must start and "
            "end with an alphanumeric character"
        )
    if not is_dns_label(namespace):
        problems.append(f"metadata.namespace: Invalid value: {namespace!r}: not a DNS label")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    init = _containers(spec.get("initContainers"), "spec.initContainers", True, problems)
    app = _containers(spec.get("containers"), "spec.containers", False, problems)
    if not app:
        problems.append("spec.containers: Required value")
    names = [c.name for c in init + app if c.name]
    for duplicate in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"spec.containers[*].name: Duplicate value: {duplicate!r}")
    if problems:
        detail = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        return InvalidPod(name, namespace, f'Pod "{name}" is invalid: {detail}')
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    backed = dra_backed_resources(doc)
    if backed:
        init = [_without(c, backed) for c in init]
        app = [_without(c, backed) for c in app]
    return PodSpec(
        name=name,
        namespace=namespace,
        uid=str(uid) if uid else str(uuid.uuid4()),
        init_containers=tuple(init),
        containers=tuple(app),
        manifest=dict(doc),
    )


def dra_backed_resources(doc: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(container, extended resource) -> request of the claim the scheduler made for
    the pod, from `status.extendedResourceClaimStatus`: counts served through DRA, which
    the kubelet's device manager leaves to its DRA manager."""
    status = doc.get("status") if isinstance(doc.get("status"), Mapping) else {}
    extended = status.get("extendedResourceClaimStatus") if status else None
    if not isinstance(extended, Mapping):
        return {}
    return {
        (str(m.get("containerName")), str(m.get("resourceName"))): str(m.get("requestName"))
        for m in extended.get("requestMappings") or []
        if isinstance(m, Mapping)
    }


def _without(container: ContainerSpec, backed: Mapping[tuple[str, str], str]) -> ContainerSpec:
    kept = {r: n for r, n in container.devices.items() if (container.name, r) not in backed}
    return dataclasses.replace(container, devices=kept)


def _containers(raw: object, path: str, init: bool, problems: list[str]) -> list[ContainerSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append(f"{path}: Invalid value: expected a list")
        return []
    result = []
    for index, item in enumerate(raw):
        where = f"{path}[{index}]"
        if not isinstance(item, Mapping):
            problems.append(f"{where}: Invalid value: expected a mapping")
            continue
        name = str(item.get("name") or "")
        if not name:
            problems.append(f"{where}.name: Required value")
        elif not is_dns_label(name):
            problems.append(f"{where}.name: Invalid value: {name!r}: not a DNS label")
        devices = _extended_resources(item.get("resources"), f"{where}.resources", problems)
        restartable = init and item.get("restartPolicy") == "Always"
        result.append(ContainerSpec(name, init, restartable, devices))
    return result


def _extended_resources(raw: object, path: str, problems: list[str]) -> dict[str, int]:
    """Extended resource counts of one container, with the API server's checks."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: Invalid value: expected a mapping")
        return {}
    sections: dict[str, dict[str, tuple[object, Fraction | None]]] = {}
    for section in ("limits", "requests"):
        values = raw.get(section) or {}
        if not isinstance(values, Mapping):
            problems.append(f"{path}.{section}: Invalid value: expected a mapping")
            values = {}
        parsed: dict[str, tuple[object, Fraction | None]] = {}
        for resource, value in values.items():
            resource = str(resource)
            if not _is_extended(resource):
                continue
            if resource_name_problem(resource) is not None:
                problems.append(
                    f"{path}.{section}[{resource}]: Invalid value: {resource!r}: "
                    "doesn't follow extended resource name standard"
                )
                continue
            try:
                quantity: Fraction | None = parse_quantity(value)
            except QuantityError as error:
                problems.append(f"{path}.{section}[{resource}]: Invalid value: {error}")
                quantity = None
            else:
                assert quantity is not None
                if quantity < 0:
                    problems.append(
                        f"{path}.{section}[{resource}]: Invalid value: {_show(value)}: "
                        "must be greater than or equal to 0"
                    )
                if quantity.denominator != 1:
                    problems.append(
                        f"{path}.{section}[{resource}]: Invalid value: {_show(value)}: "
                        "must be an integer"
                    )
            parsed[resource] = (value, quantity)
        sections[section] = parsed
    limits, requests = sections["limits"], sections["requests"]
    for resource, (value, quantity) in requests.items():
        if resource in limits:
            limit_value, limit = limits[resource]
            if quantity is not None and limit is not None and quantity != limit:
                problems.append(
                    f'{path}.requests: Invalid value: "{_show(value)}": must be equal to '
                    f"{resource} limit of {_show(limit_value)}"
                )
        else:
            problems.append(
                f"{path}.limits: Required value: Limit must be set for non overcommitable resources"
            )
    counts: dict[str, int] = {}
    for resource, (_, quantity) in limits.items():
        if quantity is not None and quantity.denominator == 1 and quantity >= 0:
            counts[resource] = int(quantity)
    return dict(sorted(counts.items()))


def _is_extended(resource: str) -> bool:
    # Native resources have no domain or a kubernetes.io one; everything else with a
    # domain is an extended resource (hugepages-*, cpu, memory... are native).
    return "/" in resource and "kubernetes.io/" not in resource


def effective_requests(pod: PodSpec) -> dict[str, int]:
    """The pod's extended resource requests as the scheduler computes them (the
    `PodRequests` helper: devplug.kube.requests)."""
    requests = pod_requests(
        (c.devices for c in pod.containers),
        ((c.devices, c.restartable) for c in pod.init_containers),
    )
    return {name: count for name, count in sorted(requests.items()) if count > 0}
