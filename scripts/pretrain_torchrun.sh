#!/usr/bin/env bash
# Pre-train with torchrun on one node or many. moquad reads only the torchrun environment
# (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT): NCCL on GPUs, gloo on CPU.
#
# One node, 8 GPUs:
#   NPROC=8 scripts/pretrain_torchrun.sh --data /data/shards/k400 --recipe k400_r3d18_moquad_dagger --out runs/k400_r3d18
# Four nodes (run the same line on every node; HEAD = hostname of node 0):
#   NNODES=4 NPROC=8 HEAD=node001 scripts/pretrain_torchrun.sh --data /data/shards/k400 --recipe k400_r3d50_moquad --out runs/k400_r3d50
# The recipe's batch_size is GLOBAL (256 in the paper): 4 nodes x 8 GPUs -> 8 videos (32 clips) per GPU.
# Stopping early without losing steps: send SIGTERM to torchrun (`kill -TERM PID`, or a spot instance's
# shutdown); it forwards SIGTERM to every worker and waits 30 s, in which every rank finishes its step,
# rank 0 writes OUT/checkpoints/last.pt and the workers exit with code 75 (torchrun itself then ends
# with its own SignalException traceback). Continue with the same command plus --resume. Under SLURM use
# scripts/pretrain_slurm.sbatch (srun starts the ranks, so SLURM's SIGUSR1 warning reaches each of them).
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
