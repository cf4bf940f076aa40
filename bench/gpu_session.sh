#!/usr/bin/env bash
# Every GPU bench row and every gpu-marked test in ONE call on a lent GPU machine (the device tool, with
# carry [".whl"] made by bench/gpu_wheels.sh), in the repo's root, in under 8 minutes (docs/development.md):
#   bash bench/gpu_session.sh                 # the session: bench rows, then tests; table + summary in $OUT
#   bash bench/gpu_session.sh --dry-run       # list each step, its command and its time budget; run nothing
#   bash bench/gpu_session.sh --cpu-smoke     # the same steps on the CPU at tiny sizes (BENCH_GPU_ON_CPU=1): a
#                                             # check of the script and the bench code, figures meaningless
#   bash bench/gpu_session.sh tests           # only the gpu-marked tests
#   bash bench/gpu_session.sh bench ROWS      # only bench/bench_gpu.py's ROWS (e.g. airbench,plain)
#   bash bench/gpu_session.sh profile         # kernels per step, nbscale against the hand loop (resnet, airbench,
#                                             # plain: bench/profile_steps.py), traces in $OUT; a second call
# Each step is killed at its budget (the budgets add up to TOTAL_BUDGET_S), so the call always ends in time and
# says which step ran out. $OUT gets: summary.md (GPU, torch, the table, the tests' summary, each step's time),
# bench_gpu.md (the table), bench_<step>.log (each bench's per-pair figures), gpu_tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/out}"
PY=${PY:-python3}
TOTAL_BUDGET_S=470  # of the 480 s (8 min) allowed; the device call's own limit is 600 s

# step name | budget in seconds | environment for bench/bench_gpu.py ("tests" runs pytest instead)
# bench first: a failing test may leave a GPU reserved, which would refuse the parallel row's pool
# Budgets from the H200 session of 2026-11-29 (bench/HISTORY.md), each with a little room: airbench+plain took
# 45 s for 3 + 2 of its 3 + 3 pairs (each call ~2.3 s after ~8 s of start); resnet+parallel 117 s; compile 71 s
# with 5 pairs (~5 s a pair: 3 pairs ~55 s); display ~4.7 s a 16-epoch call after ~10 s of kernel start (2 pairs
# and the warm-ups ~40 s); the gpu-marked tests 180 s (two batch-fitting tests ~54 s each).
STEPS=(
  "setup|12|"
  "airbench+plain|55|BENCH_GPU_ROWS=airbench,plain BENCH_GPU_REPEATS=3"
  "resnet+parallel|122|BENCH_GPU_ROWS=resnet,parallel BENCH_GPU_PARALLEL_EPOCHS=5,20 BENCH_GPU_REPEATS=3"
  "compile|50|BENCH_GPU_ROWS=compile BENCH_GPU_REPEATS=2"
  "display|43|BENCH_GPU_ROWS=display BENCH_GPU_DISPLAY_EPOCHS=16 BENCH_GPU_REPEATS=2"
  "tests|188|"
)


mode=session
case "${1:-}" in
  --dry-run) mode=dry ;;
  --cpu-smoke) mode=smoke ;;
  tests) STEPS=("setup|15|" "tests|540|") ;;
  bench) STEPS=("setup|15|" "bench|560|BENCH_GPU_ROWS=${2:-airbench,plain,compile,resnet,parallel,display}") ;;
  profile) STEPS=("setup|15|" "profile|400|") ;;
  "") ;;
  *) echo "usage: bash bench/gpu_session.sh [--dry-run | --cpu-smoke | tests | bench ROWS | profile]" >&2; exit 2 ;;
esac

total=0
for step in "${STEPS[@]}"; do total=$((total + $(cut -d'|' -f2 <<<"$step"))); done
if [[ $mode == session && ${1:-} == "" && $total -gt $TOTAL_BUDGET_S ]]; then
  echo "the steps' budgets add up to ${total} s, over ${TOTAL_BUDGET_S} s" >&2; exit 2
fi

test_files() {  # the files with gpu-marked tests (collecting all of tests/ would import packages the machine lacks)
  grep -rl --include="test_*.py" "mark.gpu" tests | sort
}

command_of() {  # the command a step runs, as one line
  local name=$1 env=$2 budget=$3
  case "$name" in
    setup) echo "pip install .whl/*.whl --target /tmp/site (when .whl exists); nvidia-smi; torch version" ;;
    profile) echo "timeout $((budget / 3)) $PY bench/profile_steps.py ROW, for resnet (traces in \$OUT), airbench, plain" ;;
    tests) echo "timeout ${budget} $PY -m pytest -m gpu -q -ra -p no:cacheprovider --timeout 100 $(test_files | tr '\n' ' ')" ;;
    *) echo "${env}${smoke_env:+ $smoke_env} timeout ${budget} $PY bench/bench_gpu.py" ;;
  esac
}

