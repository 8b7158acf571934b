#!/usr/bin/env bash
# Run the GPU side of the project on a CUDA machine and collect the results under $OUT
# (default ./gpu_results): the cuda column of the test matrix, the autotune warm-up cold
# and warm, the bench with tuned configs and with the heuristic's first config, the demo.
#
#   bash scripts/gpu_session.sh tests     # the cuda column of the test matrix
#   bash scripts/gpu_session.sh perf      # warm-up cold/warm, bench x2, demo
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITONFUSE_CACHE_DIR=/tmp/tritonfuse_cache TRITONFUSE_AUTOTUNE_CACHE_DIR=/tmp/tritonfuse_autotune
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "(editable install failed: entry point test may fail)"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/machine.txt"

case "${1:-all}" in
tests|all)
    TRITONFUSE_TEST_DEVICES=cuda timeout 540 python3 -m pytest -q -p no:cacheprovider tests \
        -k "not warmup_script and not test_scripts" --junitxml="$OUT/cuda_tests.xml" 2>&1 | tail -40 | tee "$OUT/cuda_tests.txt"
    ;;&
perf|all)
    for run in cold warm; do
        start=$(python3 -c "import time; print(time.time())")
        timeout 240 python3 scripts/warmup_autotune.py --device cuda --export "$OUT/autotune_export.json" \
            2>&1 | tail -8 | tee "$OUT/warmup_$run.txt"
        echo "wall seconds: $(python3 -c "import time; print(round(time.time() - $start, 1))")" | tee -a "$OUT/warmup_$run.txt"
    done
    timeout 200 python3 scripts/bench.py --device cuda --out "$OUT/bench_tuned" 2>&1 | tail -5
    TRITONFUSE_AUTOTUNE=none TRITONFUSE_CACHE_DIR=/tmp/tritonfuse_cache_none timeout 150 python3 scripts/bench.py \
        --device cuda --backends eager,tritonfuse --out "$OUT/bench_heuristic" 2>&1 | tail -3
    cp "$OUT/bench_tuned/bench.md" "$OUT/bench_tuned.md"; cp "$OUT/bench_heuristic/bench.md" "$OUT/bench_heuristic.md"
    timeout 120 python3 scripts/demo.py --device cuda 2>&1 | tail -40 | tee "$OUT/demo.txt"
    ;;
esac
