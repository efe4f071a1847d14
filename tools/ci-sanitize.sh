#!/usr/bin/env bash
# CI: build exmy with clang, AddressSanitizer + UndefinedBehaviorSanitizer, and
# run the unit tests (ctest -L unit) under them. Any sanitizer report fails
# the run. The main build is GCC; this one is also clang's view of the whole
# tree: the width files' clang targets (`#pragma clang attribute`,
# formats/fast/target.hpp) run in the fast-path suites at every vector width
# the CPU has (the CPU's own in ctest, the narrower ones forced below), and
# clang's UBSan checks what GCC's does not (float-to-integer overflow).
# clang compiles the instrumented tree in less time than GCC 12 (2-core Xeon:
# 478 instead of 698 CPU-s for the tests' objects one by one, 419 instead of
# 604 for the libraries), and the instrumented tests run no slower.
#
#   tools/ci-sanitize.sh            # build dir: build-asan
#   BUILD_DIR=... JOBS=... tools/ci-sanitize.sh
#   tools/ci-sanitize.sh -R Vectors # extra arguments go to ctest
#
# Idempotent: reruns reuse the build directory and rebuild only what changed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=$(realpath -m "${BUILD_DIR:-build-asan}")
JOBS=${JOBS:-$(nproc)}
start=$(date +%s)

step() { printf '\n==> %s\n' "$*"; }

CC=${CC:-clang}
CXX=${CXX:-clang++}
command -v "$CXX" >/dev/null || { echo "ci-sanitize: $CXX not found" >&2; exit 1; }

