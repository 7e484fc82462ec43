#!/usr/bin/env bash
# Pre-train with torchrun on one node or many. moquad reads only the torchrun environment
# (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT): NCCL on GPUs, gloo on CPU.
#
# One node, 8 GPUs:
#   NPROC=8 train/torchrun.sh --data /data/shards/k400 --recipe k400_r3d18_moquad_dagger --out runs/k400_r3d18
# Four nodes (run the same line on every node; HEAD = hostname of node 0):
#   NNODES=4 NPROC=8 HEAD=node001 train/torchrun.sh --data /data/shards/k400 --recipe k400_r3d50_moquad --out runs/k400_r3d50
# The recipe's batch_size is GLOBAL (256 in the paper): 4 nodes x 8 GPUs -> 8 videos (32 clips) per GPU.
set -euo pipefail
NNODES=${NNODES:-1}
NPROC=${NPROC:-$(python -c "import torch; print(max(1, torch.cuda.device_count()))")}
HEAD=${HEAD:-localhost}
PORT=${PORT:-29500}
JOB=${JOB:-moquad}
if [ "$NNODES" = 1 ]; then
  exec torchrun --standalone --nproc-per-node "$NPROC" -m moquad.cli pretrain "$@"
fi
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" --rdzv-backend c10d --rdzv-endpoint "$HEAD:$PORT" \
  --rdzv-id "$JOB" -m moquad.cli pretrain "$@"
