#!/bin/sh
# The real-GPU check (see tools/gpu_check.py); `--fake` runs it with the fake NVML.
set -e
cd "$(dirname "$0")/.."
make -s .venv/.installed >&2
exec .venv/bin/python tools/gpu_check.py "$@"
