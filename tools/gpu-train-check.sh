#!/usr/bin/env bash
# The training part of tools/gpu-check.sh: the same short runs on the CPU
# and on the CUDA device, their step losses side by side, and each run's
# tokens/s from its done line.
#
#   tools/gpu-train-check.sh EXMY OUTDIR >>report
#   GPU_TRAIN_DEVICE=cuda-emulated GPU_TRAIN_MODEL=proxy-tiny tools/gpu-train-check.sh build/exmy /tmp/t
#                       # a dry run of the script without a GPU (the emulation gives the CPU's bits: 0 difference,
#                       # but for bf16-fused-attention and bf16-fused-ssd, the chosen kernels' emulation)
#
# Runs (synthetic data, log every step):
#   fp32    proxy-10m, 50 steps, batch 8 x 256 tokens, fp32 policy
#   bf16    the same with train.precision = bf16
#   bf16-fused-attention  the same with EXMY_CUDA_ATTENTION=fused
#   bf16-fused-ssd  the same with EXMY_CUDA_SSD=fused,pieces
#   bf16-working  the same with train.working_weights = bf16 (and offloaded: the device run's bits)
#   fp32 and bf16-working offloaded (train.offload = optimizer) in chunks of
#   GPU_TRAIN_OFFLOAD_CHUNK elements (1000003): the device run's bits
#   ue5m3   proxy-10m, 20 steps, ue5m3-b16-fp32gemm, statistics every 5 steps,
#           its fp32 model in BF16 on both sides (train.fp32_gemm = bf16, the
#           device's default), and ue5m3-sgemm with FP32 GEMMs on both sides
#   row-scaled  ue5m3's runs with nvfp4-row-scaled (row outer scales)
# The check: the largest |loss_cuda - loss_cpu| / loss_cpu over the steps is
# at most 1e-3 for fp32 and bf16 and 1e-2 for ue5m3 and row-scaled (the device's GEMMs
# accumulate in another order, within the budgets the gpu tests derive; the
# differences then pass through training; stochastic rounding turns a
# one-ulp difference into another rounding, hence the wider figure). These
# are tolerances, not derived bounds: a first device run records the
# figures next to them.
set -uo pipefail
exmy=$1
out=$2
device=${GPU_TRAIN_DEVICE:-cuda}
model=${GPU_TRAIN_MODEL:-proxy-10m}
mkdir -p "$out"
status=0
losses() { grep -E '^step +[0-9]+/' "$1" | sed -E 's/^step +([0-9]+)\/[0-9]+ \| loss ([0-9.eE+-]+) .*/\1 \2/'; }
run() {  # name device steps sets...
  local name=$1 dev=$2 steps=$3
  shift 3
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  timeout 300 "$exmy" train --config experiments/proxy-tiny.ini --out "$out/$name-$dev" --force --steps "$steps" \
    --set "model.name=$model" --set train.batch_size=8 --set train.seq_len=256 --set train.log_interval=1 \
    --set train.eval_interval=0 --set train.eval_batches=1 --set data.synthetic_tokens=1048576 \
    --set "train.device=$dev" "${args[@]}" >"$out/$name-$dev.log" 2>&1
}
compare() {  # name steps tolerance sets...
  local name=$1 steps=$2 tol=$3
  shift 3
  for dev in cpu "$device"; do
    if ! run "$name" "$dev" "$steps" "$@"; then
      echo "train $name on $dev: FAILED ($(tail -n 1 "$out/$name-$dev.log"))"
      status=1
      return
    fi
  done
  local n
  n=$(paste <(losses "$out/$name-cpu.log") <(losses "$out/$name-$device.log") | awk 'NF == 4 && $1 == $3' | wc -l)
  if [ "$n" -ne "$steps" ]; then
    echo "train $name: $n of $steps steps' losses read from both logs: FAILED"
    status=1
    return
  fi
  local worst
  worst=$(paste <(losses "$out/$name-cpu.log") <(losses "$out/$name-$device.log") |
    awk 'BEGIN { s = "-" } { d = ($4 - $2) / $2; if (d < 0) d = -d; if (d > w) { w = d; s = $1 } } END { printf "%.3e at step %s", w, s }')
  local ok
  ok=$(echo "$worst" | awk -v t="$tol" '{ print ($1 <= t) ? "ok" : "FAILED" }')
  [ "$ok" = ok ] || status=1
  echo "train $name: largest relative loss difference $device vs cpu $worst (tolerance $tol): $ok"
  for dev in cpu "$device"; do echo "  $dev: $(grep -E '^done:' "$out/$name-$dev.log")"; done
}
echo "--- training: CPU against $device, $model (tools/gpu-train-check.sh)"
compare fp32 50 1e-3 train.precision=fp32 train.export_hf=fp32
# the same run again on the device: the same bits (fixed GEMM algorithms, no
# atomics in sums): every final weight, as the HF export writes it
if run fp32-again "$device" 50 train.precision=fp32 train.export_hf=fp32 &&
  cmp -s "$out/fp32-$device/hf/model.safetensors" "$out/fp32-again-$device/hf/model.safetensors"; then
  echo "train fp32 twice on $device: the same final weights, bit for bit: ok"
