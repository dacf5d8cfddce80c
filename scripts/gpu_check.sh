#!/usr/bin/env bash
# The GPU check: one command for a GPU machine with no network, from the checkout, installing
# nothing (PYTHONPATH=src), within 8 minutes. docs/gpu_backend.md, "The GPU check".
#
#   bash scripts/gpu_check.sh OUT_DIR            # on the GPU machine ($OUT there)
#   bash scripts/gpu_check.sh --dry-run OUT_DIR  # every step on the CPU, tiny sizes, Triton's
#                                                # interpreter (tests/test_gpu_check.py runs it)
#
# Steps, most valuable first, each written to OUT_DIR as soon as it ends (a timeout keeps what
# came before), each under its own time budget:
#   1. versions.txt   device, driver, torch, CUDA, Triton, Numba, Python
#   2. tests.txt      the GPU tests, per-test timeouts (pytest-timeout, carried as a wheel in
#                     scripts/wheels): the engine on the device first, then the kernel sweeps
#   3. bench/         embcore bench --device cuda: W1-gpu, W2-gpu, W3-gpu against plain PyTorch,
#                     Adagrad and RowwiseAdagrad (results.md, results.json)
#   summary.md: one line per step as it ends; log.txt: everything printed. 6 files in all,
#   each cut to 15 MiB at the end.
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET_S (default 450).
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
if [ $# -ne 1 ]; then
  echo "usage: bash scripts/gpu_check.sh [--dry-run] OUT_DIR" >&2
  exit 2
fi
out=$1
mkdir -p "$out/bench"
py=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET_S:-450}
start=$(date +%s)
wheel="$PWD/scripts/wheels/pytest_timeout-2.4.0-py3-none-any.whl"
export PYTHONPATH="$PWD/src:$wheel${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# one set of pytest plugins on every machine: the carried pytest-timeout, nothing auto-loaded
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
log="$out/log.txt"
summary="$out/summary.md"
: >"$log"

if [ $dry = 1 ]; then
  export EMBCORE_TEST_DEVICE=cpu TRITON_INTERPRET=1
  device_args=(--gpu-mode --device cpu --quick)
  per_test=300
else
  device_args=(--device cuda)
  per_test=120
fi

left() { echo $((budget - ($(date +%s) - start))); }
note() { echo "$*" | tee -a "$summary" "$log"; }
# run NAME SECONDS CMD...: the command under `timeout`, its output into log.txt, its status noted
run() {
  local name=$1 seconds=$2 status
  shift 2
  if [ "$seconds" -lt 10 ]; then
    note "- $name: not run (the time budget was spent)"
    return
  fi
  echo "== $name (at most ${seconds}s): $*" >>"$log"
  timeout -k 10 "$seconds" "$@" >>"$log" 2>&1
  status=$?
  case $status in
    0) note "- $name: ok ($(($(date +%s) - start))s in)" ;;
    124 | 137) note "- $name: TIMED OUT after ${seconds}s" ;;
    *) note "- $name: exit $status" ;;
  esac
}

{
  echo "# GPU check $(date -u +%Y-%m-%dT%H:%MZ)$([ $dry = 1 ] && echo ' (dry run on the CPU)')"
  echo
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
} >"$summary"

# 1. versions ----------------------------------------------------------------------------
{
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  else
    echo "nvidia-smi: not found"
  fi
  "$py" - <<'PY'
import platform, torch
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs",
          round(p.total_memory / 2**30, 1), "GiB")
for name in ("triton", "numba", "numpy", "pytest", "pytest_timeout"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "imported"))
    except Exception as exc:  # a missing optional package is a fact to record, not a failure
        print(name, "not importable:", type(exc).__name__, exc)
PY
} >"$out/versions.txt" 2>&1
cat "$out/versions.txt" >>"$log"
note "- versions: $(tr '\n' ';' <"$out/versions.txt" | cut -c1-300)"

# 2. the GPU tests -------------------------------------------------------------------------
pytest_args=(-p pytest_timeout --timeout="$per_test" -q -rfE -p no:cacheprovider
  -W "ignore::DeprecationWarning" -W "ignore::FutureWarning")
tests="$out/tests.txt"
: >"$tests"
pytest_group() {  # NAME SECONDS ARGS...: one pytest run, its summary line into tests.txt
  local name=$1 seconds=$2
  shift 2
  local before
  before=$(wc -l <"$log")
  run "tests: $name" "$seconds" "$py" -m pytest "${pytest_args[@]}" "$@"
  {
    echo "## $name"
    tail -n +"$((before + 1))" "$log" | grep -v -E "^(==|- tests)" |
      grep -E "^(FAILED|ERROR)|passed|failed|error|collected|no tests ran|Timeout" | tail -40
    echo
  } >>"$tests"
}
pytest_group "engine on the device" "$(($(left) * 2 / 5))" -m gpu tests/engine/test_engine_on_device.py
if [ $dry = 1 ]; then  # the kernel sweeps need CUDA: collected only, so they cannot rot
  pytest_group "kernel sweeps (collected only)" "$(($(left) / 4))" --collect-only -m gpu \
    tests/ops/test_triton_gpu.py tests/ops/test_changing_ids.py
else
  pytest_group "kernel sweeps" "$(($(left) / 2))" -m gpu tests/ops/test_triton_gpu.py \
    tests/ops/test_changing_ids.py
fi

# 3. the benchmark -------------------------------------------------------------------------
run "bench: embcore bench ${device_args[*]}" "$(($(left) - 5))" \
  "$py" -m embcore.cli.main bench "${device_args[@]}" --out "$out/bench"
if [ -f "$out/bench/results.md" ]; then
  note "- bench tables: bench/results.md"
fi

for f in "$out"/*.* "$out"/bench/*; do  # the device tool takes files of at most 16 MiB
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15728640 ] && truncate -s 15M "$f"
done
note "- done in $(($(date +%s) - start))s"
