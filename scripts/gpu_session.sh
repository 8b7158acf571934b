#!/usr/bin/env bash
# The GPU side of the project, in commands that each fit the device tool's 10 minutes.
# Results go under $OUT (default ./gpu_results).
#
#   bash scripts/gpu_session.sh tests     # cuda column, all test files in SHARDS (default 4) concurrent shards
#   bash scripts/gpu_session.sh tests-a   # cuda column, first half of the test files
#   bash scripts/gpu_session.sh tests-b   # cuda column, second half
#   bash scripts/gpu_session.sh models    # bench --suite models (eager, Inductor, tritonfuse)
#   bash scripts/gpu_session.sh dynamic   # bench --suite dynamic, inference and training
#   bash scripts/gpu_session.sh dynamic-together   # its training step, both backends timed in one process too
#   bash scripts/gpu_session.sh gemm      # GEMM rows, default and max-autotune, and the GEMM tests
#   bash scripts/gpu_session.sh perf      # autotune warm-up cold/warm, kernel bench, demo
#   bash scripts/gpu_session.sh ddp       # GPT-2 under DDP and FSDP2 on 2 GPUs (eager, Inductor, tritonfuse)
# On the device machine (no pip, no network) expecttest comes from .whl/pkgs (git-ignored:
# carry it along); the editable install gives the entry point its test.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/.whl/pkgs:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITONFUSE_CACHE_DIR=/tmp/tritonfuse_cache TRITONFUSE_AUTOTUNE_CACHE_DIR=/tmp/tritonfuse_autotune
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "(editable install failed: entry point test may fail)"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/machine.txt"

# test files sorted by name (test_fault_injection: CPU backends in subprocesses, CI runs it;
# on this machine each subprocess pays a CUDA-enabled torch import, and the file takes 15 minutes), split in two halves of about equal cuda time
mapfile -t files < <(ls tests/test_*.py | sort)
half=$(( ${#files[@]} / 2 ))
cuda_tests() {   # name, files...
    local name=$1; shift
    TRITONFUSE_TEST_DEVICES=cuda timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE --tb=line \
        -k "not warmup_script and not test_scripts" --ignore=tests/test_fault_injection.py --junitxml="$OUT/$name.xml" "$@" > "$OUT/$name.txt" 2>&1
    echo "rc=$?" >> "$OUT/$name.txt"
    grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$OUT/$name.txt" | tail -40
}

case "${1:-}" in
tests)   # shards side by side (SHARDS, default 4): Triton compiles are CPU-bound and the box has 16 cores
    shards=${SHARDS:-4}
    for (( shard = 0; shard < shards; shard++ )); do
        cuda_tests "cuda_tests_$shard" $(for i in "${!files[@]}"; do (( i % shards == shard )) && echo "${files[$i]}"; done) &
    done
    wait ;;
tests-a) cuda_tests cuda_tests_a "${files[@]:0:$half}" ;;
tests-b) cuda_tests cuda_tests_b "${files[@]:$half}" ;;
models)
    timeout 570 python3 scripts/bench.py --suite models --device cuda --time-limit 540 --out "$OUT/models" 2>&1 | tail -30 ;;
dynamic)
    timeout 570 python3 scripts/bench.py --suite dynamic --device cuda --time-limit 540 --out "$OUT/dynamic" 2>&1 | tail -30 ;;
dynamic-together)   # issue 17's training step, Dynamo's default, each length timed with both backends in one process
    timeout 570 python3 scripts/bench.py --suite dynamic --device cuda --dynamic auto --modes train --together \
        --time-limit 540 --out "$OUT/dynamic_together" 2>&1 | tail -30 ;;
gemm)
    TRITONFUSE_TEST_DEVICES=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE --tb=line \
        tests/test_gemm_template.py tests/test_cudagraphs.py tests/test_memory_planning.py > "$OUT/gemm_tests.txt" 2>&1
    tail -5 "$OUT/gemm_tests.txt"
    timeout 360 python3 scripts/bench.py --suite kernels --device cuda --workloads mm_ \
        --backends eager,inductor,inductor-max-autotune,tritonfuse,tritonfuse-max-autotune --out "$OUT/gemm_bench" 2>&1 | tail -12 ;;
perf)
    for run in cold warm; do
        start=$(python3 -c "import time; print(time.time())")
        timeout 240 python3 scripts/warmup_autotune.py --device cuda --export "$OUT/autotune_export.json" \
            2>&1 | tail -8 | tee "$OUT/warmup_$run.txt"
        echo "wall seconds: $(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/warmup_$run.txt"
    done
    timeout 200 python3 scripts/bench.py --device cuda --out "$OUT/bench_tuned" 2>&1 | tail -5
    timeout 100 python3 scripts/demo.py --device cuda 2>&1 | tail -40 | tee "$OUT/demo.txt" ;;
ddp)     # needs 2 GPUs (nvidia-h100-x2); the run keeps within 470 s (--time-limit)
    timeout 580 python3 scripts/bench_ddp.py --device cuda --out "$OUT/ddp" 2>&1 | tail -40 ;;
*) sed -n 2,13p "$0"; exit 2 ;;
esac
