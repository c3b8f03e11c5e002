#!/usr/bin/env bash
# One device call for shapes that never repeat on the GPU (benchmarks/new_shapes_gpu.py), results under $OUT.
#   bash benchmarks/gpu_new_shapes.sh [warmprod|alone|parts_sync|parts_final|splithost|addln|bf16pad|newcost|bf16parts|prior|baseline|tests|probe|check|recheck|final|generate|lean|exported|split|split_final|timeline|buckets|warm|tune|kernels|host|split_host|one_call|one_call_final|cycle_log|settle|verify|tokens|tokens_ab|tokens_split|tokens_probe|tokens_flagfree|retune|idle_final|midway|courtesy]
source "$(dirname "$0")/gpu_common.sh"
M=/tmp/models; mkdir -p $M
case "${1:-final}" in
  pad_calls)  # padded calls at random shapes with what served each call (NEW_SHAPES_PER_CALL), and the CUDA tests
    DYNASHAPE_TEST_DEVICE=cuda T=120 run python3 -m pytest -q -p no:warnings -rfE tests/runtime/test_padded_calls.py
    NEW_SHAPES_PER_CALL=1 T=200 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --models-dir $M \
      --json "$OUT/new_shapes_pad_calls.json" | grep -E "│ bert" ;;
  pad_ready)  # padded calls that wait unpadded for their own bucket's graphs (SpecState.ready): the CUDA tests, then
              # BERT-base random padded and not, alternately, with what served each call
    DYNASHAPE_TEST_DEVICE=cuda T=100 run python3 -m pytest -q -p no:warnings -rfE tests/runtime/test_padded_calls.py
    for p in on off on; do
      NEW_SHAPES_PER_CALL=1 DYNASHAPE_PAD_INPUTS=$p T=100 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random \
        --models-dir $M --json "$OUT/new_shapes_pad_ready_$p.json" | grep -E "│ bert"
    done ;;
  pad_cached)  # padded calls with the disk cache: BERT-base random, a first process (cold) then a second one on its
               # cache (the buckets' shapes built at load), eager side by side
    DYNASHAPE_PAD_INPUTS=on T=400 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --models-dir $M \
      --cache-dir /tmp/dc_pad --second-process --json "$OUT/new_shapes_pad_cached.json" | grep -E "│ bert" ;;
  pad_probe)  # padded calls one shape at a time: eager, the dynamic path, the padded call's graph built in the call and
              # on the worker (first graph, then tuned)
    T=300 run python3 benchmarks/pad_probe.py --json "$OUT/pad_probe.json" ;;
  padded)  # calls padded to buckets of (batch, seq) where the model is proven to ignore the padding (runtime/
           # padded_calls.py), against unpadded, alternately: BERT-base random and cycled, eager side by side; the
           # CUDA tests of padded calls first
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/runtime/test_padded_calls.py \
      tests/ops/test_specialise.py tests/impls/test_static_impls.py
    for r in 1 2; do
      for p in off on; do
        DYNASHAPE_PAD_INPUTS=$p T=200 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle \
          --models-dir $M --json "$OUT/new_shapes_padded_${r}_$p.json" | grep -E "│ bert|bert_random dyna|pad"
      done
    done ;;
  gccycle)  # ResNet-50 cycled, cold, three times: its slow calls and the full garbage collections inside calls
    for r in 1 2 3; do
      T=120 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_cycle --models-dir $M --cache-dir /tmp/dc_gc_$r \
        --json "$OUT/new_shapes_gccycle_$r.json" | grep -E "full garbage|│ resnet"
      python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['resnet_cycle']
