#!/usr/bin/env bash
# One step of the GPU run, sized for one 10-minute command on a GPU machine (bench/gpu/README.md).
#
#   bench/gpu/run.sh env | tests | tests-kernels[-e2e] | tests-marked | smoke | bench-<part> | all
#
# Every step first installs .whl/ (`make gpu-wheels`, beforehand) into /tmp/site, makes the
# checkout importable as `infernetes` (bench/gpu/importable.py) and writes $OUT/env.json (the GPU,
# the driver, torch, triton, and whether each of infernetes' runtime modules imports). Then:
#   env            nothing more
#   tests          tests-kernels, tests-kernels-e2e, then tests-marked
#   tests-kernels  tests/kernels on CUDA (every Triton kernel compiled and run, not interpreted),
#                  but for the end-to-end model tests (tests-kernels-e2e) and the CPU's C kernels
#   tests-marked   every other test marked gpu, outside tests/kernels
#   smoke          each model family and quantized format on CUDA gives the CPU's greedy tokens,
#                  dummy weights serve, and so does `infernetes serve` (SMOKE_TESTS)
#   smoke-mm       each vision-language model and Whisper on CUDA gives the CPU's greedy tokens
#                  (SMOKE_MM_TESTS)
#   bench-<part>   one part of `python -m bench gpu_llama8b` or `gpu_moe` (`all` lists them)
#   all            prints the commands of a whole run, one per lease call, in order
# Each step writes its JUnit XML or JSON report and its log under $OUT.
#
# Environment:
#   OUT        where reports go (the device machine sets it; default ./gpu-out)
#   PYTHON     the interpreter (default python3: on the GPU image, the one with torch)
#   DRY_RUN=1  on a machine without CUDA: pytest only collects, benchmarks run --smoke (tiny
#              shapes on the CPU), so import errors, missing wheels and wrong paths show up there
#   BENCH_ARGS extra arguments for a bench-<part> step (e.g. "--requests 128")
#   STEP_TIMEOUT seconds a step may run before it is interrupted (default 500), leaving its
#              report; a lease command is cut at 600, and installing and env.json take ~40
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/gpu-out}"
PYTHON="${PYTHON:-python3}"
DRY_RUN="${DRY_RUN:-0}"
STEP_TIMEOUT="${STEP_TIMEOUT:-500}"
site=/tmp/site
# The smoke step's tests (gpu-marked; the tests steps leave them to it).
SMOKE_TESTS=(tests/engine/test_engine_gpu_matches_cpu.py tests/server/test_server_gpu.py)
SMOKE_MM_TESTS=(tests/engine/test_engine_gpu_multimodal.py)
source_dir=/tmp/infernetes-src

# bench-<part>: the benchmark and its --parts (gpu_serve has none: its start-up and load).
declare -A BENCH=(
  [decode]="gpu_llama8b --parts decode"
  [throughput]="gpu_llama8b --parts throughput"
  [kernels]="gpu_llama8b --parts kernels"
  [fp8]="gpu_llama8b --parts fp8"
  [w4a16]="gpu_llama8b --parts w4a16"
  [profile]="gpu_llama8b --parts profile"
  [server]="gpu_serve"
  [moe-decode]="gpu_moe --parts decode"
  [moe-throughput]="gpu_moe --parts throughput"
  [moe-kernels]="gpu_moe --parts kernels"
  [moe-w4a16]="gpu_moe --parts w4a16"
)
# A whole run, in order: each step's command and the minutes expected on an H100 (estimates
# from the parts' sizes until a run measures them). The quantized parts measure bf16 beside
# themselves (four engine runs), so they take half the requests to fit a lease.
ORDER=(
  "smoke:6" "tests-kernels:8" "smoke-mm:5" "tests-kernels-e2e:6" "tests-marked:5"
  "bench-decode:4" "bench-throughput:7" "bench-kernels:2" "bench-server:8"
  "BENCH_ARGS='--requests 128' bench/gpu/run.sh bench-fp8:8"
  "BENCH_ARGS='--requests 128' bench/gpu/run.sh bench-w4a16:8"
  "bench-moe-decode:4" "bench-moe-throughput:7" "bench-moe-kernels:3"
  "BENCH_ARGS='--requests 128' bench/gpu/run.sh bench-moe-w4a16:8"
  "bench-profile:3"
)

usage() {
  echo "usage: bench/gpu/run.sh env|tests|tests-kernels[-e2e]|tests-marked|smoke|smoke-mm|bench-<part>|all" >&2
  echo "  parts: ${!BENCH[*]}" >&2
  exit 2
}

