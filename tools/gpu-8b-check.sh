#!/usr/bin/env bash
# nemotron-h-8b on one CUDA device, a few steps (issue 18's device check),
# as part of tools/gpu-check.sh (GPU_CHECK_8B=0 leaves it out):
#   tools/gpu-8b-check.sh EXMY OUTDIR >>report
# Two runs of 5 optimizer steps at 1 x 4096 tokens with block recompute
# (the plan that fits an H200: exmy model-info --model nemotron-h-8b
# --device cuda --memory 139 --recompute blocks): the bf16 policy, and
# ue5m3-b16-fp32gemm with statistics at every step (the grouped GEMM model's
# kernel, one thread per output, is far too slow at this size for a short
# check). Each run's lines: the progress lines (loss, tok/s), the done line,
# the device memory peak against the plan; then the step-time ratio. A run
# that does not finish within GPU_8B_TIMEOUT seconds (120) says so: that
# is a figure too.
set -uo pipefail
exmy=$1
out=$2
limit=${GPU_8B_TIMEOUT:-120}
mkdir -p "$out"
status=0
echo "--- nemotron-h-8b on $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1) (tools/gpu-8b-check.sh)"
for run in bf16 ue5m3; do
  sets=(--set train.precision=bf16)
  [ "$run" = ue5m3 ] && sets=(--set train.recipe=ue5m3-b16-fp32gemm --set train.stats_interval=1)
  rc=0
  timeout "$limit" "$exmy" train --config experiments/proxy-tiny.ini --out "$out/$run" --force --steps 5 \
    --set model.name=nemotron-h-8b --set train.batch_size=1 --set train.seq_len=4096 --set train.recompute=blocks \
    --set train.log_interval=1 --set train.eval_interval=0 --set train.eval_batches=1 \
    --set train.keep_checkpoints=0 --set data.synthetic_tokens=200000 --set train.device=cuda "${sets[@]}" \
    >"$out/$run.log" 2>&1 || rc=$?
  echo "8b $run: exit $rc$([ "$rc" = 124 ] && echo " (did not finish 5 steps in $limit s)")"
  grep -E '^step |^done:|memory: peak|error' "$out/$run.log" | sed 's/^/  /'
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && status=1
done
bf=$(grep -E '^done:' "$out/bf16.log" 2>/dev/null | sed -E 's/.*\(([0-9.]+)(k?) tok\/s\).*/\1\2/')
ue=$(grep -E '^done:' "$out/ue5m3.log" 2>/dev/null | sed -E 's/.*\(([0-9.]+)(k?) tok\/s\).*/\1\2/')
[ -n "$bf" ] && [ -n "$ue" ] && echo "8b tokens/s: bf16 $bf, ue5m3-b16-fp32gemm with statistics $ue"
exit $status
