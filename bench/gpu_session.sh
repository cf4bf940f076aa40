#!/usr/bin/env bash
# On a lent GPU machine (the device tool), in the repo's root, with .whl carried (bench/gpu_wheels.sh made it):
#   bash bench/gpu_session.sh tests              # pytest -m gpu (~5 min)
#   bash bench/gpu_session.sh bench ROWS         # bench/bench_gpu.py, e.g. ROWS=airbench,plain,display
# Logs and the markdown table go to $OUT (they come back to the calling machine).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/out}"
export NBSCALE_RUNTIME_DIR=/tmp/nbscale-run XDG_DATA_HOME=/tmp/nbscale-data XDG_CONFIG_HOME=/tmp/nbscale-config
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
case "${1:-tests}" in
  tests)
    # the files with gpu-marked tests (collecting all of tests/ would import packages the machine lacks)
    timeout 540 python3 -m pytest -m gpu -q -ra -p no:cacheprovider --timeout 300 $(grep -rl --include="test_*.py" "mark.gpu" tests) 2>&1 | tee "$OUT/gpu_tests.log"
    ;;
  bench)
    BENCH_GPU_ROWS="${2:-airbench,plain,compile,resnet,parallel,display}" \
      timeout 560 python3 bench/bench_gpu.py 2> "$OUT/bench_gpu.log" | tee "$OUT/bench_gpu.md"
    ;;
esac
