#!/usr/bin/env bash
# One device call for the implementations issue: CUDA tests of static impls, then the
# static-impl benchmark (BERT-base, ResNet-50, greedy decode), results under $OUT.
#   bash benchmarks/gpu_static.sh [smoke|tests|bench]
source "$(dirname "$0")/gpu_common.sh"
case "${1:-bench}" in
  smoke)
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -x tests/impls
    T=300 run python benchmarks/static_impls.py --device cuda --bert-layers 2 --bert-shapes 1x16,4x64,2x32 \
      --resnet-batches 1,4 --decode-layers 2 --steps 16 --batch 1 --repeats 4 --json "$OUT/smoke.json" ;;
  tests)
    DYNASHAPE_TEST_DEVICE=cuda T=580 run python -m pytest -q -p no:warnings tests/impls tests/test_models.py \
      tests/memory tests/compile tests/test_runtime.py tests/test_errors.py ;;
  profile)
    T=200 run python benchmarks/profile_static.py --device cuda --shape 4x64
    T=150 run python benchmarks/profile_static.py --device cuda --shape 1x16 ;;
  bench)
    run python benchmarks/static_impls.py --device cuda --json "$OUT/static_impls_cuda.json" ;;
esac
