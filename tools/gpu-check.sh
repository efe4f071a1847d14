#!/usr/bin/env bash
# The GPU checks in one short run, one report: every test labelled "gpu"
# (the CUDA kernels and `exmy quantize --device cuda` against the CPU, bit
# for bit or within their stated FP32 budgets: tests/formats/test_cuda.cpp,
# tests/models/test_layers_cuda.cpp, tests/models/test_ssd_cuda.cpp,
# tests/models/test_attention_cuda.cpp, tests/sim/test_cli_cuda.cpp,
# tests/sim/test_gemm_cuda.cpp, tests/sim/test_linear_cuda.cpp,
# tests/models/test_model_device.cpp, tests/quant/test_grouped_cuda.cpp,
# tests/quant/test_quant_stats_cuda.cpp, tests/quant/test_fp32_gemm_bf16.cpp),
# `exmy bench quantize --device cuda --repeat 3`, short training runs on the
# CPU and the device side by side (tools/gpu-train-check.sh), a
# data-parallel run with NCCL against one process (tools/gpu-nccl-check.sh)
# and the CPU benchmark of that machine's cores.
#
#   tools/gpu-check.sh            # on a machine with a CUDA device
#   tools/gpu-check.sh --build    # only build build-cuda/ and its bundle (portable, no -march=native)
#   GPU_CHECK_TEST_TIMEOUT=120 GPU_CHECK_CPU_BENCH=0 tools/gpu-check.sh
#                                 # seconds per test binary (300); without the CPU benchmark
#
# Prepared for a lent device machine: build here with --build, which puts
# every binary the checks run and the shared libraries they load into
# build-cuda/gpu-bundle/ (bin/, lib/); carry that one folder there and run
# this script (under 8 minutes; the tests and the device benchmark alone
# took 15 s on an H200). Where the working tree and the bundle pass the
# device tool's 64 MiB, carry it as one archive instead:
#   tar -cJf build-cuda/bundle.tar.xz -C build-cuda gpu-bundle
#   run(command="tar -xJf build-cuda/bundle.tar.xz -C build-cuda && tools/gpu-check.sh",
#       carry=["build-cuda/bundle.tar.xz"])
# Without the bundle it builds the binaries itself (needs cmake, nvcc, GoogleTest, HDF5, Boost). The report
# (report.txt, with the tests' summaries and the benchmarks), nvidia-smi's and
# the CPU's description, and the tests' logs and gtest XML (logs.tar.gz) go
# to $OUT when it is set (the device tool brings $OUT back), else to
# build-cuda/gpu-check/. Exit status:
# 0 when every test ran and passed, 3 when any was skipped (no device seen),
# 4 when the training comparison failed, 5 when an 8B run failed (a run
# that only ran out of its time is reported, not failed), 6 when the NCCL
# comparison failed, else the first failing binary's status.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/portable-lib.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
bundle=build-cuda/gpu-bundle
# the gpu-labelled test binaries (build-cuda/ paths) and the targets that make them
tests="tests/formats/test_cuda tests/models/test_layers_cuda tests/models/test_ssd_cuda tests/models/test_attention_cuda tests/sim/test_cli_cuda tests/sim/test_gemm_cuda tests/sim/test_linear_cuda tests/models/test_model_device tests/quant/test_grouped_cuda tests/quant/test_quant_stats_cuda tests/quant/test_fp32_gemm_bf16"
targets="exmy test_cuda test_cuda_emulated test_layers_cuda test_layers_cuda_emulated test_ssd_cuda test_ssd_cuda_emulated test_attention_cuda test_attention_cuda_emulated test_cli_cuda test_gemm_cuda test_linear_cuda test_model_device test_model_device_emulated test_grouped_cuda test_grouped_cuda_emulated test_quant_stats_cuda test_quant_stats_cuda_emulated test_fp32_gemm_bf16 test_fp32_gemm_bf16_emulated"

