#!/usr/bin/env bash
# The GPU check of fp4quant, for a machine with an NVIDIA GPU, a CUDA build of torch and
# no network: build the CUDA extension in place, run the CUDA and CPU op tests, benchmark
# the kernels.  About 8 minutes at most (GPU_CHECK_BUDGET seconds, default 470).
#
#   scripts/gpu_check.sh [RESULTS_DIR]        (default data/gpu/<UTC date and time>)
#
# RESULTS_DIR gets one log per step, summary.txt, junit_*.xml, kernels_cuda.csv and the
# build info.  A failed step is recorded and the next one runs; the exit status is 1 if any
# step failed.  PYTHON overrides the interpreter (default /opt/torch/.venv/bin/python3 if
# present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS=${1:-data/gpu/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x /opt/torch/.venv/bin/python3 ]]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET:-470}))
SUMMARY=$RESULTS/summary.txt
FAILED=()
: >"$SUMMARY"

log() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME MAX_SECONDS COMMAND...: output to NAME.log, cut at MAX_SECONDS or the deadline.
step() {
  local name=$1 limit=$2 rc=0 t0=$SECONDS
  shift 2
  local left=$((DEADLINE - SECONDS))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    log "-- $name: SKIPPED, the time budget is spent"
    FAILED+=("$name")
    return 0
  fi
  log "== $name (at most ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    log "-- $name: ok in $((SECONDS - t0)) s"
  else
    FAILED+=("$name")
    log "-- $name: FAILED (exit $rc$( ((rc == 124)) && echo ', timed out')) in $((SECONDS - t0)) s; tail of $name.log:"
    tail -n 25 "$RESULTS/$name.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
  fi
}

log "fp4quant GPU check: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')$(git diff --quiet 2>/dev/null || echo ' (modified)') on $(hostname), $(date -u)"
log "python: $PYTHON; results: $RESULTS"

step machine 60 bash -c "nvidia-smi; nvidia-smi -q | head -n 120; nvcc --version; \
  '$PYTHON' -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name())'"
cp "$RESULTS/machine.log" "$RESULTS/nvidia-smi.txt" 2>/dev/null || true

# In-place build against the installed torch; no pip, no network.
step build 360 env FP4QUANT_CUDA_ARCHS="${FP4QUANT_CUDA_ARCHS:-90}" MAX_JOBS="${MAX_JOBS:-16}" \
  "$PYTHON" setup.py build_ext --inplace
cp fp4quant/_build_info.json "$RESULTS/build_info.json" 2>/dev/null || true
step extension 60 "$PYTHON" -c "
from fp4quant import ops
reason = ops._native.unavailable_reason
assert ops.backend('cuda') == 'native', f'no native CUDA kernels: {reason or \"built without CUDA (nvcc or CUDA_HOME not found?)\"}'
print('native CUDA kernels loaded; CPU kernels:', ops._native.module.cpu_isa())"

if [[ -f fp4quant/info.py ]]; then
  step info 60 "$PYTHON" -m fp4quant.info
  sed 's/^/   | /' "$RESULTS/info.log" | tee -a "$SUMMARY"
else
  log "-- info: skipped (no fp4quant/info.py)"
fi

PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -o addopts=-ra)
# the CUDA tests spend their time in the CPU reference: spread them over processes if xdist is there
XDIST=()
"$PYTHON" -c "import xdist" 2>/dev/null && XDIST=(-n "${PYTEST_WORKERS:-8}")
step tests_cuda 240 "${PYTEST[@]}" "${XDIST[@]}" -m cuda tests/ops --junitxml="$RESULTS/junit_cuda.xml"
# CPU op tests (the emulator and nvcc-compile tests are for machines without a GPU)
step tests_cpu 150 "${PYTEST[@]}" -m "not cuda" -k "not emulator and not compiles" tests/ops \
  --junitxml="$RESULTS/junit_cpu.xml"

if [[ -f fp4quant/bench/kernels.py ]]; then
  step bench 200 "$PYTHON" -m fp4quant.bench.kernels --device cuda --out "$RESULTS/kernels_cuda.csv" ${BENCH_ARGS:-}
else
  log "-- bench: skipped (no fp4quant/bench/kernels.py: the kernel benchmark is not in this checkout)"
fi

if ((${#FAILED[@]})); then
  log "FAILED steps: ${FAILED[*]}"
  exit 1
fi
log "all steps passed"
