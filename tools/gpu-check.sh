#!/bin/sh
# The five-minute proof on a GPU host (tools/gpu_check.py); `--fake` runs it on the fake
# NVML. It needs devplug's runtime dependencies only: $GPU_CHECK_PYTHON, else the
# repository's .venv when there is one, else a virtual environment made here with
# `pip install .` (no test extras: nothing a GPU host cannot install).
set -e
cd "$(dirname "$0")/.."
if [ -n "$GPU_CHECK_PYTHON" ]; then
    PY=$GPU_CHECK_PYTHON
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    if [ ! -x .gpu-check-venv/bin/python ]; then
        echo "making .gpu-check-venv with devplug's runtime dependencies" >&2
        python3 -m venv .gpu-check-venv
        .gpu-check-venv/bin/python -m pip install -q . >&2
    fi
    PY=.gpu-check-venv/bin/python
fi
exec "$PY" tools/gpu_check.py "$@"
