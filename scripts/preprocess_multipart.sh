#!/usr/bin/env bash
# Multi-node preprocessing: one SLURM array task per part, each writing its own shards and
# manifest parts into the same --out folder (shared filesystem, or s3:// / gs://); the last part to
# finish merges. Every engine (this array, --engine local, --engine ray: preprocess_ray_slurm.sh) writes
# the same planned shards with the same per-shard function: for the same --num-parts, the same bytes.
#
#   sbatch --array=0-7 scripts/preprocess_multipart.sh k400 /data/k400 /data/shards/k400 k400
#
# Re-submitting the same command resumes: committed shards are kept, unfinished ones redone.
# If several parts finish at once, or a part was re-run alone, merge explicitly:
#   moquad preprocess k400 /data/k400 --out /data/shards/k400 --merge && moquad verify /data/shards/k400
#
#SBATCH --job-name=moquad-preprocess
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=32
#SBATCH --mem=64G
#SBATCH --time=24:00:00
#SBATCH --output=logs/preprocess-%A_%a.out
set -euo pipefail

DATASET=${1:?usage: preprocess_multipart.sh DATASET ROOT OUT [RECIPE]}
ROOT=${2:?dataset root}
OUT=${3:?output folder}
RECIPE=${4:-${DATASET}}  # a recipe name (`moquad recipes --stage preprocess`) or a YAML file
NUM_PARTS=${SLURM_ARRAY_TASK_COUNT:-${NUM_PARTS:-1}}
if [[ -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    PART=$((SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0}))  # works for --array=1-8 too
else
    PART=${PART:-0}  # without SLURM: NUM_PARTS=4 PART=2 bash scripts/preprocess_multipart.sh ...
fi
WORKERS=${SLURM_CPUS_PER_TASK:-$(nproc)}

mkdir -p logs
echo "part ${PART}/${NUM_PARTS} of ${DATASET} on $(hostname) with ${WORKERS} workers"
moquad preprocess "${DATASET}" "${ROOT}" --out "${OUT}" --recipe "${RECIPE}" \
    --num-parts "${NUM_PARTS}" --part "${PART}" --workers "${WORKERS}"
