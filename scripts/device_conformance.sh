#!/usr/bin/env bash
# The CUDA run of the conformance issue, made with the `device` tool (CI has no GPU): the ONNX
# node test suite on CUDA (its JSON becomes docs/conformance_cuda.json) and the op tests with
# sessions on CUDA. Logs go to $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DYNASHAPE_TEST_DEVICE=cuda
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, onnx, onnxruntime; print('torch', torch.__version__, torch.cuda.get_device_name(), \
'onnx', onnx.__version__, 'ort', onnxruntime.__version__)" | tee "$OUT/env.txt"
python3 -m tests.conformance.suite --device cuda --json "$OUT/conformance_cuda.json" > "$OUT/conformance_cuda.log" 2>&1
grep -v Warning "$OUT/conformance_cuda.log" | tail -40
python3 -m pytest tests/ops tests/test_runtime.py tests/test_subgraphs.py -q -p no:cacheprovider -rf 2>&1 \
  | tee "$OUT/cuda_op_tests.log" | tail -25