# The checkout's operator/ would shadow the standard library's operator module wherever the
# current folder is on sys.path (`python -m` from the root puts it first): never put it there.
export PYTHONSAFEPATH=1

install() {
  shopt -s nullglob
  local wheels=(.whl/*.whl)
  if ((${#wheels[@]} == 0)); then
    echo "run.sh: no wheels in .whl/: run 'make gpu-wheels' here and carry .whl" >&2
    exit 1
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${wheels[@]}"
  "$PYTHON" bench/gpu/importable.py "$source_dir"
  export PYTHONPATH="$source_dir:$site${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1
}

check_env() {
  mkdir -p "$OUT"
  "$PYTHON" bench/gpu/environment.py "$OUT/env.json" "$DRY_RUN"
}

# Runs "$@" for at most STEP_TIMEOUT seconds, its output also in $OUT/$1.log; SIGINT at the limit,
# so pytest still writes its report.
step() {
  local name="$1"
  shift
  set +e
  timeout -s INT -k 20 "$STEP_TIMEOUT" "$@" 2>&1 | tee "$OUT/$name.log"
  local status="${PIPESTATUS[0]}"
  set -e
  echo "run.sh: $name exited $status" | tee -a "$OUT/$name.log"
  return "$status"
}

run_pytest() {
  local name="$1"
  shift
  local collect=()
  [[ "$DRY_RUN" == 1 ]] && collect=(--collect-only -q)
  step "$name" "$PYTHON" -m pytest -p no:cacheprovider -rfEs --timeout 300 \
    --junitxml "$OUT/$name.xml" "${collect[@]}" "$@"
}

# The gpu-marked tests outside tests/kernels and the smoke file: only the files that carry the
# marker are collected, since the others import dev-only packages the image lacks.
run_marked() {
  local files
  mapfile -t files < <(grep -rlE "pytest\.mark\.gpu" tests --include "test_*.py" |
    grep -v -e "^tests/kernels/" $(printf -- "-e %s " "${SMOKE_TESTS[@]}" "${SMOKE_MM_TESTS[@]}") |
    sort)
  run_pytest tests-marked -m gpu "${files[@]}"
}

# tests/kernels in two steps that each fit a lease: the end-to-end model tests (e2e), and the
# kernels' own tests (the rest). The C kernels' tests (cpu_*) are the CPU's, run by CI.
run_kernels() {
  local which="$1" files
  if [[ "$which" == e2e ]]; then
    files=(tests/kernels/test_kernels_e2e_*.py)
  else
    mapfile -t files < <(find tests/kernels -name "test_kernels_*.py" \
      ! -name "test_kernels_e2e_*" ! -name "test_kernels_cpu_*" | sort)
  fi
  run_pytest "tests-kernels${which:+-$which}" "${files[@]}"
}

run_bench() {
  local part="$1"
  local spec="${BENCH[$part]:-}"
  [[ -n "$spec" ]] || usage
  local smoke=()
  [[ "$DRY_RUN" == 1 ]] && smoke=(--smoke)
  # shellcheck disable=SC2086  # spec and BENCH_ARGS are word lists
  step "bench-$part" "$PYTHON" -m bench $spec "${smoke[@]}" --json "$OUT/bench-$part.json" \
    ${BENCH_ARGS:-}
}

print_all() {
  local total=0 entry
  echo "# One lease call each, in this order (carry: [\".whl\"]); expected minutes on an H100:"
  for entry in "${ORDER[@]}"; do
    local command="${entry%%:*}"
    [[ "$command" == *run.sh* ]] || command="bench/gpu/run.sh $command"
    echo "$command    # ~${entry##*:} min"
    total=$((total + ${entry##*:}))
  done
  echo "# about $total minutes of commands in all, far more than one session's device time (15"
  echo "# minutes today, start included): start at the first step whose report is not yet in"
  echo "# bench/results/."
}

[[ $# -eq 1 ]] || usage
case "$1" in
  all)
    print_all
    exit 0
    ;;
  env | tests | tests-kernels | tests-kernels-e2e | tests-marked | smoke | smoke-mm | bench-*) ;;
  *) usage ;;
esac
install
check_env
case "$1" in
  env) ;;
  tests)
    status=0
    run_kernels "" || status=$?
    run_kernels e2e || status=$?
    run_marked || status=$?
    exit "$status"
    ;;
  tests-kernels) run_kernels "" ;;
  tests-kernels-e2e) run_kernels e2e ;;
  tests-marked) run_marked ;;
  smoke) run_pytest smoke "${SMOKE_TESTS[@]}" ;;
  smoke-mm) run_pytest smoke-mm "${SMOKE_MM_TESTS[@]}" ;;
  bench-*) run_bench "${1#bench-}" ;;
esac
