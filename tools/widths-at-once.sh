#!/usr/bin/env bash
# Runs one test command at several forced vector widths at once (EXMY_SIMD,
# docs/architecture.md "The fast path"), each into its own log, then prints
# the logs in the order given; exits 1 if any width failed. The sanitizer
# stage of CI runs the fast-path suites at the forced widths with it
# (tools/ci-sanitize.sh).
#
#   tools/widths-at-once.sh "scalar avx2 avx512" build/tests/formats/test_formats --gtest_filter=...
set -uo pipefail
read -r -a widths <<<"$1"
shift
[[ ${#widths[@]} -gt 0 && $# -gt 0 ]] || { echo "usage: $0 \"WIDTH...\" COMMAND [ARG...]" >&2; exit 2; }
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for width in "${widths[@]}"; do
  EXMY_SIMD=$width "$@" >"$logs/$width.log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!widths[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "==> $(basename "$1") at EXMY_SIMD=${widths[$i]}: exit $rc"
  cat "$logs/${widths[$i]}.log"
  [[ $rc -eq 0 ]] || failed+=("${widths[$i]}")
done
[[ ${#failed[@]} -eq 0 ]] || { echo "widths-at-once: $(basename "$1") failed at EXMY_SIMD=${failed[*]}" >&2; exit 1; }
