#!/usr/bin/env bash
# One device call: the GPU figures of docs/benchmarks.md and a CUDA test pass, results under $OUT.
#   bash benchmarks/gpu_run.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python -m pip install -q --no-deps -e . >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
run() { echo "== $*"; timeout "${T:-900}" "$@" 2>&1 | tee -a "$OUT/log.txt"; }
run python benchmarks/overhead.py --device cuda --nodes 1000 --json "$OUT/overhead_cuda.json"
run python benchmarks/decode.py --device cuda --batch 1 4 --steps 128 --rounds 3 --json "$OUT/decode_cuda_tiny.json"
if [ "${1:-}" != quick ]; then
  run python benchmarks/decode.py --device cuda --config small --batch 1 4 --steps 64 --rounds 2 --json "$OUT/decode_cuda_small.json"
  DYNASHAPE_TEST_DEVICE=cuda T=600 run python -m pytest -q -p no:warnings tests/test_models.py tests/memory tests/compile tests/test_runtime.py tests/test_errors.py
fi
