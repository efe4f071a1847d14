#!/usr/bin/env bash
# CI: build the libFuzzer targets with clang (ASan + UBSan) and run each for a
# bounded time over its seed corpus. Any crash, sanitizer report, leak,
# timeout or out-of-memory fails the run; the reproducer is kept under
# $BUILD_DIR/artifacts/<job>/. One exception: libhdf5's own crashes on
# malformed HDF5 files (job fuzz_readers_h5) are reported as warnings.
#
#   tools/ci-fuzz.sh                     # 60 s per target, targets in parallel
#   FUZZ_SECONDS=300 tools/ci-fuzz.sh    # longer
#   BUILD_DIR=... JOBS=... tools/ci-fuzz.sh
#   tools/ci-fuzz.sh -dict=... -jobs=... # extra arguments go to every fuzzer
#
# Reproduce a failure:  [EXMY_FUZZ_READERS=...] $BUILD_DIR/tests/fuzz/<target> <artifact file>
#
# Idempotent: reruns reuse the build directory; the inputs a run discovers are
# kept in $BUILD_DIR/corpus/<target> (the seeds in tests/fuzz/corpus are
# only read).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BUILD_DIR=$(realpath -m "${BUILD_DIR:-build-fuzz}")
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
TARGETS=(fuzz_spec fuzz_readers fuzz_configs)
start=$(date +%s)

step() { printf '\n==> %s\n' "$*"; }

CC=${CC:-clang}
CXX=${CXX:-clang++}
command -v "$CXX" >/dev/null || { echo "ci-fuzz: $CXX not found (libFuzzer needs clang)" >&2; exit 1; }

# Generator and compilers are chosen on the first configure only (changing
# them later would make CMake throw the cache away).
first=()
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  first=(-DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX")
  if command -v ninja >/dev/null; then first+=(-G Ninja); fi
fi

step "configure $BUILD_DIR ($CXX, -DEXMY_FUZZ=ON)"
cmake -S . -B "$BUILD_DIR" "${first[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEXMY_FUZZ=ON \
  -DEXMY_CUDA=OFF \
  -DEXMY_BUILD_TESTS=OFF \
  -DEXMY_BUILD_BENCH=OFF

step "build ${TARGETS[*]} ($JOBS jobs)"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"

# One private temporary directory for the readers' input files.
tmp="$BUILD_DIR/tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
export TMPDIR=$tmp
# allocator_may_return_null: malformed HDF5 metadata makes libhdf5 ask malloc
# for impossible sizes (e.g. 2^54 bytes in H5C_protect); a real malloc then
# returns NULL, which libhdf5 reports as an error and exmy as exmy::Error.
# ASan would abort instead. (Seed h5_huge_metadata_alloc covers this.)
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
# Leaks inside libhdf5 on malformed files are not exmy's (see the file).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/fuzz/lsan.supp:print_suppressions=0}

# Jobs: name, fuzz target, EXMY_FUZZ_READERS, max input length. The
# readers run twice: exmy's own parsers (npy, raw) and HDF5 on its own.
JOBS_LIST=(
  "fuzz_spec       fuzz_spec    -       512"
  "fuzz_readers    fuzz_readers npy,raw 8192"
  "fuzz_readers_h5 fuzz_readers h5      8192"
  "fuzz_configs    fuzz_configs -       4096"
)

# A failure of the HDF5 job whose crashing stack is inside libhdf5, and
# which is not a memory error on a buffer (those could be exmy passing a
# wrong size), is libhdf5's own bug on a malformed file: reported, kept,
# not failed. Everything else fails the run.
upstream_hdf5_crash() {
  local log=$1
  grep -qE '^ +#[0-9]+ .* in H5[A-Za-z0-9_]+ .*libhdf5' "$log" || return 1
  grep -qE 'ERROR: AddressSanitizer: (heap-buffer-overflow|stack-buffer-overflow|global-buffer-overflow|heap-use-after-free|stack-use-after|double-free|container-overflow|use-after-poison)' "$log" && return 1
  grep -qE 'runtime error:|fuzz_readers: (tensor of shape|asked for|[0-9]+ HDF5 objects)' "$log" && return 1
  return 0
}

step "fuzz for ${FUZZ_SECONDS} s each, in parallel: $(printf '%s ' "${JOBS_LIST[@]%% *}")"
declare -A PID LOG ART
for job in "${JOBS_LIST[@]}"; do
  read -r name target readers max_len <<<"$job"
  corpus="$BUILD_DIR/corpus/$name"
  ART[$name]="$BUILD_DIR/artifacts/$name"
  LOG[$name]="$BUILD_DIR/$name.log"
  rm -rf "${ART[$name]}"
  mkdir -p "$corpus" "${ART[$name]}"
  EXMY_FUZZ_READERS=${readers#-} "$BUILD_DIR/tests/fuzz/$target" "$corpus" "tests/fuzz/corpus/$target" \
    -max_total_time="$FUZZ_SECONDS" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="${ART[$name]}/" -print_final_stats=1 "$@" >"${LOG[$name]}" 2>&1 &
  PID[$name]=$!
done

failed=()
for job in "${JOBS_LIST[@]}"; do
  name=${job%% *}
  if wait "${PID[$name]}"; then
    status=ok
  elif [[ $name == fuzz_readers_h5 ]] && upstream_hdf5_crash "${LOG[$name]}"; then
    status="WARNING: crash inside libhdf5 on a malformed file (not exmy's code; reproducer kept)"
  else
    status="FAILED"
    failed+=("$name")
  fi
  echo "--- $name: $status; log ${LOG[$name]}"
  grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)' "${LOG[$name]}" || true
  if [[ $status != ok ]]; then
    grep -E 'ERROR|SUMMARY|check failed|fuzz_[a-z]+:|Test unit written| #[0-5] ' "${LOG[$name]}" | head -20 || true
  fi
done
rm -rf "$tmp"

if ((${#failed[@]})); then
  echo "ci-fuzz: FAILED: ${failed[*]} (reproducers under $BUILD_DIR/artifacts/)" >&2
  exit 1
fi
step "ci-fuzz: passed in $(( $(date +%s) - start )) s"
