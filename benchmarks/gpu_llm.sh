#!/usr/bin/env bash
# One device call for LLM serving (issue 39): the paged engine's load figures, results under $OUT.
#   bash benchmarks/gpu_llm.sh [load|staged|tests|final|packed|verify|chunk128|budget128|budget128_lone|stream|paged]
source "$(dirname "$0")/gpu_common.sh"
case "${1:-load}" in
  staged)  # a paged run's inputs in one copy (paged/staging.py), the generator's steps launched ahead of the token's
           # read, the direct allocator's deferred frees: their CUDA tests, the streaming loops (fp32 with a profile,
           # bf16, batch 16), the load at 128/s with the lone runs in the same process
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -x -p no:warnings -rfE tests/memory/test_engine_cuda.py \
      tests/test_generate.py tests/ops/test_paged_attention.py tests/paged
    T=100 run python3 benchmarks/generate_gpu.py --profile --json "$OUT/generate_gpu_ahead.json"
    T=80 run python3 benchmarks/generate_gpu.py --dtype bfloat16 --json "$OUT/generate_gpu_ahead_bf16.json"
    T=80 run python3 benchmarks/generate_gpu.py --batch 16 --json "$OUT/generate_gpu_ahead_b16.json"
    T=150 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 \
      --json "$OUT/llm_load_staged_rate128.json" ;;
  check)  # the first call after CPU-only changes to compiled Triton code (the one-row GEMV kernel, the few-row
          # attention helpers): their CUDA tests, the streaming loop fp32, then where the step's device time goes
          # (fp32 and bf16 at batch 1, fp32 at 16) and the paged engine's kernels
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python3 -m pytest -q -p no:warnings -rfE tests/compile/test_fuse_residual.py \
      tests/impls/test_decode_graphs.py tests/test_generate.py tests/memory tests/ops/test_kv_attention.py \
      tests/ops/test_paged_attention.py tests/paged
    T=80 run python3 benchmarks/generate_gpu.py --json "$OUT/generate_gpu_check.json"
    T=50 run python3 benchmarks/profile_decode.py
    T=50 run python3 benchmarks/profile_decode.py --dtype bfloat16
    T=50 run python3 benchmarks/profile_decode.py --batch 16
    T=80 run python3 benchmarks/llm_step_probe.py --kernels ;;
  rows)  # one-row kernels in half precision, the decode attention's blocks a program: their CUDA tests, then the
         # attention's sweep (block, warps, blocks a program) and the one-row kernels' tiles in bfloat16
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/compile/test_fuse_residual.py \
      tests/compile/test_linear_layout.py tests/ops/test_kv_attention.py tests/impls/test_decode_graphs.py \
      tests/test_generate.py
    T=150 run python3 benchmarks/kv_attention_tune.py --json "$OUT/kv_attention_tune.json"
    T=150 run python3 benchmarks/gemv_add_sweep.py --dtype bfloat16 --json "$OUT/gemv_add_sweep_bf16.json" ;;
  rowsmeasure)  # after rows: the attention's block rule and the half tiles, their CUDA tests, then the streaming
               # loops (fp32, bf16, fp32 batch 16), bf16's step profile and the paged load at 128/s with the lone runs
    DYNASHAPE_TEST_DEVICE=cuda T=100 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_kv_attention.py \
      tests/compile/test_fuse_residual.py
    T=80 run python3 benchmarks/generate_gpu.py --json "$OUT/generate_gpu_rows.json"
    T=80 run python3 benchmarks/generate_gpu.py --dtype bfloat16 --json "$OUT/generate_gpu_rows_bf16.json"
    T=70 run python3 benchmarks/generate_gpu.py --batch 16 --json "$OUT/generate_gpu_rows_b16.json"
    T=60 run python3 benchmarks/profile_decode.py --dtype bfloat16
    T=150 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 \
      --json "$OUT/llm_load_rows_rate128.json" ;;
  warps)  # the decode attention's warps (one warp: its few-row sums reduce within a warp), then the fp32 loop with
          # the rule's warps and with one warp for both kernels
    T=200 run python3 benchmarks/kv_attention_tune.py --quick --dtypes float32 --json "$OUT/kv_attention_warps.json"
    T=80 run python3 benchmarks/generate_gpu.py --json "$OUT/generate_gpu_warps4.json"
    T=80 run python3 -c "import runpy, sys; import dynashape.ops.kv_attention as ka; ka.NUM_WARPS = ka.COMBINE_WARPS = 1; \
sys.argv = ['generate_gpu.py', '--json', '$OUT/generate_gpu_warps1.json']; runpy.run_path('benchmarks/generate_gpu.py', run_name='__main__')" ;;
  warpsrule)  # one warp a program where a step has many KV heads' rows (batch 8 and more): the attention's CUDA
              # tests, the fp32 loop at batch 16 and at batch 1
    DYNASHAPE_TEST_DEVICE=cuda T=60 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_kv_attention.py
    T=70 run python3 benchmarks/generate_gpu.py --batch 16 --json "$OUT/generate_gpu_warps_b16.json"
    T=70 run python3 benchmarks/generate_gpu.py --json "$OUT/generate_gpu_warps_b1.json" ;;
  tests)  # the process-exit fix's CUDA test, the paged engine and the LLM server's tests
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE \
      tests/impls/test_conv_buckets.py tests/paged tests/serve/test_llm.py ;;
  load)  # 64 conversations, Poisson, prompts and outputs 16-512: the paged engine against one at a time;
         # the same with static impls off
    T=420 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 \
      --json "$OUT/llm_load.json"
    T=240 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 --no-lone \
      --static-impls off --json "$OUT/llm_load_static_off.json" ;;
  final)  # the paged engine's tests, the step graphs' replay times, the load at 32/s with the lone runs, at
          # 128/s, all at once, and the builder's tiny model (carry .cache/genai_tiny_int4)
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -x -p no:warnings -rfE \
      tests/ops/test_paged_attention.py tests/paged tests/serve/test_llm.py
    T=60 run python3 benchmarks/paged_step_probe.py
    T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 \
      --json "$OUT/llm_load.json"
    for r in 128 0; do
      T=60 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate $r --no-lone \
        --json "$OUT/llm_load_rate$r.json"
    done
    [ -d .cache/genai_tiny_int4 ] && T=90 run python3 benchmarks/llm_load.py --device cuda \
      --model .cache/genai_tiny_int4 --paged --conversations 64 --rate 32 --json "$OUT/llm_load_genai_tiny.json" ;;
  packed)  # a step's decode rows and prompt chunks in one run (opt-in): the CUDA tests, the tokens' equality
          # and the load at 32/s (with the lone runs) and 128/s, against the same without (final's)
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -x -p no:warnings -rfE \
      tests/ops/test_paged_attention.py tests/paged
    T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 --packed \
      --json "$OUT/llm_load_packed.json"
    T=60 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 --no-lone \
      --packed --json "$OUT/llm_load_packed_rate128.json" ;;
  verify)  # after CPU-only changes to the CUDA path: its CUDA tests, the default path's load at 32/s (tokens
          # checked against the lone runs), then packed runs at 32/s and 128/s
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -x -p no:warnings -rfE \
      tests/ops/test_paged_attention.py tests/paged tests/serve/test_llm.py || exit 1
    T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 \
      --json "$OUT/llm_load.json"
    T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 --packed \
      --json "$OUT/llm_load_packed.json"
    T=60 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 --no-lone \
      --packed --json "$OUT/llm_load_packed_rate128.json" ;;
  chunk128)  # prompt chunks of 128 positions (at 32/s its ITL p99 was 2.7x a lone step's, against 3.4x at 256):
             # 128/s and all at once
    for r in 128 0; do
      T=70 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate $r --no-lone \
        --chunk 128 --json "$OUT/llm_load_chunk128_rate$r.json"
    done ;;
  budget128)  # at 128/s, chunks of 128 and at most 128 prompt positions a step (a step with a chunk then costs a
              # decode run and one chunk run of 128), rows apart and packed
    T=70 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 --no-lone \
      --chunk 128 --prefill-budget 128 --json "$OUT/llm_load_budget128_rate128.json"
    T=70 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 --no-lone \
      --chunk 128 --prefill-budget 128 --packed --json "$OUT/llm_load_budget128_packed_rate128.json" ;;
  budget128_lone)  # packed runs, chunks of 128 and one a step, at 128/s with the lone runs in the same process
    T=150 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 \
      --chunk 128 --prefill-budget 128 --packed --json "$OUT/llm_load_budget128_packed_lone_rate128.json" ;;
  stream)  # prompt chunks on a stream of their own (opt-in): the watchdog probe (it exits at a stall with
          # the streams' state and every thread's stack), then the load at 32/s and 128/s with it
    T=120 run python3 benchmarks/paged_stream_probe.py --conversations 32 --rate 0 || exit 1
    T=120 run python3 benchmarks/paged_stream_probe.py --conversations 64 --rate 32 || exit 1
    T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 --chunk-stream \
      --json "$OUT/llm_load_stream.json"
    T=60 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 --no-lone \
      --chunk-stream --json "$OUT/llm_load_stream_rate128.json" ;;
  paged)  # the attention reading the pool in place (PagedAttention): its tests, then the load at 32/s
         # against the pasts gathered, and all 64 at once
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE \
      tests/ops/test_paged_attention.py tests/paged tests/serve/test_llm.py
    T=200 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 \
      --json "$OUT/llm_load.json"
    [ -n "${GATHERED:-}" ] && T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 \
      --rate 32 --no-lone --gathered --json "$OUT/llm_load_gathered.json"
    T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 --no-lone \
      --json "$OUT/llm_load_128.json"
    T=100 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 0 --no-lone \
      --json "$OUT/llm_load_burst.json" ;;
esac
