#!/usr/bin/env bash
# Installs missing dependencies and builds exmy (Release) into build/.
# CUDA kernels are built when nvcc is found (EXMY_CUDA=AUTO).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# The CUDA toolkit lives outside PATH on some machines.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DEXMY_CUDA="${EXMY_CUDA:-AUTO}" >/dev/null
cmake --build build -j"$jobs"