smoke_env=""
scale=1
if [[ $mode == smoke ]]; then  # tiny sizes, but CPUs (often shared) import, build and compile slowly
  smoke_env="BENCH_GPU_ON_CPU=1 BENCH_GPU_REPEATS=1"
  scale=${SMOKE_BUDGET_SCALE:-8}
fi

if [[ $mode == dry ]]; then
  echo "bench/gpu_session.sh: $((${#STEPS[@]})) steps, ${total} s of budgets in all (limit ${TOTAL_BUDGET_S} s):"
  for step in "${STEPS[@]}"; do
    IFS='|' read -r name budget env <<<"$step"
    printf '  %-18s %4s s  %s\n' "$name" "$budget" "$(command_of "$name" "$env" "$budget")"
  done
  exit 0
fi

mkdir -p "$OUT"
: > "$OUT/steps.txt"
status=0
for step in "${STEPS[@]}"; do
  IFS='|' read -r name budget env <<<"$step"
  budget=$((budget * scale))
  began=$SECONDS
  case "$name" in
    setup)
      if [[ -d .whl && $mode != smoke ]]; then
        timeout "$budget" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site .whl/*.whl || { echo "setup failed: the wheels did not install" >&2; exit 1; }
        export PYTHONPATH="/tmp/site:$PWD"
      else
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
      fi
      export NBSCALE_RUNTIME_DIR=/tmp/nbscale-run XDG_DATA_HOME=/tmp/nbscale-data XDG_CONFIG_HOME=/tmp/nbscale-config
      { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU (nvidia-smi)"
        "$PY" -c "import torch; print('torch', torch.__version__)"; } > "$OUT/gpu.txt"
      code=0
      ;;
    tests)
      if [[ $mode == smoke ]]; then  # collection only: every gpu test skips without CUDA
        timeout "$budget" "$PY" -m pytest -m gpu -q -ra -p no:cacheprovider --collect-only $(test_files) \
          > "$OUT/gpu_tests.log" 2>&1
      else
        timeout "$budget" "$PY" -m pytest -m gpu -q -ra -p no:cacheprovider --timeout 100 $(test_files) \
          > "$OUT/gpu_tests.log" 2>&1
      fi
      code=$?
      ;;
    profile)
      code=0
      : > "$OUT/profile.md"
      for row in resnet airbench plain; do  # the traces (gzipped) of the ResNet-50 row only: the 8 files $OUT returns
        trace_dir=""; [[ $row == resnet ]] && trace_dir="$OUT"
        PROFILE_TRACE_DIR="$trace_dir" timeout $((budget / 3)) "$PY" bench/profile_steps.py "$row" >> "$OUT/profile.md" \
          2>> "$OUT/profile.log" || code=$?
      done
      ;;
    *)
      env $env $smoke_env timeout "$budget" "$PY" bench/bench_gpu.py > "$OUT/bench_$name.md" 2> "$OUT/bench_$name.log"
      code=$?
      ;;
  esac
  took=$((SECONDS - began))
  case $code in
    0) verdict="ok" ;;
    124) verdict="ran out of its ${budget} s budget"; status=1 ;;
    *) verdict="exit status $code"; status=1 ;;
  esac
  echo "| $name | ${took} s | ${budget} s | $verdict |" | tee -a "$OUT/steps.txt"
done

# one table: the first bench's header, then every bench's rows
{
  shopt -s nullglob
  header_done=""
  for name in $(for step in "${STEPS[@]}"; do cut -d'|' -f1 <<<"$step"; done); do
    file="$OUT/bench_$name.md"
    [[ -f $file ]] || continue
    if [[ -z $header_done ]] && grep -q '^| run |' "$file"; then
      sed -n '/^## /,/^|---/p' "$file"
      header_done=1
    fi
    grep '^| ' "$file" | grep -v '^| run |' | grep -v '^|---'
  done
} > "$OUT/bench_gpu.md"

{
  echo "# GPU session ($(date -u '+%Y-%m-%d %H:%M UTC'), ${SECONDS} s in all)"
  echo
  sed 's/^/    /' "$OUT/gpu.txt"
  echo
  cat "$OUT/bench_gpu.md"
  echo
  echo "## gpu-marked tests"
  echo
  [[ -f $OUT/gpu_tests.log ]] && grep -E '^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|error|skipped|deselected)|tests? collected' "$OUT/gpu_tests.log" \
    | sed 's/^/    /'
  echo
  echo "| step | took | budget | result |"
  echo "|---|---:|---:|---|"
  cat "$OUT/steps.txt"
  # a bench step cut short prints no table: its pairs so far (stderr) and its last words
  grep -v '| ok |' "$OUT/steps.txt" | cut -d'|' -f2 | while read -r name; do
    [[ -f $OUT/bench_$name.log ]] || continue
    echo; echo "$name, the end of bench_$name.log:"; tail -n 6 "$OUT/bench_$name.log" | sed 's/^/    /'
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
exit $status
