"""What a fleet run counts: registrations, pod decisions, lease renewals, status
writes and relists, and where the pod watch spent its time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    registered: int = 0
    admitted: int = 0
    claims_prepared: int = 0  # ResourceClaims of admitted pods, prepared by their node
    rejected: int = 0
    waiting: int = 0
    deleted: int = 0
    lease_renewals: int = 0
    lease_failures: int = 0
    lease_late: int = 0  # a renewal not sent: the one before still had no answer
    status_writes: int = 0
    relists: int = 0
    register_s: float = 0.0
    # Time the pod watch spent waiting, one pod after another: on the claims' reads,
    # and on admissions (the device manager, the claims' preparation).
    claim_reads_s: float = 0.0
    admit_s: float = 0.0
