#!/usr/bin/env bash
# The CPU test suite on another x86-64 machine (a lent device's host, say):
# a portable build (x86-64-v3: AVX2+FMA, no -march=native), its test binaries
# and the shared libraries they need, run there with that machine's cores.
#
#   tools/portable-tests.sh --build   # here: build build-v3/, gather build-v3/devtests/ and build-v3/devlibs/
#   tools/portable-tests.sh           # there: run every test binary; summary on stdout, logs in $OUT (or build-v3/devtests/logs)
#
# The binaries hold this checkout's absolute path (EXMY_SOURCE_DIR, the exmy
# binary they run), so the run links that path to the working tree when it
# differs. Exit status 0 when every binary passed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(realpath -m "$PWD")
. tools/portable-lib.sh

if [ "${1:-}" = "--build" ]; then
  configure_v3
  cmake --build build-v3 -j"$(nproc 2>/dev/null || echo 2)"
  rm -rf build-v3/devtests && mkdir -p build-v3/devtests
  find build-v3/tests -type f -executable -name 'test_*' -exec cp {} build-v3/devtests/ \;
  copy_libs build-v3/devlibs build-v3/exmy build-v3/devtests/*
  echo "$root" >build-v3/devtests/source-dir
  echo "portable-tests: $(ls build-v3/devtests | grep -c '^test_') test binaries, $(ls build-v3/devlibs | wc -l) libraries"
  exit 0
fi

built_at=$(cat build-v3/devtests/source-dir)
if [ "$built_at" != "$root" ] && [ ! -e "$built_at" ]; then
  mkdir -p "$(dirname "$built_at")"
  ln -s "$root" "$built_at"
fi
export LD_LIBRARY_PATH="$root/build-v3/devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
out=${OUT:-build-v3/devtests/logs}
mkdir -p "$out" /tmp/portable-tests
{ grep -m1 "model name" /proc/cpuinfo; echo "cores: $(nproc)"; } | tee "$out/summary.txt"
run_one() {
  local b=$1 n
  n=$(basename "$b")
  (cd /tmp/portable-tests && "$b" --gtest_brief=1 >"/tmp/portable-tests/$n.log" 2>&1) &&
    echo "PASS $n $(grep -o '[0-9]* tests\? from' "/tmp/portable-tests/$n.log" | head -1)" ||
    echo "FAIL $n (status $?)"
}
export -f run_one
ls "$root"/build-v3/devtests/test_* | xargs -P "$(nproc)" -I{} bash -c 'run_one {}' | sort | tee -a "$out/summary.txt"
cat /tmp/portable-tests/*.log >"$out/tests.log"
grep -h "SKIPPED\|FAILED" /tmp/portable-tests/*.log | sort -u | head -50 | tee -a "$out/summary.txt" || true
! grep -q '^FAIL' "$out/summary.txt"
