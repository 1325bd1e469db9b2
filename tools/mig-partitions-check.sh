#!/bin/sh
# The MIG partitions check (see tools/mig_partitions_check.py); `--fake` runs it with the fake NVML.
set -e
cd "$(dirname "$0")/.."
make -s .venv/.installed >&2
exec .venv/bin/python tools/mig_partitions_check.py "$@"
