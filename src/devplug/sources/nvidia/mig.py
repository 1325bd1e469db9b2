"""MIG profiles as NVIDIA names them, and the geometry of a GPU: which GPU instance
profiles it offers, where each may be placed, and what is placed there now.

Names follow NVIDIA's rule (go-nvlib's MIG profile): the GB of `1g.18gb` is the slice's
share of the GPU's memory rounded up to eighths, times the GPU's memory in GB rounded
up, rounded to the nearest integer; a compute instance smaller than its GPU instance is
`1c.2g.20gb`; variants of a GPU instance profile carry a suffix (`+me`, `+me.all`,
`+gfx`, `-me`). A resource name turns the `+` into a `.` (`nvidia.com/mig-1g.10gb.me`),
as NVIDIA's device plugin does.

The geometry (`MigGeometry`, read by `Nvml.mig_geometry`) is what a DRA partitions
publisher needs: per profile its placements on the GPU's memory slices, and the
instances that exist. No NVML import here: these are plain values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 1024 * 1024
GIB = 1024 * MIB
EIGHTHS = 8

# NVML_GPU_INSTANCE_PROFILE_* (nvml.h): the enum a profile is queried by, its GPU
# slices, and the suffix its name carries.
GPU_INSTANCE_PROFILES: dict[int, tuple[int, str]] = {
    0x0: (1, ""),  # 1_SLICE
    0x1: (2, ""),  # 2_SLICE
    0x2: (3, ""),  # 3_SLICE
    0x3: (4, ""),  # 4_SLICE
    0x4: (7, ""),  # 7_SLICE
    0x5: (8, ""),  # 8_SLICE
    0x6: (6, ""),  # 6_SLICE
    0x7: (1, "+me"),  # 1_SLICE_REV1: with media extensions
    0x8: (2, "+me"),  # 2_SLICE_REV1
    0x9: (1, ""),  # 1_SLICE_REV2: twice the memory
    0xA: (1, "+gfx"),  # 1_SLICE_GFX
    0xB: (2, "+gfx"),  # 2_SLICE_GFX
    0xC: (4, "+gfx"),  # 4_SLICE_GFX
    0xD: (1, "-me"),  # 1_SLICE_NO_ME
    0xE: (2, "-me"),  # 2_SLICE_NO_ME
    0xF: (1, "+me.all"),  # 1_SLICE_ALL_ME
    0x10: (2, "+me.all"),  # 2_SLICE_ALL_ME
    0x11: (3, "+gfx"),  # 3_SLICE_GFX
}
# NVML_COMPUTE_INSTANCE_PROFILE_*: the compute slices of each.
COMPUTE_INSTANCE_PROFILES: dict[int, int] = {
    0x0: 1,
    0x1: 2,
    0x2: 3,
    0x3: 4,
    0x4: 7,
    0x5: 8,
    0x6: 6,
    0x7: 1,  # 1_SLICE_REV1
    0x8: 7,  # 7_SLICE_NVL
}


def memory_gb(memory_mb: int, total_bytes: int) -> int:
    """The GB in a MIG profile's name: the slice's share of the GPU's memory, rounded up
    to eighths, times the GPU's whole GB (rounded up), rounded half up."""
    if total_bytes <= 0:
        return math.ceil(memory_mb / 1024)
    share = memory_mb * MIB / total_bytes
    eighths = math.ceil(share * EIGHTHS) / EIGHTHS
    total_gb = -(-total_bytes // GIB)
    return math.floor(eighths * total_gb + 0.5)


def profile_name(
    gpu_profile: int, compute_slices: int | None, memory_mb: int, total_bytes: int
) -> str:
    """'1g.18gb', '1c.2g.20gb', '1g.10gb+me': the name of a GPU instance profile (enum
    `gpu_profile`), or of a compute instance of `compute_slices` in one."""
    slices, suffix = GPU_INSTANCE_PROFILES.get(gpu_profile, (0, ""))
    if not slices:
        raise ValueError(f"unknown GPU instance profile {gpu_profile}")
    gb = memory_gb(memory_mb, total_bytes)
    if compute_slices is None or compute_slices == slices:
        return f"{slices}g.{gb}gb{suffix}"
    return f"{compute_slices}c.{slices}g.{gb}gb{suffix}"


def resource_suffix(profile: str) -> str:
    """The part of a resource name a profile gives: 'mig-1g.10gb.me' for '1g.10gb+me'."""
    return "mig-" + profile.replace("+", ".")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU instance sits: memory slices [start, start + size)."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True, slots=True)
class GpuInstanceProfile:
    """One GPU instance profile of a GPU, as NVML describes it."""

    profile: int  # NVML_GPU_INSTANCE_PROFILE_* (what it is queried by)
    id: int  # the profile ID ('nvidia-smi mig -lgip' ID column)
    name: str  # '1g.10gb+me', by NVIDIA's rule
    slices: int  # GPU (compute) slices
    instances: int  # how many can exist at once
    memory_mb: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class ComputeInstance:
    id: int
    profile_id: int
    start: int  # compute slices [start, start + slices) of its GPU instance
    slices: int
    name: str  # '3g.40gb', or '1c.3g.40gb' when it takes part of its GPU instance


@dataclass(frozen=True, slots=True)
class GpuInstance:
    id: int
    profile_id: int
    placement: Placement
    compute_instances: tuple[ComputeInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG profiles of one GPU, their placements, and the instances placed now.

    A placement is free when it overlaps no existing GPU instance and its profile has
    instances left; `memory_slices` is the width of the GPU's placement axis (8 on the
    GPUs MIG runs on today)."""

    index: int
    uuid: str
    profiles: tuple[GpuInstanceProfile, ...]
    instances: tuple[GpuInstance, ...]

    @property
    def memory_slices(self) -> int:
        return max((p.start + p.size for g in self.profiles for p in g.placements), default=0)

    def profile(self, name_or_id: str | int) -> GpuInstanceProfile:
        """A profile by name ('1g.10gb') or profile ID; KeyError when the GPU has none."""
        for candidate in self.profiles:
            if name_or_id in (candidate.name, candidate.id):
                return candidate
        raise KeyError(name_or_id)

    def free_placements(self, profile: GpuInstanceProfile) -> list[Placement]:
        """The placements of `profile` a new GPU instance could take now."""
        used = sum(1 for i in self.instances if i.profile_id == profile.id)
        if used >= profile.instances:
            return []
        taken = [i.placement for i in self.instances]
        return [p for p in profile.placements if not any(p.overlaps(t) for t in taken)]
