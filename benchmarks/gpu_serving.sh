#!/usr/bin/env bash
# Device call for the serving issue: BERT-base replicas, one per GPU (a LocalServer per process:
# Ray cannot travel to the device hosts), 1 vs 2 replicas, batching on vs off; results under $OUT.
#   bash benchmarks/gpu_serving.sh [smoke|bench]
source "$(dirname "$0")/gpu_common.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "${1:-bench}" in
  smoke)
    T=300 run python benchmarks/serving.py --backend local --device cuda --layers 2 --requests 64 --clients 8 \
      --configs 1:0,2:1 --json "$OUT/serving_smoke.json" ;;
  bench)
    T=580 run python benchmarks/serving.py --backend local --device cuda --layers 12 --requests 768 --clients 32 \
      --max-batch 16 --pad-multiple 32 --json "$OUT/serving_gpu.json" ;;
esac
