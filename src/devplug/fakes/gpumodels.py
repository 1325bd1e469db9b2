"""NVIDIA GPU models for the fake NVML: what NVML reports for each, and their MIG tables.

The MIG rows are NVIDIA's: profile names, fractions, instance counts and placements as
the MIG user guide publishes them ("Supported MIG Profiles"; placements from
`nvidia-smi mig -lgipp`, the same on every GPU here), and the memory each profile reports
(`memorySizeMB`) and its engines as `nvidia-smi mig -lgip` prints them on the real GPU
(outputs quoted in NVIDIA's mig-parted and gpu-operator repositories). Where no print
was found the row says `derived`: its memory is the published fraction of the next
printed row, its SMs per slice those of a 1-slice instance. Each GPU's total memory is
what NVML reports for it (`nvmlDeviceGetMemoryInfo`), which the naming rule divides by:
a name here that the rule does not reproduce fails `tests/unit/test_nvidia_mig.py`. Models
without MIG are here for discovery, labels and architecture families; their memory is
nominal.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024

# Placements on the 8 memory slices ('{0,2,4,6}:2' -> starts 0, 2, 4, 6 of size 2).
ONE = tuple((s, 1) for s in range(7))
ONE_DOUBLE = ((0, 2), (2, 2), (4, 2), (6, 2))
TWO = ((0, 2), (2, 2), (4, 2))
THREE = ((0, 4), (4, 4))
FOUR = ((0, 4),)
SEVEN = ((0, 8),)


@dataclass(frozen=True, slots=True)
class MigRow:
    """One GPU instance profile: a row of 'nvidia-smi mig -lgip'."""

    name: str
    profile: int  # NVML_GPU_INSTANCE_PROFILE_*
    id: int  # profile ID
    slices: int
    instances: int
    memory_gib: float  # as -lgip prints it (GiB, two decimals)
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpegs: int
    ofas: int
    placements: tuple[tuple[int, int], ...]
    encoders: int = 0
    derived: bool = False

    @property
    def memory_mb(self) -> int:
        """MiB: -lgip prints a multiple of 1/8 GiB to two decimals (19.62 is 19.625)."""
        return round(self.memory_gib * 8) * 128


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str  # nvmlDeviceGetName
    memory_mib: int  # nvmlDeviceGetMemoryInfo().total / MiB
    cc: tuple[int, int]
    device_id: int  # PCI device ID
    mig: tuple[MigRow, ...] = ()
    max_mig_devices: int = 7
    source: str = ""

    @property
    def memory(self) -> int:
        return self.memory_mib * MIB


def _seven(
    names: tuple[str, str, str, str, str, str, str],
    gib: tuple[float, float, float, float, float, float, float],
    sms: tuple[int, int, int, int, int, int, int],
    ces: tuple[int, int, int, int, int, int, int],
    decs: tuple[int, int, int, int, int, int, int],
    jpegs: tuple[int, int, int, int, int, int, int],
    ofas: tuple[int, int, int, int, int, int, int],
    derived: tuple[int, ...] = (),
) -> tuple[MigRow, ...]:
    """The seven GPU instance profiles of an 8-memory-slice, 7-compute-slice GPU:
    1g, 1g+me, 1g with twice the memory, 2g, 3g, 4g, 7g (profile IDs 19 20 15 14 9 5 0)."""
    layout = (
        (0x0, 19, 1, 7, ONE),
        (0x7, 20, 1, 1, ONE),
        (0x9, 15, 1, 4, ONE_DOUBLE),
        (0x1, 14, 2, 3, TWO),
        (0x2, 9, 3, 2, THREE),
        (0x3, 5, 4, 1, FOUR),
        (0x4, 0, 7, 1, SEVEN),
    )
    return tuple(
        MigRow(
            names[k],
            profile,
            pid,
            slices,
            count,
            gib[k],
            sms[k],
            ces[k],
            decs[k],
            jpegs[k],
            ofas[k],
            placements,
            derived=k in derived,
        )
        for k, (profile, pid, slices, count, placements) in enumerate(layout)
    )


_AMPERE_ENGINES = {
    "ces": (1, 1, 1, 2, 3, 4, 7),
    "decs": (0, 1, 1, 1, 2, 2, 5),
    "jpegs": (0, 1, 0, 0, 0, 0, 1),
    "ofas": (0, 1, 0, 0, 0, 0, 1),
}
_HOPPER_ENGINES = {
    "ces": (1, 1, 1, 2, 3, 4, 8),
    "decs": (1, 1, 1, 2, 3, 4, 7),
    "jpegs": (1, 1, 1, 2, 3, 4, 7),
    "ofas": (0, 1, 0, 0, 0, 0, 1),
}
_AMPERE_SMS = (14, 14, 14, 28, 42, 56, 98)
# The same names on the A100 80GB and the H100 80GB.
_NAMES_80GB = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_HOPPER_SMS = (16, 16, 26, 32, 60, 64, 132)

MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel(
            "A100-SXM4-40GB",
            "NVIDIA A100-SXM4-40GB",
            40960,
            (8, 0),
            0x20B0,
            _seven(
                ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
                (4.75, 4.75, 9.75, 9.75, 19.62, 19.62, 39.50),
                _AMPERE_SMS,
                **_AMPERE_ENGINES,
            ),
            source="MIG user guide, A100 table and 'Getting Started' -lgip/-lgipp",
        ),
        GpuModel(
            "A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            81920,
            (8, 0),
            0x20B2,
            _seven(
                _NAMES_80GB,
                (9.50, 9.50, 19.50, 19.50, 39.25, 39.25, 79.00),
                _AMPERE_SMS,
                **_AMPERE_ENGINES,
            ),
            source="MIG user guide (A100-SXM4-80GB names); -lgip of an A100-SXM4-80GB",
        ),
        GpuModel(
            "H100-SXM5-80GB",
            "NVIDIA H100 80GB HBM3",
            81559,
            (9, 0),
            0x2330,
            _seven(
                _NAMES_80GB,
                (9.75, 9.75, 19.62, 19.62, 39.50, 39.50, 79.25),
                _HOPPER_SMS,
                **_HOPPER_ENGINES,
            ),
            source="MIG user guide, H100 table; -lgip of an H100 80GB HBM3",
        ),
        GpuModel(
            "H100-NVL-94GB",
            "NVIDIA H100 NVL",
            95830,
            (9, 0),
            0x2321,
            _seven(
                (
                    "1g.12gb",
                    "1g.12gb+me",
                    "1g.24gb",
                    "2g.24gb",
                    "3g.47gb",
                    "4g.47gb",
                    "7g.94gb",
                ),
                (10.75, 10.75, 21.62, 21.62, 46.38, 46.38, 93.12),
                _HOPPER_SMS,
                **_HOPPER_ENGINES,
            ),
            source="-lgip of an H100 NVL (gpu-operator #900, mig-parted #101)",
        ),
        GpuModel(
            "H200-SXM5-141GB",
            "NVIDIA H200",
            143771,
            (9, 0),
            0x2335,
            _seven(
                (
                    "1g.18gb",
                    "1g.18gb+me",
                    "1g.35gb",
                    "2g.35gb",
                    "3g.71gb",
                    "4g.71gb",
                    "7g.141gb",
                ),
                (16.00, 16.00, 32.25, 32.25, 69.50, 69.50, 139.75),
                _HOPPER_SMS,
                **_HOPPER_ENGINES,
            ),
            source="MIG user guide, H200 table; -lgip of an H200 (mig-parted #120)",
        ),
        GpuModel(
            "B200-180GB",
            "NVIDIA B200",
            183359,
            (10, 0),
            0x2901,
            _seven(
                (
                    "1g.23gb",
                    "1g.23gb+me",
                    "1g.45gb",
                    "2g.45gb",
                    "3g.90gb",
                    "4g.90gb",
                    "7g.180gb",
                ),
                (22.00, 22.00, 44.25, 44.25, 88.75, 88.75, 177.75),
                (18, 18, 30, 36, 54, 72, 126),
                ces=(2, 2, 2, 4, 6, 8, 16),
                decs=(1, 1, 1, 2, 3, 4, 7),
                jpegs=(1, 1, 1, 2, 3, 4, 7),
                ofas=(0, 1, 0, 0, 0, 0, 1),
                derived=(4, 5, 6),
            ),
            source="MIG user guide, B200 table; -lgip of a B200 (mig-parted #166, #187)",
        ),
        # Not MIG-capable: for discovery, labels and families.
        GpuModel("L4", "NVIDIA L4", 23034, (8, 9), 0x27B8, max_mig_devices=0),
        GpuModel("L40S", "NVIDIA L40S", 46068, (8, 9), 0x26B9, max_mig_devices=0),
        GpuModel("T4", "Tesla T4", 15360, (7, 5), 0x1EB8, max_mig_devices=0),
        GpuModel("A10", "NVIDIA A10", 23028, (8, 6), 0x2236, max_mig_devices=0),
        GpuModel(
            "RTX-PRO-6000",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            97887,
            (12, 0),
            0x2BB5,
            max_mig_devices=0,
        ),
    )
}


def model(key: str) -> GpuModel:
    """A model by key ('H100-SXM5-80GB'), or by its NVML name ('NVIDIA H100 80GB HBM3')."""
    if key in MODELS:
        return MODELS[key]
    for candidate in MODELS.values():
        if key == candidate.name:
            return candidate
    known = ", ".join(MODELS)
    raise KeyError(f"unknown GPU model {key!r} (known: {known})")


def row(gpu: GpuModel, name_or_id: str | int) -> MigRow:
    for candidate in gpu.mig:
        if name_or_id in (candidate.name, candidate.id):
            return candidate
    raise KeyError(f"{gpu.key} has no MIG profile {name_or_id!r}")


# Compute instance profiles of a GPU instance of `slices` compute slices:
# (NVML_COMPUTE_INSTANCE_PROFILE_*, its slices, its starts in the GPU instance), as
# 'nvidia-smi mig -lcip' / '-lcipp' list them (1c, 2c, 3c, 4c, 7c; a 4g instance has no 3c).
COMPUTE_PLACEMENTS: dict[int, tuple[tuple[int, int, tuple[int, ...]], ...]] = {
    1: ((0x0, 1, (0,)),),
    2: ((0x0, 1, (0, 1)), (0x1, 2, (0,))),
    3: ((0x0, 1, (0, 1, 2)), (0x1, 2, (0,)), (0x2, 3, (0,))),
    4: ((0x0, 1, (0, 1, 2, 3)), (0x1, 2, (0, 2)), (0x3, 4, (0,))),
    7: (
        (0x0, 1, tuple(range(7))),
        (0x1, 2, (0, 2, 4)),
        (0x2, 3, (0, 4)),
        (0x3, 4, (0,)),
        (0x4, 7, (0,)),
    ),
}
