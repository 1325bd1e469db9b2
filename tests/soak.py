"""`make soak`: the long fault runs (tests/faults.py), one table at the end.

Usage: python tests/soak.py [--scale N]  (N multiplies the iteration counts; 1 = the
counts of the issue: 200 kubelet restarts, 500 device flaps...)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# The table is the output: gRPC's and the simulator's notes on each restart are not.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
logging.getLogger("devplug").setLevel(logging.CRITICAL)

from fault_harness import Outcome  # noqa: E402
from faults import SCENARIOS, table  # noqa: E402

ITERATIONS = {
    "restart_storm": 200,
    "sigkill_with_pods": 50,
    "flapping": 500,
    "folder_trouble": 10,
    "hanging_register": 5,
    "stalled_reader": 500,
    "reboot_order": 50,
    "concurrent_clients": 200,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), default=None)
    args = parser.parse_args()
    outcomes: list[Outcome] = []
    for name, count in ITERATIONS.items():
        if args.only and name not in args.only:
            continue
        iterations = max(1, round(count * args.scale))
        folder = Path(tempfile.mkdtemp(prefix="dp-soak-"))
        started = time.monotonic()
        try:
            outcome = asyncio.run(SCENARIOS[name](folder, iterations))
        except Exception as error:
            traceback.print_exc()
            outcome = Outcome(name, failures=[f"aborted: {error!r}"])
            outcome.wall_s = time.monotonic() - started
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        outcomes.append(outcome)
        print(outcome.summary(), file=sys.stderr, flush=True)
    print(table(outcomes))
    print(f"\n{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    return 1 if any(o.failures or o.leaks for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
