#!/usr/bin/env bash
# nemotron-h-8b on one CUDA device, a few steps (issue 18's device check),
# as part of tools/gpu-check.sh (GPU_CHECK_8B=0 leaves it out):
#   tools/gpu-8b-check.sh EXMY OUTDIR >>report
# Two runs of 5 optimizer steps at 1 x 4096 tokens with block recompute
# (the plan that fits an H200: exmy model-info --model nemotron-h-8b
# --device cuda --memory 139 --recompute blocks): the bf16 policy, and
# ue5m3-b16-fp32gemm with statistics at every step (the grouped GEMM model
# forms the FP32 product of every group of 64 along K, at FP32's rate: too
# slow at this size for a short check); and, when the host has the memory
# for it, the bf16 policy with
# the optimizer offloaded (train.offload = optimizer: 90.6 GiB of master
# weights and moments pinned in host memory, the device keeping 108.8 GiB
# without recompute). GPU_8B_RUNS picks among "bf16 ue5m3 offload". Each
# run's lines: the progress lines (loss, tok/s), the done line, the device
# memory peak against the plan; then the step-time ratio. A run that does
# not finish within GPU_8B_TIMEOUT seconds (120) says so: that is a figure
# too.
set -uo pipefail
exmy=$1
out=$2
limit=${GPU_8B_TIMEOUT:-120}
mkdir -p "$out"
status=0
echo "--- nemotron-h-8b on $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1) (tools/gpu-8b-check.sh)"
for run in ${GPU_8B_RUNS:-bf16 ue5m3 offload}; do
  sets=(--set train.precision=bf16 --set train.recompute=blocks)
  [ "$run" = ue5m3 ] && sets=(--set train.recipe=ue5m3-b16-fp32gemm --set train.stats_interval=1 --set train.recompute=blocks)
  if [ "$run" = offload ]; then
    avail=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
    if [ "${avail:-0}" -lt 96 ]; then
      echo "8b offload: skipped (${avail} GiB of host memory available, the offloaded state needs 90.6)"
      continue
    fi
    sets=(--set train.precision=bf16 --set train.recompute=none --set train.offload=optimizer)
  fi
  rc=0
  timeout "$limit" "$exmy" train --config experiments/proxy-tiny.ini --out "$out/$run" --force --steps 5 \
    --set model.name=nemotron-h-8b --set train.batch_size=1 --set train.seq_len=4096 \
    --set train.log_interval=1 --set train.eval_interval=0 --set train.eval_batches=1 \
    --set train.keep_checkpoints=0 --set data.synthetic_tokens=200000 --set train.device=cuda "${sets[@]}" \
    >"$out/$run.log" 2>&1 || rc=$?
  echo "8b $run: exit $rc$([ "$rc" = 124 ] && echo " (did not finish 5 steps in $limit s)")"
  grep -E '^step |^done:|memory: peak|offloaded|error' "$out/$run.log" | sed 's/^/  /'
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && status=1
done
bf=$(grep -E '^done:' "$out/bf16.log" 2>/dev/null | sed -E 's/.*\(([0-9.]+)(k?) tok\/s\).*/\1\2/')
ue=$(grep -E '^done:' "$out/ue5m3.log" 2>/dev/null | sed -E 's/.*\(([0-9.]+)(k?) tok\/s\).*/\1\2/')
off=$(grep -E '^done:' "$out/offload.log" 2>/dev/null | sed -E 's/.*\(([0-9.]+)(k?) tok\/s\).*/\1\2/')
[ -n "$bf" ] && [ -n "$ue" ] && echo "8b tokens/s: bf16 $bf, ue5m3-b16-fp32gemm with statistics $ue"
[ -n "$off" ] && echo "8b tokens/s: bf16 with the optimizer offloaded, no recompute: $off"
exit $status
