"""A stand-in for `nvidia-smi` over the fake NVML's host description, for the GPU check's
`--fake` mode: the two forms the check reads, printed as nvidia-smi prints them.

    nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,compute_cap,\\
        mig.mode.current,persistence_mode --format=csv,noheader,nounits
    nvidia-smi -L

Its MIG names come from the models' published profile tables (devplug.fakes.gpumodels),
not from devplug's naming code, so the check compares two sources. `script(folder)`
writes an executable `nvidia-smi` running it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devplug.fakes.gpus import DESCRIPTION_ENV, bus_id, mig_devices, mig_rows

FIELDS: dict[str, Callable[[int, dict[str, Any]], str]] = {
    "index": lambda i, g: str(i),
    "uuid": lambda i, g: g["uuid"],
    "name": lambda i, g: g["name"],
    "memory.total": lambda i, g: str(int(g["memory"]) // 2**20),
    "pci.bus_id": lambda i, g: g.get("busId") or bus_id(i),
    "compute_cap": lambda i, g: "{}.{}".format(*g["cc"]),
    "mig.mode.current": lambda i, g: {None: "[N/A]", 0: "Disabled", 1: "Enabled"}[g.get("migMode")],
    "persistence_mode": lambda i, g: "Enabled" if g.get("persistence", True) else "Disabled",
    "driver_version": lambda i, g: "",
}


def script(folder: Path | str) -> Path:
    path = Path(folder) / "nvidia-smi"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -m devplug.fakes.smi "$@"\n')
    path.chmod(0o755)
    return path


def _mig_name(entry: dict[str, Any], gi: dict[str, Any], ci: dict[str, Any]) -> str:
    row = next(r for r in mig_rows(entry) if r.id == gi["profile"])
    return row.name if ci["size"] == row.slices else f"{ci['size']}c.{row.name}"


def main(argv: list[str]) -> int:
    path = os.environ.get(DESCRIPTION_ENV)
    if not path:
        print(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            file=sys.stderr,
        )
        return 9
    description = json.loads(Path(path).read_text())
    gpus = description.get("gpus", [])
    driver = description.get("driver", {}).get("version", "550.54.15")
    if argv == ["-L"]:
        for i, entry in enumerate(gpus):
            print(f"GPU {i}: {entry['name']} (UUID: {entry['uuid']})")
            for slot, (gi, ci) in enumerate(mig_devices(entry)):
                name = _mig_name(entry, gi, ci)
                print(f"  MIG {name:<12} Device {slot:>2}: (UUID: {ci['uuid']})")
        return 0
    query = next((a.partition("=")[2] for a in argv if a.startswith("--query-gpu=")), "")
    if not query or "--format=csv,noheader,nounits" not in argv:
        print(f"unsupported arguments: {' '.join(argv)}", file=sys.stderr)
        return 2
    fields = query.split(",")
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    for i, entry in enumerate(gpus):
        values = [driver if f == "driver_version" else FIELDS[f](i, entry) for f in fields]
        print(", ".join(values))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