build() {
  # portable code: the binaries may run on another CPU than the one that built them
  # with MPI (when found) for a multi-rank NCCL run on a host with several
  # GPUs; a run without a launcher never initialises it
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DEXMY_CUDA=ON -DEXMY_NATIVE=OFF -DEXMY_MPI=AUTO >/dev/null
  # shellcheck disable=SC2086
  cmake --build build-cuda -j"$(nproc 2>/dev/null || echo 2)" --target $targets
  rm -rf "$bundle"
  mkdir -p "$bundle/bin"
  cp build-cuda/exmy "$bundle/bin/"
  for t in $tests; do cp "build-cuda/$t" "$bundle/bin/"; done
  # libgomp, libcudart, HDF5, Boost, where the device host lacks them
  copy_libs "$bundle/lib" "$bundle"/bin/*
  # the commit the binaries were built from (the device's copy of .git may be older)
  { git rev-parse --short=12 HEAD && git diff --quiet HEAD -- . || echo "(with uncommitted changes)"; } \
    2>/dev/null | tr '\n' ' ' >"$bundle/commit" || true
}

build_bench() {
  configure_v3
  cmake --build build-v3 -j"$(nproc 2>/dev/null || echo 2)" --target exmy_formats
  mkdir -p "$bundle/bin"
  g++ -std=c++20 -O2 -march=x86-64-v3 -fopenmp -static -I. \
    tools/bench_quantize_main.cpp sim/cli/bench_cmd.cpp sim/device/device.cpp build-v3/formats/libexmy_formats.a \
    -lboost_program_options -o "$bundle/bin/exmy-bench-v3"
}

if [ "${1:-}" = "--build" ]; then
  build
  build_bench
  echo "gpu-check: built $bundle ($(du -sh "$bundle" | cut -f1)); carry it to the device machine"
  exit 0
fi

out=${OUT:-build-cuda/gpu-check}
mkdir -p "$out"
report="$out/report.txt"
# the binaries' logs and gtest XML travel as one archive (the device tool
# brings at most 8 files back)
logs=$(mktemp -d)
trap 'tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null; rm -rf "$logs"' EXIT
{ nvidia-smi || echo "nvidia-smi: not available"; } >"$out/nvidia-smi.txt" 2>&1
if ! { [ -x "$bundle/bin/exmy" ] && LD_LIBRARY_PATH="$PWD/$bundle/lib" "$bundle/bin/test_cuda" --gtest_list_tests >/dev/null 2>&1; }; then
  echo "gpu-check: no runnable $bundle; building it"
  build >"$out/build.log" 2>&1 || { echo "gpu-check: build failed (see $out/build.log)"; exit 2; }
fi
# carried libraries where the host lacks them, and the host's cuBLAS
cublas_dir=$(cuda_lib_path)
export LD_LIBRARY_PATH="$PWD/$bundle/lib${cublas_dir:+:$cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the reference vectors of this checkout and the exmy binary of the bundle,
# wherever the binaries were built
export EXMY_VECTORS_FILE="$PWD/tests/reference/quantize.jsonl"
export EXMY_BINARY_PATH="$PWD/$bundle/bin/exmy"
{
  echo "exmy gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), binaries built at commit $(cat "$bundle/commit" 2>/dev/null || echo unknown)"
  head -n 12 "$out/nvidia-smi.txt"
} >"$report"
# GPU_CHECK_TEST_TIMEOUT: seconds per test binary; GPU_CHECK_CPU_BENCH=0
# leaves out the CPU benchmark (where the lease is short); GPU_CHECK_DEADLINE:
# seconds for the whole check (480): a stage after the tests that would not
# fit in what is left is skipped with a line saying so, most important first
# (tests, device benchmarks, training comparison, NCCL, the 8B, the CPU)
test_timeout=${GPU_CHECK_TEST_TIMEOUT:-300}
cpu_bench=${GPU_CHECK_CPU_BENCH:-1}
deadline=${GPU_CHECK_DEADLINE:-480}
started=$(date +%s)
left() { echo $(( deadline - ($(date +%s) - started) )); }
# fits NAME SECONDS: whether a stage that needs about SECONDS still fits
fits() {
  if [ "$(left)" -lt "$2" ]; then
    echo "--- $1: skipped ($(left) s of GPU_CHECK_DEADLINE=$deadline left, it needs about $2)" >>"$report"
    return 1
  fi
}
status=0
for t in $tests; do
  name=$(basename "$t")
  rc=0
  t0=$(date +%s)
  timeout "$test_timeout" "$bundle/bin/$name" --gtest_output=xml:"$logs/$name.xml" >"$logs/$name.log" 2>&1 || rc=$?
  summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$logs/$name.log" | tr '\n' ' ')
  echo "$name: exit $rc ($(( $(date +%s) - t0 )) s); $summary" | tee -a "$report"
  grep -E "^\[  FAILED  \] [A-Za-z]" "$logs/$name.log" >>"$report" || true
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
done
# the GEMM rates and error-to-budget ratios test_gemm_cuda, test_linear_cuda and test_fp32_gemm_bf16
# printed, the attention block, row and fused kernels' and the SSD block, thread, fused and pieces kernels' times at sequence 4096
# test_attention_cuda and test_ssd_cuda printed, and the grouped MMA kernel's against a BF16 GEMM (test_grouped_cuda)
grep -h -E '^CudaGemm |largest error|^\[attention (rows|blocks|fused)\]|^\[ssd (threads|blocks|fused|pieces)|^\[grouped mma\]' \
  "$logs/test_gemm_cuda.log" "$logs/test_linear_cuda.log" "$logs/test_fp32_gemm_bf16.log" \
  "$logs/test_attention_cuda.log" "$logs/test_ssd_cuda.log" "$logs/test_grouped_cuda.log" >>"$report" 2>/dev/null || true
# the device benchmarks (need the device), then the CPU one (needs none)
if fits "exmy bench quantize --device cuda" 60; then
  echo "--- exmy bench quantize --device cuda --repeat 3" >>"$report"
  timeout 120 "$bundle/bin/exmy" bench quantize --device cuda --repeat 3 >>"$report" 2>&1 ||
    echo "gpu-check: bench quantize --device cuda failed" | tee -a "$report"
fi
# issue 17's step figures: the bf16 step's model FLOP rate against the
# same run's cuBLASLt BF16 GEMM rate on proxy-350m at sequence 4096, the FP4
# recipes against bf16 (and with statistics at every step), and proxy-50m
# on the device against two CPU threads; --profile adds one more pass of each
# configuration with every launch and GEMM timed (where the time goes)
if [ "${GPU_CHECK_BENCH_TRAIN:-1}" = 1 ]; then
  p350=(--model proxy-350m --seq-len 4096 --batch 1 --steps 2 --profile)
  if fits "exmy bench train --device cuda (proxy-350m)" 90; then
    echo "--- exmy bench train --device cuda ${p350[*]}" >>"$report"
    timeout 150 "$bundle/bin/exmy" bench train --device cuda "${p350[@]}" >>"$report" 2>&1 ||
      echo "gpu-check: bench train --device cuda failed or ran out of its 150 s" | tee -a "$report"
  fi
  # the same with attention and the SSD forward's chunk outputs as the fused
  # kernels (models/attention_fused.hpp, models/ssd_fused.hpp) and the SSD
  # backward's products on bfloat16 pieces (models/split_gemm.hpp; the
  # profile names each kernel beside the block launches' above)
  if fits "EXMY_CUDA_ATTENTION=fused EXMY_CUDA_SSD=fused,pieces exmy bench train --device cuda (proxy-350m)" 60; then
    echo "--- EXMY_CUDA_ATTENTION=fused EXMY_CUDA_SSD=fused,pieces exmy bench train --device cuda --model proxy-350m --seq-len 4096 --batch 1 --steps 1 --profile" >>"$report"
    EXMY_CUDA_ATTENTION=fused EXMY_CUDA_SSD=fused,pieces timeout 90 "$bundle/bin/exmy" bench train --device cuda --model proxy-350m \
      --seq-len 4096 --batch 1 --steps 1 --profile >>"$report" 2>&1 ||
      echo "gpu-check: bench train --device cuda, fused attention and SSD, SSD pieces, failed or ran out of its 90 s" | tee -a "$report"
  fi
  if fits "exmy bench train --device cuda --recipe (proxy-350m)" 120; then
    echo "--- exmy bench train --device cuda ${p350[*]} --recipe bf16,te-nvfp4,ue5m3-b16-fp32gemm,ue5m3-b16 --stats ue5m3-b16-fp32gemm" >>"$report"
    timeout 180 "$bundle/bin/exmy" bench train --device cuda "${p350[@]}" \
      --recipe bf16,te-nvfp4,ue5m3-b16-fp32gemm,ue5m3-b16 --stats ue5m3-b16-fp32gemm >>"$report" 2>&1 ||
      echo "gpu-check: bench train --device cuda --recipe failed or ran out of its 180 s" | tee -a "$report"
  fi
  # the grouped model on the float32 tiles (cuBLASLt FP32 GEMMs, a pass over
  # C per group) instead of the default MMA kernel
  if fits "exmy bench train --device cuda --recipe ue5m3-b16 on the float32 tiles (proxy-350m)" 60; then
    echo "--- EXMY_CUDA_GROUPED=tiles exmy bench train --device cuda --model proxy-350m --seq-len 4096 --batch 1 --steps 1 --recipe bf16,ue5m3-b16 --stats none" >>"$report"
    EXMY_CUDA_GROUPED=tiles timeout 90 "$bundle/bin/exmy" bench train --device cuda --model proxy-350m --seq-len 4096 \
      --batch 1 --steps 1 --recipe bf16,ue5m3-b16 --stats none >>"$report" 2>&1 ||
      echo "gpu-check: bench train --device cuda, grouped tiles, failed or ran out of its 90 s" | tee -a "$report"
  fi
  # the fp32 model's GEMMs in FP32 (CUDA cores) instead of the default BF16 tensor cores
  if fits "exmy bench train --device cuda --recipe --fp32-gemm sgemm (proxy-350m)" 60; then
    echo "--- exmy bench train --device cuda --model proxy-350m --seq-len 4096 --batch 1 --steps 1 --recipe bf16,te-nvfp4 --stats none --fp32-gemm sgemm" >>"$report"
    timeout 90 "$bundle/bin/exmy" bench train --device cuda --model proxy-350m --seq-len 4096 --batch 1 --steps 1 \
      --recipe bf16,te-nvfp4 --stats none --fp32-gemm sgemm >>"$report" 2>&1 ||
      echo "gpu-check: bench train --device cuda --fp32-gemm sgemm failed or ran out of its 90 s" | tee -a "$report"
  fi
  if fits "exmy bench train proxy-50m, device and 2 CPU threads" 150; then
    for where in "--device cuda" "--threads 2"; do
      echo "--- exmy bench train --model proxy-50m --precision fp32 --steps 1 $where" >>"$report"
      # shellcheck disable=SC2086
      timeout 120 "$bundle/bin/exmy" bench train --model proxy-50m --precision fp32 --steps 1 $where >>"$report" 2>&1 ||
        echo "gpu-check: bench train proxy-50m $where failed or ran out of its 120 s" | tee -a "$report"
    done
  fi
fi
# GPU_CHECK_TRAIN=0 leaves out the training comparison
if [ "${GPU_CHECK_TRAIN:-1}" = 1 ] && fits "training comparison" 120; then
  rc=0
  tools/gpu-train-check.sh "$bundle/bin/exmy" "$out/train" >>"$report" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=4; fi
  tar -czf "$logs/train-logs.tar.gz" -C "$out" train 2>/dev/null && rm -rf "$out/train"
fi
# GPU_CHECK_NCCL=0 leaves out the NCCL data-parallel comparison
if [ "${GPU_CHECK_NCCL:-1}" = 1 ] && fits "NCCL comparison" 60; then
  rc=0
  tools/gpu-nccl-check.sh "$bundle/bin/exmy" "$out/nccl" >>"$report" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=6; fi
  tar -czf "$logs/nccl-logs.tar.gz" -C "$out" nccl 2>/dev/null && rm -rf "$out/nccl"
fi
# GPU_CHECK_8B=0 leaves out the few steps of nemotron-h-8b
if [ "${GPU_CHECK_8B:-1}" = 1 ] && fits "nemotron-h-8b" 120; then
  rc=0
  # each of its runs gets a third of what is left, at most its own limit
  per_run=$(( $(left) / 3 ))
  [ "$per_run" -gt "${GPU_8B_TIMEOUT:-120}" ] && per_run=${GPU_8B_TIMEOUT:-120}
  GPU_8B_TIMEOUT=$per_run tools/gpu-8b-check.sh "$bundle/bin/exmy" "$out/8b" >>"$report" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=5; fi
  tar -czf "$logs/8b-logs.tar.gz" -C "$out" 8b 2>/dev/null && rm -rf "$out/8b"
fi
if [ "$cpu_bench" = 1 ] && [ -x "$bundle/bin/exmy-bench-v3" ] && fits "CPU benchmark" 60; then
  { grep -m1 "model name" /proc/cpuinfo; nproc; grep -m1 "^flags" /proc/cpuinfo; lscpu; } >"$out/cpu.txt" 2>&1 || true
  for t in "$(nproc)" 4; do
    echo "--- exmy bench quantize --threads $t (CPU, x86-64-v3 build)" >>"$report"
    OMP_PROC_BIND=close OMP_WAIT_POLICY=passive timeout 120 "$bundle/bin/exmy-bench-v3" quantize --threads "$t" \
      >>"$report" 2>&1 || echo "gpu-check: bench with $t threads failed" | tee -a "$report"
  done
fi
cat "$report"
if [ "$status" -ne 0 ]; then
  echo "gpu-check: FAILED (status $status)" | tee -a "$report"
  exit "$status"
fi
# (CudaPath.NoDeviceIsAnError is skipped exactly when a device is present)
if grep -q "needs a CUDA device" "$logs"/*.log; then
  echo "gpu-check: tests were skipped (no CUDA device seen): nothing was checked" | tee -a "$report"
  exit 3
fi
echo "gpu-check: passed" | tee -a "$report"