# Generator and compilers are chosen on the first configure only (changing
# them later would make CMake throw the cache away).
first=()
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  first=(-DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX")
  if command -v ninja >/dev/null; then first+=(-G Ninja); fi
fi

# RelWithDebInfo at -O1 -g1: the optimisation level ASan recommends, and
# line tables for symbolized reports; it compiles about 2.5x faster than the
# default -O2 -g. (-O0 compiles the tests' files in a third of the time,
# but the kernels' host emulations, templates instantiated in those files,
# then run 3-10x slower: more than it saves.)
step "configure $BUILD_DIR ($CXX, ASan + UBSan, RelWithDebInfo at -O1 -g1, no CUDA, no benchmarks)"
cmake -S . -B "$BUILD_DIR" "${first[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DEXMY_SANITIZE=ON \
  -DEXMY_CUDA=OFF \
  -DEXMY_BUILD_TESTS=ON \
  -DEXMY_BUILD_BENCH=OFF

step "build ($JOBS jobs)"
cmake --build "$BUILD_DIR" -j "$JOBS"

# Longest tests first: ctest orders a run by each test's time in the build
# directory's cost data, which a fresh build-asan lacks, so the slowest
# tests (emulated-device training runs: a minute or more under the
# sanitizers) would start last and run alone. The README test command's run
# in build/ (CI's first stage) has the same tests' times: seed the order
# from it.
cost=Testing/Temporary/CTestCostData.txt
if [[ ! -f "$BUILD_DIR/$cost" && -f "build/$cost" ]]; then
  mkdir -p "$BUILD_DIR/Testing/Temporary"
  cp "build/$cost" "$BUILD_DIR/$cost"
fi

# halt_on_error / abort_on_error: the first report fails the test.
# detect_leaks stays on, with one suppression (tools/lsan.supp): clang's
# OpenMP runtime, libomp 14, drops the thread structures of a team grown
# past the cores (the tests' 3- and 7-thread runs on 2 cores) without
# freeing them before the leak check at exit. A suppression matches any
# frame, so exmy's own allocations inside parallel regions go unchecked for
# leaks too: they are containers that free themselves.
# No detect_stack_use_after_return: its fake stack frames did not keep the
# 64-byte alignment GCC 12 assumes for AVX-512 stack slots (an aligned
# 512-bit move of a local faulted), and it slows every call.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tools/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
# Not under the sanitizers: TrainerDevice.PeakDeviceMemoryIsThePlanWithinTwoPercent,
# a numeric property (the memory plan against the emulated device's peak,
# six training configurations of proxy-10m) that the README stage checks;
# under ASan it was a third of this stage's test time (554 of 1565 s on a
# 2-core Intel Xeon), and the code it runs (emulated-device training with
# block recompute, gradient accumulation, the te-nvfp4, ue5m3-b16 and
# grouped recipes) runs here in QuantTrain.EmulatedDeviceGivesTheCpuBits,
# TrainerDevice.Offloaded* and DistTrainDevice.*.
# Nor CliTrain.FusedKernelsTrainOnTheEmulatedDevice, 20 steps of proxy-tiny
# through the fused attention and SSD kernels' host emulations (a warp's
# MMAs lane by lane): 367 of the 1219 s of this stage's tests under ASan
# on a 2-core EPYC (CI near its 40 minutes); those emulations run here in the kernels' own tests
# (emulated.AttentionFusedKernel.*, emulated.SsdFusedKernel.*) and the
# emulated backend's training path in the tests above, and the README
# stage runs it.
# Nor TrainerDevice.OffloadedPlanIsTheDevicePeakWithinTenPercent, the
# offloaded memory plan against the emulated device's peak (a numeric
# property, like its sibling above; its code runs here in the other
# TrainerDevice.Offloaded* tests), nor CliTest.AllReferenceVectors, which
# starts the exmy binary once per reference vector (the vectors run here in
# process, Vectors.*, and the quantize command's parsing in the other
# CliTest.* tests): 55 and 47 s under ASan, CI at 40.2 minutes with them.
# The fast-path suites at the narrower forced widths (simd_scalar.fast_path,
# simd_avx2.fast_path: 74 s each under ASan) run below without their two
# heaviest tests, whose repetitions over large and streamed tensors add
# numeric breadth, not new memory accesses (they run here at the CPU's own
# width, and at every width in the README stage).
step "ctest -L unit, but the data-parallel tests and the tests named above (ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS)"
ctest --test-dir "$BUILD_DIR" -L unit \
  -E '^(Recipes/)?Dist(Bench)?Train|^TrainerDevice\.(PeakDeviceMemoryIsThePlanWithinTwoPercent|OffloadedPlanIsTheDevicePeakWithinTenPercent)$|^CliTrain\.FusedKernelsTrainOnTheEmulatedDevice$|^CliTest\.AllReferenceVectors$|^simd_(scalar|avx2)\.fast_path$' \
  --output-on-failure --no-tests=error -j "$JOBS" "$@"

if [[ $# -eq 0 ]]; then
  step "the fast-path suites and the reference vectors at the forced widths scalar and avx2, without the two heaviest tests"
  filter=$(ctest --test-dir "$BUILD_DIR" -R '^simd_scalar\.fast_path$' --show-only=json-v1 |
           sed -n 's/.*"--gtest_filter=\([^"]*\)".*/\1/p' | head -n1)
  [[ -n "$filter" ]] || { echo "ci-sanitize: no filter of simd_scalar.fast_path found" >&2; exit 1; }
  tools/widths-at-once.sh "scalar avx2" "$BUILD_DIR/tests/formats/test_formats" --gtest_brief=1 \
    --gtest_filter="$filter:Vectors.*-QuantizeFast.LargeTensorsMatchReferenceOverManyRuns:QuantizeFast.StreamedOutputsMatchReference"
  step "the binary itself, on its embedded defaults"
  "$BUILD_DIR/exmy" bench quantize --elements 1048576 --repeat 1 >/dev/null
fi
# The data-parallel tests (DistTrain*, DistBenchTrain*) run exmy under mpirun: Open MPI's own allocations
# (many in MCA plugins it has unloaded by exit, so no suppression can name
# them) are reported as leaks. Every other check stays on; exmy's own leaks
# are the other tests' business.
step "ctest -L unit, the data-parallel tests (leak detection off)"
ASAN_OPTIONS="${ASAN_OPTIONS//detect_leaks=1/detect_leaks=0}" \
  ctest --test-dir "$BUILD_DIR" -L unit -R '^(Recipes/)?Dist(Bench)?Train' --output-on-failure --no-tests=error -j "$JOBS" "$@"

step "ci-sanitize: passed in $(( $(date +%s) - start )) s"
