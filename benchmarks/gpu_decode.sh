#!/usr/bin/env bash
# Device calls for the decode issue (whole-step graphs over KV storages): CUDA tests, the decode
# benchmark against eager and the compiled static-cache rewrite, results under $OUT.
#   bash benchmarks/gpu_decode.sh [final_1b|even|cuda_ep|split_sweep|builder_norms|builder_final|rows_sweep|builder|builder_rows|kernels|smoke|tests|bench|half32|cuda1|buckets|mask|hf|ahead|fusions|first|guard]
source "$(dirname "$0")/gpu_common.sh"
case "${1:-bench}" in
  final_1b)  # the TinyLlama-1.1B-shaped folder at this session's end (carry .cache/builder_1b_skeleton), a step's kernels
    T=100 run python benchmarks/builder_skeleton.py fill .cache/builder_1b_skeleton
    T=100 run python benchmarks/generate_builder_gpu.py .cache/builder_1b_skeleton --only-default --steps 200 \
      --json "$OUT/generate_builder_end.json"
    T=120 run python benchmarks/decode_kernels.py --folder .cache/builder_1b_skeleton --json "$OUT/decode_kernels_1b.json" \
      | head -30 ;;
  even)  # the rows kernel's whole tiles loaded without masks: its CUDA tests, the sweep (the rule masked and not), the
         # TinyLlama-1.1B-shaped folder (carry .cache/builder_1b_skeleton)
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python -m pytest -q -p no:warnings -rfE tests/contrib/test_nbits_cuda.py
    T=200 run python benchmarks/nbits_rows_sweep.py --prequant --json "$OUT/nbits_rows_even.json" | grep -v "^  ("
    T=100 run python benchmarks/builder_skeleton.py fill .cache/builder_1b_skeleton
    T=100 run python benchmarks/generate_builder_gpu.py .cache/builder_1b_skeleton --only-default --steps 200 \
      --json "$OUT/generate_builder_even.json" ;;
  cuda_ep)  # the builder's CUDA folders (-e cuda: float16, and int4 with float16 A) against its CPU one, the op written
            # out and kept; then the TinyLlama-1.1B-shaped folder with its gate and up products merged
            # (fuse_parallel_matmul) and A's level-4 blocks made first from 8M weights. Carry .cache/genai_tiny_int4,
            # .cache/builder_tiny_fp16_cuda, .cache/builder_tiny_int4_cuda, .cache/builder_1b_skeleton
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -rfE tests/contrib/test_nbits_cuda.py \
      tests/compile/test_gqa_concat.py tests/test_generate.py tests/compile/test_fuse_parallel_nbits.py
    T=200 run python benchmarks/generate_builder_gpu.py .cache/genai_tiny_int4 .cache/builder_tiny_fp16_cuda/out \
      .cache/builder_tiny_int4_cuda/out --steps 200 --json "$OUT/generate_builder_cuda_ep.json"
    T=100 run python benchmarks/builder_skeleton.py fill .cache/builder_1b_skeleton
    T=100 run python benchmarks/generate_builder_gpu.py .cache/builder_1b_skeleton --only-default --steps 200 \
      --json "$OUT/generate_builder_merged.json" ;;
  split_sweep)  # kept for its results' names: the CUDA tests of the kernels whose code was shared (MatMulNBits, the
                # norms), then the sweep of A's level-4 blocks made first (the split and pairs forms measured on
                # 2026-11-30 were removed after)
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -rfE tests/contrib/test_nbits_cuda.py \
      tests/contrib/test_transformer_ops.py tests/compile/test_fuse_add_layer_norm.py
    T=330 run python benchmarks/nbits_rows_sweep.py --prequant --json "$OUT/nbits_rows_prequant.json" | grep -v "^  (" ;;
  builder_norms)  # the Skip norms as one Triton kernel: their CUDA tests, then the TinyLlama-1.1B-shaped folder (its
                  # weights made here) with the decode attention's sums form for its 8 query rows a KV head and without
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python -m pytest -q -p no:warnings -rfE tests/contrib/test_transformer_ops.py \
      tests/compile/test_gqa_concat.py
    T=100 run python benchmarks/builder_skeleton.py fill .cache/builder_1b_skeleton
    T=100 run python benchmarks/generate_builder_gpu.py .cache/builder_1b_skeleton --only-default --steps 200 \
      --json "$OUT/generate_builder_norms.json"
    T=100 run python benchmarks/generate_builder_gpu.py .cache/builder_1b_skeleton --only-default --steps 200 \
      --small-rows 4 --json "$OUT/generate_builder_norms_dot.json" ;;
  builder_final)  # builder folders on the GPU with the rows kernel's measured tiles: the CUDA tests, the tiny and
                  # TinyLlama-1.1B-shaped folders (the last carried as a skeleton, its weights made here), a step's kernels
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -rfE tests/contrib/test_nbits_cuda.py \
      tests/compile/test_gqa_concat.py tests/test_generate.py
    T=120 run python benchmarks/builder_skeleton.py fill .cache/builder_1b_skeleton
    T=360 run python benchmarks/generate_builder_gpu.py .cache/genai_tiny_int4 \
      .cache/builder_1b_skeleton --steps 200 --json "$OUT/generate_builder_final.json"
    T=120 run python benchmarks/decode_kernels.py --folder .cache/builder_1b_skeleton --json "$OUT/decode_kernels_1b.json" \
      | head -30 ;;
  rows_sweep)  # the rows kernel's tiles on the mid model's and a 1B model's shapes, then the mid folder's generation
               # with the rows kernel writing the plan's buffers
    T=300 run python benchmarks/nbits_rows_sweep.py --json "$OUT/nbits_rows_sweep.json" | grep -v "^  ("
    T=150 run python benchmarks/generate_builder_gpu.py .cache/builder_mid_int4 --steps 200 \
      --json "$OUT/generate_builder_into.json" ;;
  builder_rows)  # MatMulNBits' rows kernel (a decode step's few rows read from the packed weight): its CUDA tests,
                 # the builder folders' generation with it and without (DYNASHAPE_NBITS_ROWS=0), a step's kernels
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -rfE tests/contrib/test_nbits_cuda.py \
      tests/compile/test_gqa_concat.py
    for r in 1 0; do
      DYNASHAPE_NBITS_ROWS=$r T=200 run python benchmarks/generate_builder_gpu.py .cache/genai_tiny_int4 \
        .cache/builder_mid_int4 --steps 200 --json "$OUT/generate_builder_rows$r.json"
    done
    T=120 run python benchmarks/decode_kernels.py --folder .cache/builder_mid_int4 --json "$OUT/decode_kernels_mid.json" ;;
  builder)  # model builder folders (GroupQueryAttention, MatMulNBits) through dynashape.generate: the op written
            # out (whole-step graphs) against kept; carry .cache/genai_tiny_int4 and .cache/builder_mid_int4
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -rfE tests/compile/test_gqa_concat.py \
      tests/test_generate.py
    T=300 run python benchmarks/generate_builder_gpu.py .cache/genai_tiny_int4 .cache/builder_mid_int4 --steps 200 \
      --json "$OUT/generate_builder.json" ;;
  kernels)  # the CUDA tests of padded calls and static impls, then a streaming decode step's kernels (fp32 and
            # bf16 at batch 1, fp32 at batch 16): what the step's floor is made of
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -rfE tests/runtime/test_padded_calls.py \
      tests/ops/test_specialise.py tests/impls/test_static_impls.py
    for c in "float32 1" "bfloat16 1" "float32 16"; do
      set -- $c
      T=150 run python benchmarks/decode_kernels.py --dtype $1 --batch $2 --json "$OUT/decode_kernels_${1}_b$2.json"
    done ;;
  smoke)
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python -m pytest -q -p no:warnings -x tests/impls/test_decode_graphs.py
    T=300 run python benchmarks/decode_graphs.py --device cuda --dtype float32 --batch 1 4 --steps 128 --rounds 2 \
      --no-compile --json "$OUT/smoke.json" ;;
  tests)
    DYNASHAPE_TEST_DEVICE=cuda T=580 run python -m pytest -q -p no:warnings tests/impls tests/reliability \
      tests/compat ;;
  bench)
    run python benchmarks/decode_graphs.py --device cuda --memory-steps 1024 --json "$OUT/decode_graphs_cuda.json" ;;
  half32)  # fp16 at batch 1-32 and fp32 at batch 32, beside eager and the compiled rewrite
    T=330 run python benchmarks/decode_graphs.py --device cuda --dtype float16 --batch 1 4 16 32 --rounds 2 \
      --json "$OUT/decode_graphs_fp16.json"
    T=200 run python benchmarks/decode_graphs.py --device cuda --dtype float32 --batch 32 --rounds 2 \
      --json "$OUT/decode_graphs_fp32_b32.json" ;;
  cuda1)  # a session on the second GPU (a device that is not the current one)
    DYNASHAPE_TEST_DEVICE=cuda:1 T=580 run python -m pytest -q -p no:warnings tests/impls tests/serve/test_batching.py \
      tests/ops/test_kv_attention.py tests/compile/test_fuse_rotary.py \
      tests/test_runtime.py ;;
  mask)  # the export that takes an attention_mask (as HF optimum's decoders), fp32 and bf16
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python -m pytest -q -p no:warnings tests/impls/test_decode_graphs.py \
      tests/ops/test_kv_attention.py
    T=300 run python benchmarks/decode_graphs.py --device cuda --dtype float32 --batch 1 4 16 --rounds 2 --no-compile \
      --mask --json "$OUT/decode_graphs_mask_fp32.json"
    T=200 run python benchmarks/decode_graphs.py --device cuda --dtype bfloat16 --batch 1 4 --rounds 2 --no-compile \
      --mask --json "$OUT/decode_graphs_mask_bf16.json" ;;
  hf)  # transformers' LlamaForCausalLM as users export it (dynamo), beside transformers' own eager
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python -m pytest -q -p no:warnings tests/impls/test_decode_graphs.py \
      tests/ops/test_kv_attention.py tests/compile/test_fusion.py
    T=330 run python benchmarks/decode_graphs.py --device cuda --hf --batch 1 4 16 --rounds 2 \
      --json "$OUT/decode_graphs_hf_fp32.json" ;;
  ahead)  # the next bucket's graph built ahead on a thread, against built at the bucket change
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python -m pytest -q -p no:warnings tests/impls/test_decode_graphs.py \
      tests/ops/test_kv_attention.py tests/compile/test_fusion.py
    T=300 run python benchmarks/decode_ahead.py --device cuda --steps 1024 --repeats 3 --json "$OUT/decode_ahead.json" ;;
  guard)  # the next bucket built ahead by default, with synchronizes held during its captures
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python -m pytest -q -p no:warnings tests/impls/test_decode_graphs.py \
      tests/impls/test_capture_guard.py tests/impls/test_static_impls.py
    T=300 run python benchmarks/decode_ahead.py --device cuda --steps 1024 --repeats 3 --json "$OUT/decode_ahead.json"
    T=200 run python benchmarks/decode_graphs.py --device cuda --dtype float32 --batch 1 --steps 8 --rounds 1 \
      --no-compile --memory-steps 1024 --json "$OUT/memory.json" ;;
  fusions)  # the residual add in the product, the SwiGLU gate, rotary + KV writes in one kernel: with / without
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python -m pytest -q -p no:warnings tests/compile/test_fuse_residual.py \
      tests/compile/test_fusion.py tests/compile/test_linear_layout.py tests/impls/test_decode_graphs.py \
      tests/impls/test_step_fusions.py tests/ops/test_kv_attention.py
    T=330 run python benchmarks/decode_fusions.py --device cuda --json "$OUT/decode_fusions.json" ;;
  first)  # the first calls of a decode (a Triton cache empty, then filled) and the memory peaks
    export TRITON_CACHE_DIR=$(mktemp -d)
    T=200 run python benchmarks/decode_first_call.py --device cuda --profile --json "$OUT/first_call_cold.json"
    T=200 run python benchmarks/decode_first_call.py --device cuda --json "$OUT/first_call_warm.json"
    for who in "" --eager-memory; do
      T=200 run python benchmarks/decode_graphs.py --device cuda --dtype float32 --batch 1 --steps 8 --rounds 1 \
        --no-compile --memory-steps 1024 $who --json "$OUT/memory${who:+_eager}.json"
    done ;;
  buckets)
    for b in 256 pow2 openvino; do
      DYNASHAPE_KV_BUCKET=$b T=200 run python benchmarks/decode_graphs.py --device cuda --dtype float32 --batch 1 \
        --steps 1024 --rounds 1 --no-compile --json "$OUT/bucket_$b.json"
    done ;;
esac
