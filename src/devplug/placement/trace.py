"""A GPU cluster trace read as it is published: a node list and a pod list, CSV files with
the columns of Alibaba's `cluster-trace-gpu-v2023` (openb).

Node list: `sn` (the node's name), `cpu_milli`, `memory_mib`, `gpu` (how many GPUs),
`model` (their model; empty for a node without GPUs). Pod list: `name`, `cpu_milli`,
`memory_mib`, `num_gpu`, `gpu_milli` (per GPU: 1000 for whole GPUs, less for a share of
one GPU, only with `num_gpu` 1), `gpu_spec` (empty for any model, else the accepted
models separated by `|`); the trace's other columns (`qos`, `pod_phase`, the times) are
read past. Bad input is one TraceError line naming the file, the row and the column.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from devplug.ground import inputs
from devplug.placement.state import MILLI, Demand, Node

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
MAX_GPUS = 64


class TraceError(Exception):
    """The trace cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    demand: Demand


def _rows(path: str, columns: Sequence[str], what: str) -> list[tuple[int, dict[str, str]]]:
    try:
        text = inputs.read_text(path, inputs.LARGE_LIMITS, what=f"the {what}")
    except inputs.InputError as error:
        raise TraceError(str(error)) from None
    try:
        return _csv_rows(text, path, columns, what)
    except csv.Error as error:  # a field over csv's 128 KiB, a quote left open...
        raise TraceError(f"{path}: invalid CSV: {error}") from None


def _named_rows(
    path: str, columns: Sequence[str], what: str, key: str, noun: str
) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Each row with where it is and its name in column `key`, which every row needs
    and no two rows share."""
    seen: set[str] = set()
    for number, row in _rows(path, columns, what):
        where = f"{path}: row {number}"
        name = row[key]
        if not name:
            raise TraceError(f"{where}: {key}: required")
        if name in seen:
            raise TraceError(f"{where}: {key}: {noun} {name!r} comes twice")
        seen.add(name)
        yield where, name, row


def _csv_rows(
    text: str, path: str, columns: Sequence[str], what: str
) -> list[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    header = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceError(
            f"{path}: column {missing[0]!r} missing: a {what} has the columns {', '.join(columns)}"
        )
    rows = [
        (number, {k.strip(): (v or "").strip() for k, v in raw.items() if k})
        for number, raw in enumerate(reader, start=2)
    ]
    if not rows:
        raise TraceError(f"{path}: no rows: the {what} is empty")
    return rows


def _number(row: dict[str, str], column: str, where: str, high: int | None = None) -> int:
    value = row[column]
    try:
        number = int(value)
    except ValueError:
        raise TraceError(f"{where}: {column}: expected a whole number, got {value!r}") from None
    if number < 0 or (high is not None and number > high):
        top = f" to {high}" if high is not None else " or more"
        raise TraceError(f"{where}: {column}: expected 0{top}, got {number}")
    return number


def is_pod_list(path: str) -> bool:
    """Whether a CSV file has the columns of a trace pod list."""
    return {"num_gpu", "gpu_milli"} <= _header(path)


def is_node_list(path: str) -> bool:
    """Whether a CSV file has the columns of a trace node list."""
    return set(NODE_COLUMNS) <= _header(path)


def _header(path: str) -> set[str]:
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as handle:
            first = handle.readline(64 * 1024)  # a header, not a whole file of one line
        header = next(csv.reader([first]), [])
    except (OSError, csv.Error):
        return set()
    return {c.strip() for c in header}


def read_nodes(path: str) -> list[Node]:
    """The nodes of a node list, all free."""
    nodes: list[Node] = []
    for where, name, row in _named_rows(path, NODE_COLUMNS, "node list", "sn", "node"):
        gpus = _number(row, "gpu", where, MAX_GPUS)
        model = row["model"]
        if gpus and not model:
            raise TraceError(f"{where}: model: required for a node with GPUs")
        nodes.append(
            Node(
                name,
                cpu=_number(row, "cpu_milli", where),
                memory=_number(row, "memory_mib", where),
                model=model if gpus else "",
                gpu_free=[MILLI] * gpus,
            )
        )
    return nodes


def read_pods(path: str) -> list[TracePod]:
    """The pods of a pod list, in the file's order."""
    pods: list[TracePod] = []
    for where, name, row in _named_rows(path, POD_COLUMNS, "pod list", "name", "pod"):
        gpus = _number(row, "num_gpu", where, MAX_GPUS)
        milli = _number(row, "gpu_milli", where, MILLI)
        if gpus and not milli:
            raise TraceError(f"{where}: gpu_milli: expected 1 to {MILLI} for a pod with GPUs")
        if gpus > 1 and milli != MILLI:
            raise TraceError(
                f"{where}: gpu_milli: a share of a GPU ({milli}) is a share of one GPU, "
                f"not of {gpus}: expected {MILLI} with num_gpu {gpus}"
            )
        models = frozenset(m.strip() for m in row["gpu_spec"].split("|") if m.strip())
        demand = Demand(
            cpu=_number(row, "cpu_milli", where),
            memory=_number(row, "memory_mib", where),
            gpus=gpus,
            gpu_milli=milli if gpus else 0,
            models=models if gpus else frozenset(),
        )
        pods.append(TracePod(name, demand))
    return pods
