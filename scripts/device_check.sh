#!/usr/bin/env bash
# The CUDA run, made with the `device` tool on a GPU machine (CI has no GPU). Runs the op and
# model tests with sessions on CUDA, then the overhead benchmark on the GPU. Logs go to $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DYNASHAPE_TEST_DEVICE=cuda
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, onnx, onnxruntime, transformers; print('torch', torch.__version__, torch.cuda.get_device_name(), \
'onnx', onnx.__version__, 'ort', onnxruntime.__version__, 'transformers', transformers.__version__)" | tee "$OUT/env.txt"
python3 -m pytest tests -q -p no:cacheprovider -rf --durations=10 2>&1 | tee "$OUT/cuda_tests.log" | tail -40
python3 benchmarks/overhead.py --device cuda --json "$OUT/overhead_cuda.json" 2>&1 | tail -15
