#!/usr/bin/env bash
# The NCCL part of tools/gpu-check.sh (GPU_CHECK_NCCL=0 leaves it out): a
# short data-parallel run whose ranks move their gradients, weight shards
# and moments with NCCL on device buffers (train.comm = nccl) against the
# same run in one process on the device: the step losses must be the same
# bits (the gradient chain adds in micro-batch order on any number of
# ranks, docs/training.md "Data-parallel runs"). Prints the communication
# share from rank 0's summary line.
#
#   tools/gpu-nccl-check.sh EXMY OUTDIR >>report
#   GPU_NCCL_DEVICE=cuda-emulated GPU_NCCL_RANKS=2 tools/gpu-nccl-check.sh build/exmy /tmp/n
#                       # a dry run without a GPU: NCCL's host emulation over mpirun
#
# Ranks (GPU_NCCL_RANKS overrides): 2 when the machine has 2 or more GPUs
# and an mpirun is on PATH (each rank sees one device: CUDA_VISIBLE_DEVICES
# from Open MPI's local rank), else 1: one process that loads libnccl and
# sets up a 1-rank communicator on the device (no transfer runs then). The
# run: proxy-10m, 10 steps, 4 micro-batches of 4 x 256 tokens, the
# optimizer state sharded, a checkpoint at the end (the moments travel).
# libnccl: EXMY_NCCL_LIBRARY when set, else the first libnccl.so.2 found
# under /usr and /opt (the toolkit's, or a Python wheel's), else the
# loader's.
set -uo pipefail
exmy=$1
out=$2
device=${GPU_NCCL_DEVICE:-cuda}
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
mpirun=$(command -v mpirun || true)
ranks=${GPU_NCCL_RANKS:-$([ "${gpus:-0}" -ge 2 ] && [ -n "$mpirun" ] && echo 2 || echo 1)}
if [ -z "${EXMY_NCCL_LIBRARY:-}" ]; then
  lib=$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  [ -n "$lib" ] && export EXMY_NCCL_LIBRARY="$lib"
fi
echo "--- NCCL: $ranks rank(s) on $device against one process ($gpus GPUs seen; libnccl ${EXMY_NCCL_LIBRARY:-from the loader path}) (tools/gpu-nccl-check.sh)"
run() {  # name ranks sets...
  local name=$1 n=$2
  shift 2
  local args=(train --config experiments/proxy-tiny.ini --out "$out/$name" --force --steps 10
    --set model.name=proxy-10m --set train.batch_size=4 --set train.seq_len=256 --set train.grad_accum=4
    --set train.log_interval=1 --set train.eval_interval=0 --set train.eval_batches=1
    --set data.synthetic_tokens=1048576 --set "train.device=$device")
  for s in "$@"; do args+=(--set "$s"); done
  if [ "$n" -gt 1 ]; then
    # one device per rank: the rank's local index picks it
    timeout 300 "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np "$n" \
      /bin/sh -c 'CUDA_VISIBLE_DEVICES=${OMPI_COMM_WORLD_LOCAL_RANK:-0} exec "$@"' sh "$exmy" "${args[@]}" \
      >"$out/$name.log" 2>&1
  else
    timeout 300 "$exmy" "${args[@]}" >"$out/$name.log" 2>&1
  fi
}
# The step losses of a run file as raw bytes (h5py, else h5dump).
loss_bytes() {  # run.h5 out
  python3 -c 'import sys, h5py; open(sys.argv[2], "wb").write(h5py.File(sys.argv[1], "r")["/step_loss/loss"][()].tobytes())' \
    "$1" "$2" 2>/dev/null || h5dump -d /step_loss/loss -b LE -o "$2" "$1" >/dev/null 2>&1
}
status=0
for r in "one 1 train.comm=auto" "nccl $ranks train.comm=nccl"; do
  set -- $r
  if ! run "$1" "$2" "$3"; then
    echo "nccl check: the $1 run failed: $(grep -m1 'error' "$out/$1.log" || tail -n 1 "$out/$1.log")"
    exit 1
  fi
done
if ! loss_bytes "$out/one/run.h5" "$out/one.loss" || ! loss_bytes "$out/nccl/run.h5" "$out/nccl.loss"; then
  echo "nccl check: cannot read /step_loss/loss (needs python3 with h5py, or h5dump): FAILED"
  exit 1
fi
if [ -s "$out/one.loss" ] && cmp -s "$out/one.loss" "$out/nccl.loss"; then
  echo "nccl check: the step losses of $ranks rank(s) with train.comm = nccl are the one process's, bit for bit: ok"
else
  echo "nccl check: the step losses differ from the one process's: FAILED"
  paste <(grep -E '^step ' "$out/one.log") <(grep -E '^step ' "$out/nccl.log") | head -n 10
  status=1
fi
grep -E '^exmy train: model' "$out/nccl.log" | head -n 1
grep -E '^done:|ranks: .* in communication' "$out/nccl.log" || echo "  (1 rank: no communication share)"
exit $status