else
  echo "train fp32 twice on $device: the final weights differ (or the run failed): FAILED"
  status=1
fi
# the optimizer offloaded to the host (train.offload = optimizer): the host's
# update is the kernel's arithmetic (no contraction on either side), so the
# same final weights as the run with everything on the device. Chunks of
# 1000003 elements (EXMY_OFFLOAD_CHUNK; the default 16 Mi would hold the
# whole proxy) cut views and make a step many chunks, so the asynchronous
# copies overlap the host's update as they do for the 8B: a copy that lands
# late or starts early changes the weights.
offload_chunk=${GPU_TRAIN_OFFLOAD_CHUNK:-1000003}
if EXMY_OFFLOAD_CHUNK=$offload_chunk run fp32-offload "$device" 50 train.precision=fp32 train.export_hf=fp32 train.offload=optimizer &&
  cmp -s "$out/fp32-$device/hf/model.safetensors" "$out/fp32-offload-$device/hf/model.safetensors"; then
  echo "train fp32 with the optimizer offloaded on $device (chunks of $offload_chunk): the same final weights, bit for bit: ok"
  echo "  $(grep -E '^done:' "$out/fp32-offload-$device.log")"
else
  echo "train fp32 with the optimizer offloaded on $device: the final weights differ (or the run failed): FAILED"
  status=1
fi
compare bf16 50 1e-3 train.precision=bf16
# attention as the fused kernels (EXMY_CUDA_ATTENTION=fused,
# models/attention_fused.hpp; the CPU ignores it)
EXMY_CUDA_ATTENTION=fused compare bf16-fused-attention 50 1e-3 train.precision=bf16
# the SSD forward's chunk outputs and the backward's diagonal blocks as the
# fused kernels, the backward's other products on bfloat16 pieces
# (EXMY_CUDA_SSD=fused,pieces, models/ssd_fused.hpp, ssd_fused_bwd.hpp,
# models/split_gemm.hpp; bfloat16 x, B, C in one piece each)
EXMY_CUDA_SSD=fused,pieces compare bf16-fused-ssd 50 1e-3 train.precision=bf16
# BF16 working weights (train.working_weights = bf16): the fused update and
# rounding kernel against the CPU; offloaded (the master on the host,
# rounded chunks sent up) the same final weights as on the device
compare bf16-working 50 1e-3 train.working_weights=bf16 train.export_hf=bf16
if EXMY_OFFLOAD_CHUNK=$offload_chunk run bf16-working-offload "$device" 50 train.working_weights=bf16 train.export_hf=bf16 train.offload=optimizer &&
  cmp -s "$out/bf16-working-$device/hf/model.safetensors" "$out/bf16-working-offload-$device/hf/model.safetensors"; then
  echo "train bf16 working weights with the optimizer offloaded on $device (chunks of $offload_chunk): the same final weights, bit for bit: ok"
else
  echo "train bf16 working weights with the optimizer offloaded on $device: the final weights differ (or the run failed): FAILED"
  status=1
fi
compare ue5m3 20 1e-2 train.recipe=ue5m3-b16-fp32gemm train.fp32_gemm=bf16 train.stats_interval=5
compare ue5m3-sgemm 20 1e-2 train.recipe=ue5m3-b16-fp32gemm train.fp32_gemm=sgemm train.stats_interval=5
compare row-scaled 20 1e-2 train.recipe=nvfp4-row-scaled train.fp32_gemm=bf16 train.stats_interval=5
exit $status
