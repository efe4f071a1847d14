#!/usr/bin/env bash
# CI: the formats library and its tests built with clang (Release, the
# build's own -march choice) and the fast-path suites run at every vector
# width the CPU has. The main build is GCC; this stage keeps the width files'
# clang targets (`#pragma clang attribute`, formats/fast/target.hpp) and
# clang's view of the kernels honest.
#
#   tools/ci-clang.sh                    # build-clang/
#   BUILD_DIR=... tools/ci-clang.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build-clang}
CXX=${CXX:-clang++}
CC=${CC:-clang}
command -v "$CXX" >/dev/null || { echo "ci-clang: $CXX not found" >&2; exit 1; }
first=()
[[ -f "$BUILD_DIR/CMakeCache.txt" ]] || first=(-DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX")
cmake -S . -B "$BUILD_DIR" "${first[@]}" -DCMAKE_BUILD_TYPE=Release -DEXMY_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc 2>/dev/null || echo 2)" --target exmy test_formats
filter='QuantizeFast.*:BlockPasses.*:FastLoopTable.*:Widths/FastLoops.*:Sums.*:SegmentPartials.*:Vectors.*:RowScales.*'
# The three widths at once, each into its own log, printed in width order;
# any failure fails the stage.
OMP_WAIT_POLICY=passive tools/widths-at-once.sh "scalar avx2 avx512" "$BUILD_DIR/tests/formats/test_formats" \
  --gtest_filter="$filter" --gtest_brief=1
# the binary itself, on its embedded defaults
"$BUILD_DIR/exmy" bench quantize --elements 1048576 --repeat 1 >/dev/null
echo "ci-clang: passed"
