#!/usr/bin/env bash
# One device call for LLM serving (issue 39): the paged engine's load figures, results under $OUT.
#   bash benchmarks/gpu_llm.sh [load|tests]
source "$(dirname "$0")/gpu_common.sh"
case "${1:-load}" in
  tests)  # the process-exit fix's CUDA test, the paged engine and the LLM server's tests
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE \
      tests/impls/test_conv_buckets.py tests/paged tests/serve/test_llm.py ;;
  load)  # 64 conversations, Poisson, prompts and outputs 16-512: the paged engine against one at a time;
         # the same with static impls off
    T=420 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 \
      --json "$OUT/llm_load.json"
    T=240 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 --no-lone \
      --static-impls off --json "$OUT/llm_load_static_off.json" ;;
  final)  # the paged engine's tests, then the load saturating it (128/s, all at once), at 32/s with the lone
          # runs, all at once with a token budget of 256 a step and 128/s with a prefill budget of 256 while
          # decode rows run (the ITL's p99); CHUNK=--chunk-graphs
          # captures the prompt-chunk runs too
    DYNASHAPE_TEST_DEVICE=cuda T=90 run python3 -m pytest -q -x -p no:warnings -rfE \
      tests/ops/test_paged_attention.py tests/paged
    for r in 128 0; do
      T=45 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate $r --no-lone \
        ${CHUNK:-} --json "$OUT/llm_load_rate$r.json"
    done
    T=60 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 32 \
      ${CHUNK:-} --json "$OUT/llm_load.json"
    T=45 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 0 --no-lone \
      --token-budget 256 ${CHUNK:-} --json "$OUT/llm_load_budget256.json"
    T=45 run python3 benchmarks/llm_load.py --device cuda --layers 12 --conversations 64 --rate 128 --no-lone \
      --prefill-budget 256 ${CHUNK:-} --json "$OUT/llm_load_prefill256.json" ;;
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
