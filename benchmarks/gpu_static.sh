#!/usr/bin/env bash
# One device call for the implementations issue: CUDA tests of static impls, then the
# static-impl benchmark (BERT-base, ResNet-50, greedy decode), results under $OUT.
#   bash benchmarks/gpu_static.sh [smoke|tests|profile|conv|bench|peers|peers-tf32]
# peers: onnx2torch travels as a wheel in .whl/ (carry it; see docs/benchmarks.md)
source "$(dirname "$0")/gpu_common.sh"
case "${1:-bench}" in
  smoke)
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -x tests/impls
    T=300 run python benchmarks/static_impls.py --device cuda --bert-layers 2 --bert-shapes 1x16,4x64,2x32 \
      --resnet-batches 1,4 --decode-layers 2 --steps 16 --batch 1 --repeats 4 --json "$OUT/smoke.json" ;;
  tests)
    DYNASHAPE_TEST_DEVICE=cuda T=580 run python -m pytest -q -p no:warnings tests/impls tests/ops/test_specialise.py tests/test_models.py \
      tests/memory tests/compile tests/test_runtime.py tests/test_errors.py ;;
  profile)
    T=200 run python benchmarks/profile_static.py --device cuda --shape 4x64
    T=150 run python benchmarks/profile_static.py --device cuda --shape 1x16 ;;
  kernels)  # the kernels of a replayed call against eager's (BERT-base, ResNet-50)
    for a in "bert 1x16" "bert 4x64" "resnet 1" "resnet 16"; do
      set -- $a; T=150 run python benchmarks/profile_kernels.py --model $1 --shape $2
    done ;;
  gemm)  # the tuned products: per shape against cuBLAS, then BERT-base with them in its static impls
    T=240 run python benchmarks/linear_forms.py --json "$OUT/linear_forms.json"
    T=300 run python benchmarks/static_impls.py --device cuda --models bert --peers none --repeats 5 \
      --json "$OUT/static_impls_bert_tuned.json" ;;
  cudnn-limit)  # ResNet-50's static impls with cuDNN timing 10 (torch's default) or all of its algorithms
    for lim in 10 0; do
      DYNASHAPE_CUDNN_BENCHMARK_LIMIT=$lim T=240 run python benchmarks/static_impls.py --device cuda --models resnet \
        --peers none --repeats 5 --json "$OUT/resnet_cudnn_limit_$lim.json"
    done ;;
  conv)  # the Conv + Relu fusion: its tests, then ResNet-50 with the pass on and off
    DYNASHAPE_TEST_DEVICE=cuda T=300 run python -m pytest -q -p no:warnings tests/compile/test_fuse_conv_relu.py tests/impls
    for run_on in a1 b0 c1; do
      DYNASHAPE_FUSE_CONV_RELU=${run_on:1} T=240 run python benchmarks/static_impls.py --device cuda --models resnet \
        --json "$OUT/resnet_conv_relu_$run_on.json"
    done ;;
  bench)
    run python benchmarks/static_impls.py --device cuda --json "$OUT/static_impls_cuda.json" ;;
  peers|peers-tf32)  # BERT-base and ResNet-50 beside torch.compile and onnx2torch, strict fp32 or torch's defaults
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
    prec=fp32; [ "$1" = peers-tf32 ] && prec=torch-default
    run python benchmarks/static_impls.py --device cuda --models ${MODELS:-bert resnet} --precision $prec \
      --json "$OUT/static_impls_peers_$prec.json" ;;
esac