v = next(r for k, r in d.items() if k.startswith('dynashape'))
print('slow calls', [(i, round(x * 1e3, 1)) for i, x in enumerate(v['times_s']) if x > 0.012 and i > 0], 'gc', v.get('gc_full'))" \
        "$OUT/new_shapes_gccycle_$r.json"
    done ;;
  gcload)  # a full garbage collection at the end of a load that made many objects (runtime/gc_pause.py) against none
           # (DYNASHAPE_LOAD_COLLECT=0), alternately: BERT-base random with eager, the full collections inside calls listed
    for r in 1 2; do
      for c in 0 20000; do
        DYNASHAPE_LOAD_COLLECT=$c T=150 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --models-dir $M \
          --json "$OUT/new_shapes_gcload_${r}_$c.json" | grep -E "full garbage|│ bert"
      done
    done ;;
  convsplit_final)  # the prior's forms with split products where they won: its CUDA tests, ResNet-50 random and cycled,
                    # each in a process of its own, a second process on the disk cache; BERT-base random with
                    # torch.compile(dynamic=True) side by side
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_specialise.py \
      tests/impls/test_conv_buckets.py tests/test_disk_cache.py
    for w in resnet_random resnet_cycle; do
      T=200 run python3 benchmarks/new_shapes_gpu.py --workloads $w --sync-debug --models-dir $M \
        --cache-dir /tmp/dcache_csf_$w --second-process --json "$OUT/new_shapes_convsplit_final_$w.json"
    done
    T=400 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --compile --models-dir $M \
      --json "$OUT/new_shapes_compile_bert_random.json" ;;
  convsplit_ab)  # ResNet-50 cycled, cold, conv split forms off and on alternately (the first run on saw its graphs land
                 # later and one call of 21.8 ms), then the products' CUDA test whose tolerance now reads the norm
    DYNASHAPE_TEST_DEVICE=cuda T=100 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_specialise.py
    for r in 1 2; do
      for s in 0 1; do
        DYNASHAPE_CONV_SPLIT=$s T=120 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_cycle --models-dir $M \
          --cache-dir /tmp/dcache_ab_${r}_$s --json "$OUT/new_shapes_convsplit_ab_${r}_$s.json" | grep -E "eager|dynashape"
      done
    done ;;
  convsplit)  # convolutions as split bfloat16 products (tuned_conv's "_split" forms): the CUDA tests of the forms and
              # the split, the forms' times, then ResNet-50 random and cycled, each in a process of its own with a
              # second process on the disk cache, eager side by side
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_specialise.py \
      tests/ops/test_split_tf32.py tests/impls/test_conv_buckets.py
    for w in resnet_random resnet_cycle; do
      T=280 run python3 benchmarks/new_shapes_gpu.py --workloads $w --sync-debug --models-dir $M \
        --cache-dir /tmp/dcache_convsplit_$w --second-process --json "$OUT/new_shapes_convsplit_$w.json"
    done ;;
  warmprod)  # every variant of the split's kernel compiled at load, and the products' bfloat16 cuBLAS kernels loaded there
             # (split_tf32.warm_products): the split's CUDA tests, BERT-base's first call of 12,288 tokens profiled, then
             # BERT-base cycled and at random, each in a process of its own
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py
    T=100 run python3 benchmarks/first_big_call.py --options static_impls=off --top 12
    for w in bert_cycle bert_random; do
      T=200 run python3 benchmarks/new_shapes_gpu.py --workloads $w --sync-debug --models-dir $M \
        --json "$OUT/new_shapes_warmprod_$w.json"
    done ;;
  alone)  # every workload in a process of its own (eager's cuDNN plans not made by an earlier workload's calls:
          # the cycles after the random runs found eager's plans for their batches made), cold, eager side by
          # side, syncs checked, then a second process with the disk cache
    for w in resnet_cycle bert_cycle resnet_random bert_random; do
      T=280 run python3 benchmarks/new_shapes_gpu.py --workloads $w --sync-debug --models-dir $M \
        --cache-dir /tmp/dcache_alone --second-process --json "$OUT/new_shapes_alone_$w.json"
    done ;;
  parts_sync)  # AddLayerNorm's forms compiled at load: its CUDA tests and the generation tests (the bfloat16 split in
               # their builds); BERT-base random and cycled with the sync check and without (a 555 ms call in
               # parts_final's first process, as in idle_final's, both with the check)
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -x -p no:warnings -rfE \
      tests/compile/test_fuse_add_layer_norm.py tests/test_generate.py tests/impls/test_decode_graphs.py
    T=130 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --sync-debug --models-dir $M \
      --json "$OUT/new_shapes_parts_sync.json"
    T=130 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --models-dir $M \
      --json "$OUT/new_shapes_parts_nosync.json" ;;
  parts_final)  # bfloat16 split parts and AddLayerNorm: their CUDA tests, the split's host cost by part, then every
                # workload cold with eager side by side (syncs checked), and a second process with the disk cache
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/compile/test_fuse_add_layer_norm.py \
      tests/ops/test_split_tf32.py tests/compile/test_fuse_residual.py tests/test_host_syncs.py
    T=60 run python3 benchmarks/split_host.py
    T=400 run python3 benchmarks/new_shapes_gpu.py --sync-debug --models-dir $M --cache-dir /tmp/dcache_parts \
      --second-process --json "$OUT/new_shapes_parts_final.json" ;;
  splithost)  # AddLayerNorm's fixes: its CUDA tests and the split's; the split product's host cost by part (bfloat16
             # parts, then TF32's); the launch's cost again
    DYNASHAPE_TEST_DEVICE=cuda T=120 run python3 -m pytest -q -p no:warnings -rfE tests/compile/test_fuse_add_layer_norm.py \
      tests/ops/test_split_tf32.py
    T=60 run python3 benchmarks/split_host.py
    DYNASHAPE_SPLIT_PARTS=tf32 T=60 run python3 benchmarks/split_host.py
    T=60 run python3 -m benchmarks.triton_launch --json "$OUT/triton_launch.json" ;;
  addln)  # a residual add and its LayerNorm as one Triton kernel launched without the JIT's binding: the CUDA tests
          # (and the bfloat16 split's), the launch's host cost, what a new shape costs, BERT-base random and cycled
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/compile/test_fuse_add_layer_norm.py \
      tests/ops/test_split_tf32.py tests/compile/test_fuse_residual.py
    T=60 run python3 -m benchmarks.triton_launch --json "$OUT/triton_launch.json"
    T=100 run python3 benchmarks/new_shape_cost.py --json "$OUT/new_shape_cost_addln.json" > "$OUT/new_shape_cost_addln.txt"
    grep -E "^totals|^kernels" "$OUT"/new_shape_cost_addln.txt
    T=150 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --models-dir $M \
      --json "$OUT/new_shapes_addln.json" ;;
  bf16pad)  # bfloat16 parts at a new row count run at their bucket's rows (since reverted: no gain): what a new shape costs (the split rule as
            # it is, and from 2,048 rows), then BERT-base random and cycled with TF32 parts, bfloat16 parts, and
            # bfloat16 parts split from 2,048 rows, eager side by side
    rows2k='import sys, runpy; import dynashape.ops.split_tf32 as s; s.AUTO_ROWS = 2048; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")'
    DYNASHAPE_SPLIT_PARTS=bf16 T=100 run python3 benchmarks/new_shape_cost.py --json "$OUT/new_shape_cost_bf16pad.json" \
      > "$OUT/new_shape_cost_bf16pad.txt"
    DYNASHAPE_SPLIT_PARTS=bf16 T=100 run python3 -c "$rows2k" benchmarks/new_shape_cost.py \
      --json "$OUT/new_shape_cost_bf16pad_rows2k.json" > "$OUT/new_shape_cost_bf16pad_rows2k.txt"
    grep -E "^totals|^kernels" "$OUT"/new_shape_cost_*.txt
    T=150 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --models-dir $M \
      --json "$OUT/new_shapes_pad_tf32.json"
    DYNASHAPE_SPLIT_PARTS=bf16 T=150 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle \
      --models-dir $M --json "$OUT/new_shapes_pad_bf16.json"
    DYNASHAPE_SPLIT_PARTS=bf16 T=150 run python3 -c "$rows2k" benchmarks/new_shapes_gpu.py --workloads bert_random \
      bert_cycle --models-dir $M --json "$OUT/new_shapes_pad_bf16_rows2k.json" ;;
  newcost)  # what a new shape costs beyond its repeat, BERT-base at 1,024-4,096 tokens, bfloat16 parts: the split rule
            # as it is, then splitting from 1,024 rows
    DYNASHAPE_SPLIT_PARTS=bf16 T=200 run python3 benchmarks/new_shape_cost.py --json "$OUT/new_shape_cost_bf16.json" \
      > "$OUT/new_shape_cost_bf16.txt"
    rows1k='import sys, runpy; import dynashape.ops.split_tf32 as s; s.AUTO_ROWS = 1024; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")'
    DYNASHAPE_SPLIT_PARTS=bf16 T=200 run python3 -c "$rows1k" benchmarks/new_shape_cost.py \
      --json "$OUT/new_shape_cost_bf16_rows1k.json" > "$OUT/new_shape_cost_bf16_rows1k.txt"
    grep -E "^totals|^kernels" "$OUT"/new_shape_cost_*.txt ;;
  bf16parts)  # the split product with bfloat16 parts (DYNASHAPE_SPLIT_PARTS=bf16) against TF32 parts: errors and times
             # at BERT-base's products, then BERT-base random and cycled, eager side by side, with either parts
    T=120 run python3 -m benchmarks.split_tf32_error --json "$OUT/split_parts_error.json"
    T=200 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --models-dir $M \
      --json "$OUT/new_shapes_parts_tf32.json"
    DYNASHAPE_SPLIT_PARTS=bf16 T=200 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle \
      --models-dir $M --json "$OUT/new_shapes_parts_bf16.json" ;;
  idle_final)  # tuned rebuilds only while the calls pause (the default now): the CUDA tests of builds and the disk
               # cache; every workload cold, eager side by side, then a second process with the disk cache
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/impls/test_conv_buckets.py \
      tests/impls/test_cache_and_context.py tests/test_disk_cache.py tests/test_host_syncs.py
    T=400 run python3 benchmarks/new_shapes_gpu.py --sync-debug --models-dir $M --cache-dir /tmp/dcache \
      --second-process --json "$OUT/new_shapes_idle.json" ;;
  courtesy)  # background builds pause while a call is launched (DYNASHAPE_BUILD_COURTESY=1) against not: the CUDA
             # tests of builds, then ResNet-50 random and cycled and BERT-base cycled, eager side by side, each cold
    DYNASHAPE_TEST_DEVICE=cuda DYNASHAPE_BUILD_COURTESY=1 T=120 run python3 -m pytest -q -p no:warnings -rfE \
      tests/impls/test_conv_buckets.py tests/impls/test_cache_and_context.py
    DYNASHAPE_BUILD_COURTESY=1 T=200 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle \
      bert_cycle --models-dir $M --cache-dir /tmp/dcache_courtesy --json "$OUT/new_shapes_courtesy.json"
    T=200 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle bert_cycle --models-dir $M \
      --cache-dir /tmp/dcache_plain --json "$OUT/new_shapes_courtesy_off.json" ;;
  midway)  # a tuned rebuild's timing gives way before each form: its CUDA tests, then ResNet-50 random and cycled and
           # BERT-base cycled, eager side by side, cold (the slow calls listed)
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_specialise.py \
      tests/impls/test_conv_buckets.py tests/impls/test_cache_and_context.py tests/test_disk_cache.py
    T=300 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle bert_cycle --models-dir $M \
      --cache-dir /tmp/dcache_midway --json "$OUT/new_shapes_midway.json" ;;
  retune)  # tuned rebuilds beside the calls (default) against only while they pause (DYNASHAPE_RETUNE=idle):
           # ResNet-50 random and cycled, BERT-base cycled, eager side by side, each cold; the idle runs then again
           # in a second process with their disk cache
    T=240 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle bert_cycle --models-dir $M \
      --cache-dir /tmp/dcache_beside --json "$OUT/new_shapes_beside.json"
    DYNASHAPE_RETUNE=idle T=240 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle \
      bert_cycle --models-dir $M --cache-dir /tmp/dcache_idle --second-process --json "$OUT/new_shapes_idle.json" ;;
  tokens_small)  # token regions bucketed only up to 1,024 tokens (the calls bound by the host; larger ones, bound by
                 # the GPU, on the dynamic path): BERT random and cycled with eager, then without token regions
    small='import sys, runpy; import dynashape.runtime.aligned as a; a.MAX_TOKENS = 1024; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")'
    DYNASHAPE_TOKEN_BUCKETS=auto T=200 run python3 -c "$small" benchmarks/new_shapes_gpu.py --workloads bert_random \
      bert_cycle --models-dir $M --json "$OUT/new_shapes_tokens_small.json"
    T=120 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --only-dynashape --models-dir $M \
      --json "$OUT/new_shapes_tokens_small_off.json" ;;
  prior3|prior_final)  # an empty Triton cache: the CUDA tests; ResNet-50 random and cycled, eager side by side,
           # then a second process with the disk cache; the same without the prior; the cold cycle's timeline (prior3
           # ran with the prior's forms on the dynamic path too, since reverted: benchmarks/first_call_profile.py)
    export TRITON_CACHE_DIR=$(mktemp -d)
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_specialise.py \
      tests/impls/test_conv_buckets.py tests/test_host_syncs.py tests/ops/test_winograd.py
    export TRITON_CACHE_DIR=$(mktemp -d)
    T=240 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle --sync-debug --models-dir $M \
      --cache-dir /tmp/dcache --second-process --json "$OUT/new_shapes_prior.json"
    export TRITON_CACHE_DIR=$(mktemp -d)
    DYNASHAPE_FORM_PRIORS=0 T=100 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle \
      --only-dynashape --models-dir $M --json "$OUT/new_shapes_prior_off.json"
    export TRITON_CACHE_DIR=$(mktemp -d)
    T=80 run python3 benchmarks/build_timeline.py --workload resnet_cycle --calls 60 --log --per-call \
      --json "$OUT/timeline_resnet_cycle_prior.json" ;;
  prior2)  # the prior with Winograd's kernels compiled at load, on an empty Triton cache (a fresh machine): the CUDA
           # tests; ResNet-50 random and cycled with the prior and without; BERT's dynamic path, wall against kernels
    export TRITON_CACHE_DIR=$(mktemp -d)
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_specialise.py \
      tests/impls/test_conv_buckets.py
    export TRITON_CACHE_DIR=$(mktemp -d)
    T=150 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle --sync-debug --models-dir $M \
      --json "$OUT/new_shapes_prior.json"
    export TRITON_CACHE_DIR=$(mktemp -d)
    DYNASHAPE_FORM_PRIORS=0 T=100 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle \
      --only-dynashape --models-dir $M --json "$OUT/new_shapes_prior_off.json"
    export TRITON_CACHE_DIR=$(mktemp -d)
    T=80 run python3 benchmarks/build_timeline.py --workload resnet_cycle --calls 60 --log --per-call \
      --json "$OUT/timeline_resnet_cycle_prior.json"
    export TRITON_CACHE_DIR=$(mktemp -d)
    T=80 run python3 benchmarks/build_timeline.py --calls 100 --log --json "$OUT/timeline_resnet_random_prior.json" ;;
  prior)  # a first graph's convolutions take the prior form (ops/tuned_conv.py guess): the forms' and buckets' CUDA
          # tests; ResNet-50 random and cycled, eager side by side, with the prior and without; where BERT's dynamic
          # path spends its GPU time
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_specialise.py \
      tests/impls/test_conv_buckets.py
    T=150 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle --sync-debug --models-dir $M \
      --json "$OUT/new_shapes_prior.json"
    DYNASHAPE_FORM_PRIORS=0 T=100 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random resnet_cycle \
      --only-dynashape --models-dir $M --json "$OUT/new_shapes_prior_off.json"
    T=80 run python3 benchmarks/build_timeline.py --workload resnet_cycle --calls 60 --log --per-call \
      --json "$OUT/timeline_resnet_cycle_prior.json"
    for sh in 16x256 32x384; do
      T=90 run python3 benchmarks/profile_kernels.py --model bert --shape $sh --calls 10 --top 25 --no-untuned \
        --options static_impls=off
    done ;;
  tokens)  # token regions (codegen/tokens.py): their CUDA tests and the ones they touch; BERT random and cycled,
           # eager side by side, then a second process with the disk cache
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/impls/test_token_buckets.py \
      tests/impls/test_aligned.py tests/test_host_syncs.py
    T=360 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --sync-debug --models-dir $M \
      --cache-dir /tmp/dcache --second-process --json "$OUT/new_shapes_tokens.json" ;;
  tokens_ab)  # BERT random with and without token regions, eager side by side; the CUDA tests of static impls
    T=200 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --models-dir $M \
      --json "$OUT/new_shapes_tokens_on.json"
    DYNASHAPE_TOKEN_BUCKETS=0 T=120 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --only-dynashape \
      --models-dir $M --json "$OUT/new_shapes_tokens_off.json"
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/impls/test_token_buckets.py \
      tests/impls/test_aligned.py tests/impls/test_conv_buckets.py tests/test_generate.py ;;
  tokens_split)  # token regions whose first graphs take the split products the dynamic path takes; their tests
    T=200 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle --models-dir $M \
      --json "$OUT/new_shapes_tokens_split.json"
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/impls/test_token_buckets.py \
      tests/impls/test_aligned.py tests/ops/test_split_tf32.py ;;
  tokens_probe)  # token graphs per shape, built in the call (split products) and on the worker (IEEE); token regions
                 # built in the calls at a random shape per call
    DYNASHAPE_TOKEN_BUCKETS=auto T=200 run python3 benchmarks/token_probe.py
    DYNASHAPE_TOKEN_BUCKETS=auto T=200 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --models-dir $M \
      --options static_impls=sync --json "$OUT/new_shapes_tokens_sync.json" ;;
  tokens_flagfree)  # split products in Triton on the compile worker (split_tf32._flag_free), token buckets up to
                    # 6,144 tokens: the CUDA tests; per shape; BERT random and cycled with token regions, then without
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py \
      tests/impls/test_token_buckets.py
    DYNASHAPE_TOKEN_BUCKETS=auto T=100 run python3 benchmarks/token_probe.py
    DYNASHAPE_TOKEN_BUCKETS=auto T=160 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random bert_cycle \
      --models-dir $M --json "$OUT/new_shapes_tokens_flagfree.json"
    T=90 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --only-dynashape --models-dir $M \
      --json "$OUT/new_shapes_tokens_flagfree_off.json" ;;
  baseline)  # today's default and the dynamic path alone, with the host syncs they make
    T=280 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random bert_random --sync-debug \
      --models-dir $M --json "$OUT/base_default.json"
    T=200 run python3 benchmarks/new_shapes_gpu.py --workloads resnet_random bert_random --options static_impls=off \
      --sync-debug --models-dir $M --json "$OUT/base_off.json" ;;
  tests)  # this work's CUDA tests, then the static-impl tests they touch
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/test_host_syncs.py \
      tests/test_disk_cache.py tests/impls/test_conv_buckets.py tests/reliability/test_indices.py
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/impls ;;
  probe)  # this work's CUDA tests; where the calls' time goes (wall vs kernels); faster-than-SIMT fp32 products
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/test_host_syncs.py \
      tests/test_disk_cache.py tests/impls/test_conv_buckets.py tests/reliability/test_indices.py
    T=120 run python3 benchmarks/tf32x3_gemm.py --json "$OUT/tf32x3_gemm.json"
    T=200 run python3 benchmarks/gpu_bound.py --json "$OUT/gpu_bound.json" ;;
  generate)  # the CUDA tests of the generate API, decided Ifs and buckets; the streaming loop's figures
    DYNASHAPE_TEST_DEVICE=cuda T=260 run python3 -m pytest -q -p no:warnings -rfE tests/test_generate.py \
      tests/test_if_warm.py tests/test_subgraphs.py tests/impls/test_conv_buckets.py tests/test_host_syncs.py
    T=300 run python3 benchmarks/generate_gpu.py --steps 240 --json "$OUT/generate_gpu.json" ;;
  lean)  # the lean step (runtime/bound_step.py): the CUDA tests of generate and the decode graphs; the streaming
         # loop's figures and host profile; where a whole step's GPU time goes
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/test_generate.py \
      tests/impls/test_decode_graphs.py
    T=150 run python3 benchmarks/generate_gpu.py --steps 240 --profile --json "$OUT/generate_gpu.json"
    T=100 run python3 benchmarks/generate_gpu.py --steps 240 --dtype bfloat16 --json "$OUT/generate_gpu_bf16.json"
    T=100 run python3 benchmarks/generate_gpu.py --steps 240 --batch 16 --json "$OUT/generate_gpu_b16.json"
    T=100 run python3 benchmarks/profile_decode.py --layers 12 ;;
  exported)  # the exporters' models and NMS on CUDA; the host CPU's GQA bits; the streaming step's host time
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python3 -m pytest -q -p no:warnings -rfE tests/zoo/test_exported.py \
      tests/test_subgraphs.py tests/ops/test_signal.py -k "not stft"
    T=240 run python3 -m pytest -q -p no:warnings -rfE tests/contrib/test_ort_exact_rms_gqa.py tests/ops/test_small_work.py
    T=300 run python3 benchmarks/generate_gpu.py --steps 200 --profile --json "$OUT/generate_gpu.json" ;;
  check)  # the CUDA tests of this work, then every workload with dynashape alone and a second process
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python3 -m pytest -q -p no:warnings tests/impls tests/test_host_syncs.py \
      tests/test_disk_cache.py tests/reliability/test_indices.py
    T=330 run python3 benchmarks/new_shapes_gpu.py --sync-debug --models-dir $M --cache-dir /tmp/dcache \
      --second-process --json "$OUT/new_shapes_check.json" ;;
  recheck)  # after changes to the generated code (dels of dead locals) and to precompile's default: the CUDA tests
            # of static impls, decode graphs, generate and the disk cache; every workload, dynashape and eager, and
            # a second process
    DYNASHAPE_TEST_DEVICE=cuda T=270 run python3 -m pytest -q -p no:warnings -rfE tests/impls tests/test_generate.py \
      tests/test_host_syncs.py tests/test_disk_cache.py tests/compile/test_dead_locals.py
    T=300 run python3 benchmarks/new_shapes_gpu.py --sync-debug --models-dir $M --cache-dir /tmp/dcache \
      --second-process --json "$OUT/new_shapes_recheck.json" ;;
  final)  # the CUDA tests of this work; every workload, torch.compile side by side, then a second process
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings tests/impls/test_conv_buckets.py \
      tests/test_host_syncs.py tests/test_disk_cache.py tests/reliability/test_indices.py tests/impls/test_aligned.py
    T=430 run python3 benchmarks/new_shapes_gpu.py --compile --sync-debug --models-dir $M --cache-dir /tmp/dcache \
      --second-process --json "$OUT/new_shapes_h100.json" ;;
  split)  # float32 products on TF32 tensor cores (ops/split_tf32.py): its CUDA tests; BERT with fp32_products
          # "ieee" and the default ("auto"), dynashape alone
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py \
      tests/test_host_syncs.py tests/impls/test_conv_buckets.py
    for o in fp32_products=ieee fp32_products=auto; do
      T=100 run python3 benchmarks/new_shapes_gpu.py --workloads bert_random --only-dynashape --models-dir $M \
        --options $o --json "$OUT/new_shapes_bert_$o.json"
    done ;;
  split_final)  # the split's CUDA tests; every workload, torch.compile side by side, then a second process
    DYNASHAPE_TEST_DEVICE=cuda T=40 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py
    T=530 run python3 benchmarks/new_shapes_gpu.py --compile --sync-debug --models-dir $M --cache-dir /tmp/dcache \
      --second-process --json "$OUT/new_shapes_split.json" ;;
  timeline)  # when the background builds land (benchmarks/build_timeline.py): default, forms untimed, static off
    T=150 run python3 benchmarks/build_timeline.py --calls 200 --json "$OUT/timeline_default.json"
    DYNASHAPE_STATIC_FORMS=0 T=150 run python3 benchmarks/build_timeline.py --calls 200 --json "$OUT/timeline_untimed.json"
    T=100 run python3 benchmarks/build_timeline.py --calls 200 --options static_impls=off --json "$OUT/timeline_off.json" ;;
  buckets)  # conv batch buckets that land (first graph untimed, tuned rebuild): CUDA tests; timeline; ResNet workloads
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/impls/test_conv_buckets.py \
      tests/impls/test_aligned.py tests/impls/test_static_impls.py tests/test_disk_cache.py tests/impls/test_cache_and_context.py
    T=100 run python3 benchmarks/build_timeline.py --calls 200 --json "$OUT/timeline_default.json"
    T=400 run python3 benchmarks/new_shapes_gpu.py --sync-debug --models-dir $M \
      --cache-dir /tmp/dcache --second-process --json "$OUT/new_shapes_buckets.json" ;;
  warm)  # the disk cache's shapes built at load: CUDA tests; a timeline that writes the cache, then one that loads it
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/test_disk_cache.py \
      tests/impls/test_conv_buckets.py tests/impls/test_cache_and_context.py
    T=100 run python3 benchmarks/build_timeline.py --calls 200 --log --options cache_dir=/tmp/tc --json "$OUT/timeline_1.json"
    T=100 run python3 benchmarks/build_timeline.py --calls 200 --options cache_dir=/tmp/tc --json "$OUT/timeline_2.json"
    T=100 run python3 benchmarks/build_timeline.py --workload bert_cycle --calls 60 --log --options cache_dir=/tmp/tb \
      --json "$OUT/timeline_bert_1.json"
    T=100 run python3 benchmarks/build_timeline.py --workload bert_cycle --calls 60 --options cache_dir=/tmp/tb \
      --json "$OUT/timeline_bert_2.json" ;;
  tune)  # tuning in one queue per key: the CUDA tests of static impls; when the tuned rebuilds land under traffic
    DYNASHAPE_TEST_DEVICE=cuda T=240 run python3 -m pytest -q -p no:warnings -rfE tests/impls tests/test_disk_cache.py \
      tests/test_host_syncs.py
    T=100 run python3 benchmarks/build_timeline.py --calls 200 --log --json "$OUT/timeline_tune.json"
    T=100 run python3 benchmarks/build_timeline.py --workload bert_cycle --calls 60 --log --json "$OUT/timeline_bert.json" ;;
  kernels)  # where BERT's GPU time goes at mid and large shapes: the dynamic path, static impls, eager; the CUDA tests of
            # the disk cache's prebuilt shapes and the pinned forms
    for sh in 16x256 32x384 4x64; do
      T=150 run python3 benchmarks/profile_kernels.py --model bert --shape $sh --calls 10 --top 30 --no-untuned \
        --options static_impls=off
      T=150 run python3 benchmarks/profile_kernels.py --model bert --shape $sh --calls 10 --top 12 --no-untuned \
        --options static_impls=sync
    done
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/test_disk_cache.py \
      tests/impls/test_conv_buckets.py tests/impls/test_cache_and_context.py ;;
  host)  # BERT at random shapes: the host's time per call against its wall time, and a host profile
    T=200 run python3 benchmarks/host_split_gpu.py --calls 45 --profile
    T=200 run python3 benchmarks/host_split_gpu.py --calls 45 --profile --options static_impls=off ;;
  split_host)  # the host's cost of a split product and of its parts
    T=100 run python3 benchmarks/split_host.py ;;
  one_call)  # a split product in one call over three parts: its CUDA tests (accuracy), its host cost, and BERT-base
             # at random shapes under the forms and rules
    DYNASHAPE_TEST_DEVICE=cuda T=100 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py
    T=60 run python3 benchmarks/split_host.py
    DYNASHAPE_SPLIT_ONE_CALL_K=0 T=60 run python3 benchmarks/split_host.py
    T=400 run python3 benchmarks/split_tf32_variants.py --models-dir $M --json "$OUT/split_variants.json" ;;
  one_call_final)  # the TF32 switches' test; every workload with dynashape's defaults and eager, then a second process
    DYNASHAPE_TEST_DEVICE=cuda T=60 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py \
      -k background_build_takes
    T=450 run python3 benchmarks/new_shapes_gpu.py --sync-debug --models-dir $M --cache-dir /tmp/dcache \
      --second-process --json "$OUT/new_shapes_one_call.json" ;;
  cycle_log)  # ResNet-50 cycling batches, cold: each call beside the compile worker's jobs
    T=120 run python3 benchmarks/build_timeline.py --workload resnet_cycle --calls 60 --log --per-call \
      --json "$OUT/timeline_resnet_cycle.json" ;;
  settle)  # tuned rebuilds wait for the queue to settle: CUDA tests; the cold cycle's timeline; every workload
    DYNASHAPE_TEST_DEVICE=cuda T=200 run python3 -m pytest -q -p no:warnings -rfE tests/impls/test_conv_buckets.py \
      tests/impls/test_cache_and_context.py tests/test_disk_cache.py tests/ops/test_split_tf32.py
    T=120 run python3 benchmarks/build_timeline.py --workload resnet_cycle --calls 60 --log --per-call \
      --json "$OUT/timeline_resnet_cycle.json"
    T=400 run python3 benchmarks/new_shapes_gpu.py --sync-debug --models-dir $M --cache-dir /tmp/dcache \
      --second-process --json "$OUT/new_shapes_settle.json" ;;
  verify)  # the split's, the switches' and the context's CUDA tests, three times over the switches' (once flaky)
    DYNASHAPE_TEST_DEVICE=cuda T=150 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py \
      tests/impls/test_cache_and_context.py
    for r in 1 2; do
      DYNASHAPE_TEST_DEVICE=cuda T=60 run python3 -m pytest -q -p no:warnings -rfE tests/ops/test_split_tf32.py \
        -k "background_build_takes or one_run_inside"
    done ;;
esac
