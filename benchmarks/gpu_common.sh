# Sourced by the device scripts (gpu_*.sh): run from the repo root, results under $OUT, the GPU's
# name first, and run() that times out and logs each command.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
run() { echo "== $*"; timeout "${T:-580}" "$@" 2>&1 | tee -a "$OUT/log.txt"; }
