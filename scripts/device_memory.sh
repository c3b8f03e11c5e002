#!/usr/bin/env bash
# The CUDA run of the memory issue, made with the `device` tool (CI has no GPU): the memory tests
# with sessions on CUDA (plus the engine's CUDA-only tests: direct driver allocations, pinned
# host, managed), the decode memory benchmark and the in-place concat benchmark on the GPU.
# Usage: bash scripts/device_memory.sh MODEL.onnx   (the benchmark's decoder, carried along)
# Logs and JSON go to $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=$1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
DYNASHAPE_TEST_DEVICE=cuda python3 -m pytest tests/memory -q -p no:cacheprovider -rfs 2>&1 \
  | tee "$OUT/memory_tests_cuda.log" | tail -6
python3 benchmarks/decode_memory.py --device cuda --model "$MODEL" --json "$OUT/decode_memory_cuda.json" \
  --plot "$OUT/decode_memory_cuda.png" 2>&1 | tee "$OUT/decode_memory_cuda.log" | tail -24
python3 benchmarks/concat_inplace.py --device cuda --json "$OUT/concat_inplace_cuda.json" 2>&1 \
  | tee "$OUT/concat_inplace_cuda.log" | tail -40
