#!/usr/bin/env bash
# The CUDA run of the memory issue, made with the `device` tool (CI has no GPU): the engine's
# CUDA tests (direct driver allocations, pinned host, managed), the conformance suite on CUDA
# (its JSON becomes docs/conformance_cuda.json) and the decode memory benchmark on the GPU.
# Usage: bash scripts/device_memory.sh MODEL.onnx   (the benchmark's decoder, carried along)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=$1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
python3 -m pytest tests/memory -q -p no:cacheprovider -rfs 2>&1 | tee "$OUT/memory_tests_cuda.log" | tail -15
python3 -m tests.conformance.suite --device cuda --json "$OUT/conformance_cuda.json" > "$OUT/conformance_cuda.log" 2>&1
grep -v Warning "$OUT/conformance_cuda.log" | grep -v "^  " | cut -c1-160 | tail -30
python3 benchmarks/decode_memory.py --device cuda --model "$MODEL" --json "$OUT/decode_memory_cuda.json" \
  --plot "$OUT/decode_memory_cuda.png" 2>&1 | tee "$OUT/decode_memory_cuda.log" | tail -30
