#!/usr/bin/env bash
# Preprocessing on a Ray cluster made of SLURM nodes: `ray start` on each node, then ONE driver
# submits one Ray task per output shard (`--engine ray`). Same shards and manifests as the local
# engine or a --num-parts array; re-submitting resumes (finished shards are skipped).
#
#   sbatch --nodes=4 scripts/preprocess_ray_slurm.sh k400 /data/k400 s3://bucket/k400 preprocess/k400.yaml
#
# --out is a folder every node sees (a shared filesystem) or an object-store URL (s3://, gs://):
# each task uploads its shard, the driver uploads the manifests and dataset.json last.
# Credentials come from each node's standard chain (AWS_* variables, ~/.aws, instance roles).
#
#SBATCH --job-name=moquad-ray-preprocess
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --mem=64G
#SBATCH --time=24:00:00
#SBATCH --output=logs/preprocess-ray-%j.out
set -euo pipefail

DATASET=${1:?usage: preprocess_ray_slurm.sh DATASET ROOT OUT [RECIPE]}
ROOT=${2:?dataset root}
OUT=${3:?output folder or s3:// URL}
RECIPE=${4:-preprocess/${DATASET}.yaml}
CPUS=${SLURM_CPUS_PER_TASK:-$(nproc)}
PORT=6379

mapfile -t NODES < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")
HEAD=${NODES[0]}
HEAD_IP=$(srun --nodes=1 --ntasks=1 -w "${HEAD}" hostname --ip-address | awk '{print $1}')
mkdir -p logs

srun --nodes=1 --ntasks=1 -w "${HEAD}" ray start --head --node-ip-address="${HEAD_IP}" --port=${PORT} \
    --num-cpus="${CPUS}" --block &
sleep 10
for node in "${NODES[@]:1}"; do
    srun --nodes=1 --ntasks=1 -w "${node}" ray start --address="${HEAD_IP}:${PORT}" --num-cpus="${CPUS}" --block &
done
sleep 10

moquad preprocess "${DATASET}" "${ROOT}" --out "${OUT}" --recipe "${RECIPE}" --engine ray \
    --ray-address "${HEAD_IP}:${PORT}"
moquad verify "${OUT}"
