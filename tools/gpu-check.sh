#!/usr/bin/env bash
# The GPU checks in one short run: the CUDA kernels against the CPU, bit for
# bit (tests/formats/test_cuda.cpp, the tests labelled "gpu").
#
#   tools/gpu-check.sh            # on a machine with a CUDA device
#   tools/gpu-check.sh --build    # only build build-cuda/ (portable, no -march=native)
#
# It also runs `exmy bench quantize` on that machine's CPU cores, when
# build-cuda/exmy-bench-v3 is there: --build links it statically for
# x86-64-v3 (AVX2+FMA) from a second build, build-v3/, of the formats library.
#
# Prepared for a lent device machine: build here with --build, carry
# build-cuda/tests/formats/test_cuda, build-cuda/devlibs (the libraries it
# loads) and build-cuda/exmy-bench-v3 there and run this script; logs and the
# gtest XML go to $OUT when it is set (the device tool brings $OUT back),
# else to build-cuda/gpu-check/. Without the carried binary it builds
# test_cuda itself (needs cmake, nvcc, GoogleTest). Exit status: 0 when every
# test ran and passed, 3 when any was skipped (no device seen), else the
# tests' own failure status.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/portable-lib.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
bin=build-cuda/tests/formats/test_cuda

build() {
  # portable code: the binary may run on another CPU than the one that built it
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DEXMY_CUDA=ON -DEXMY_NATIVE=OFF >/dev/null
  cmake --build build-cuda -j"$(nproc 2>/dev/null || echo 2)" --target test_cuda test_cuda_emulated
  copy_libs build-cuda/devlibs "$bin"  # libgomp, libcudart, where the device host lacks them
}

build_bench() {
  configure_v3
  cmake --build build-v3 -j"$(nproc 2>/dev/null || echo 2)" --target exmy_formats
  mkdir -p build-cuda
  g++ -std=c++20 -O2 -march=x86-64-v3 -fopenmp -static -I. \
    tools/bench_quantize_main.cpp sim/cli/bench_cmd.cpp build-v3/formats/libexmy_formats.a \
    -lboost_program_options -o build-cuda/exmy-bench-v3
}

if [ "${1:-}" = "--build" ]; then
  build
  build_bench
  echo "gpu-check: built $bin and build-cuda/exmy-bench-v3"
  exit 0
fi

out=${OUT:-build-cuda/gpu-check}
mkdir -p "$out"
{ nvidia-smi || echo "nvidia-smi: not available"; } >"$out/nvidia-smi.txt" 2>&1
if ! { [ -x "$bin" ] && "$bin" --gtest_list_tests >/dev/null 2>&1; }; then
  echo "gpu-check: no runnable $bin; building it"
  build >"$out/build.log" 2>&1 || { echo "gpu-check: build failed (see $out/build.log)"; exit 2; }
fi
status=0
# carried libraries (libgomp, libcudart) where the host lacks them
[ -d build-cuda/devlibs ] && export LD_LIBRARY_PATH="$PWD/build-cuda/devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the reference vectors of this checkout, wherever the binary was built
export EXMY_VECTORS_FILE="$PWD/tests/reference/quantize.jsonl"
"$bin" --gtest_output=xml:"$out/test_cuda.xml" >"$out/test_cuda.log" 2>&1 || status=$?
tail -n 30 "$out/test_cuda.log"
# the CPU benchmark runs whatever the tests said (it needs no GPU)
if [ -x build-cuda/exmy-bench-v3 ]; then
  { grep -m1 "model name" /proc/cpuinfo; nproc; grep -m1 "^flags" /proc/cpuinfo; lscpu; } >"$out/cpu.txt" 2>&1 || true
  for t in "$(nproc)" 4; do
    OMP_PROC_BIND=close OMP_WAIT_POLICY=passive build-cuda/exmy-bench-v3 quantize --threads "$t" \
      >"$out/bench-$t.txt" 2>&1 || echo "gpu-check: bench with $t threads failed"
    cat "$out/bench-$t.txt"
  done
fi
if [ "$status" -ne 0 ]; then
  echo "gpu-check: FAILED (status $status)"
  exit "$status"
fi
# (CudaPath.NoDeviceIsAnError is skipped exactly when a device is present)
if grep -q "needs a CUDA device" "$out/test_cuda.log"; then
  echo "gpu-check: tests were skipped (no CUDA device seen): nothing was checked"
  exit 3
fi
echo "gpu-check: passed"
