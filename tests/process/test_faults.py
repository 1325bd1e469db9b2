"""Short runs of every fault scenario (tests/faults.py); `make soak` runs long ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_folder import FOLDER_TROUBLES
from fault_harness import Outcome
from faults import SCENARIOS


def clean(outcome: Outcome) -> None:
    assert not outcome.failures, outcome.summary()
    assert not outcome.leaks, outcome.summary()


@pytest.mark.parametrize(
    ("name", "iterations"),
    [
        ("restart_storm", 20),
        ("sigkill_with_pods", 3),
        ("flapping", 500),
        ("hanging_register", 1),
        ("stalled_reader", 60),
        ("reboot_order", 2),
        ("concurrent_clients", 20),
    ],
)
async def test_fault_scenario(short_tmp: Path, name: str, iterations: int) -> None:
    outcome = await SCENARIOS[name](short_tmp, iterations)
    assert outcome.iterations >= iterations, outcome.summary()
    clean(outcome)


@pytest.mark.parametrize("trouble", sorted(FOLDER_TROUBLES))
async def test_socket_folder_trouble(short_tmp: Path, trouble: str) -> None:
    problems = await FOLDER_TROUBLES[trouble](short_tmp)
    assert problems == []
