#!/usr/bin/env bash
# Runs the whole test suite of a build made by tools/build.sh. Tests labelled
# "gpu" report SKIPPED where no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# Idle OpenMP threads sleep instead of spinning: the tests run side by side.
export OMP_WAIT_POLICY=passive
ctest --test-dir build --output-on-failure -j"$jobs" "$@"
