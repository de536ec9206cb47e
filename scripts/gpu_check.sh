#!/usr/bin/env bash
# The one-GPU acceptance run of fp4quant: on one NVIDIA GPU (H100/H200) with a CUDA build of
# torch and an nvcc of its CUDA major version, no network needed, within 8 minutes.
#
#   scripts/gpu_check.sh [RESULTS_DIR]        (default data/gpu/<UTC date>_<time>)
#
# Stages (each logged to RESULTS_DIR/<stage>.log, each cut at its own time limit and at the
# overall budget, GPU_CHECK_BUDGET seconds, default 450):
#   machine       nvidia-smi, nvcc, torch, CPU -> machine.log, provenance.json
#   build         the extension in place with its CUDA kernels (setup.py: FP4QUANT_CUDA_ARCHS, MAX_JOBS)
#   info          python -m fp4quant.info; fails unless the CUDA kernels are in use
#   tests_cuda    the CUDA op tests (bit for bit against the pure-PyTorch reference), the NCCL
#                 collective suite, cubins and PTX of the library (cuobjdump) -> junit_cuda.xml
#   bench         kernel benchmark, torch.clone of the same bytes beside each size -> kernels_cuda.csv
#   projection    the performance model's H100 projection with the measured codec rates
#                 (from the committed CPU runs in data/cpu/cluster) -> projection_gpu.csv
#   train_*       tiny Qwen2 on CUDA tensors with bf16 autocast: TP=1; TP=2 as two ranks on the
#                 one GPU over gloo (NCCL refuses two ranks on one GPU), BF16 and fp4quant on the wire.
#                 gloo carries every collective fp4quant uses on CUDA tensors (all_reduce,
#                 all_to_all_single, all_gather_into_tensor, reduce_scatter_tensor, barrier:
#                 torch's ProcessGroupGloo stages CUDA tensors through pinned host memory)
#   report        scripts/gpu_report.py -> report.md, report.json (fractions of copy bandwidth,
#                 warp vs naive packing, training, projection)
# A failed stage is recorded and the next runs (the kernel benchmark and the projection only
# with the CUDA kernels in use); stages.tsv and summary.txt list every stage; exit status 1 if
# any failed.  PYTHON: the interpreter (default .venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS=${1:-data/gpu/$(date -u +%Y-%m-%d_%H%M%S)}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
TOKENS=${GPU_CHECK_TOKENS:-${TMPDIR:-/tmp}/fp4quant-gpu-check-tokens}
TRAIN_STEPS=${TRAIN_STEPS:-100}
export ROOT RESULTS PYTHON TOKENS TRAIN_STEPS
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET:-450}))
SUMMARY=$RESULTS/summary.txt
STAGES=$RESULTS/stages.tsv
FAILED=()
: >"$SUMMARY"
printf 'stage\tstatus\tseconds\tlimit_s\n' >"$STAGES"

log() { echo "$*" | tee -a "$SUMMARY"; }

record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STAGES"; }

failed() {
  local name
  for name in "${FAILED[@]}"; do [[ $name == "$1" ]] && return 0; done
  return 1
}

skip() {
  FAILED+=("$1")
  record "$1" skipped 0 0
  log "-- $1: SKIPPED, $2"
}

# step NAME MAX_SECONDS COMMAND...: output to NAME.log, cut at MAX_SECONDS or at the deadline.
step() {
  local name=$1 limit=$2 rc=0 t0=$SECONDS left
  shift 2
  left=$((DEADLINE - SECONDS))
  if ((limit > left)); then limit=$left; fi
  if ((limit < 10)); then
    skip "$name" "the time budget is spent"
    return 0
  fi
  log "== $name (at most ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    record "$name" ok $((SECONDS - t0)) "$limit"
    log "-- $name: ok in $((SECONDS - t0)) s"
  else
    FAILED+=("$name")
    record "$name" "failed($rc)" $((SECONDS - t0)) "$limit"
    log "-- $name: FAILED (exit $rc$(if ((rc == 124)); then echo ', timed out'; fi)) in $((SECONDS - t0)) s; first errors and tail of $name.log:"
    { grep -m 5 -E 'Error|error:|Failed:|FAILED ' "$RESULTS/$name.log" || true; echo ...; tail -n 15 "$RESULTS/$name.log"; } |
      sed 's/^/   | /' | tee -a "$SUMMARY"
  fi
  return 0
}

stage_machine() {
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  nvidia-smi -q | head -n 60 || true
  if command -v nvcc >/dev/null; then nvcc --version; else echo "no nvcc on PATH"; fi
  "$PYTHON" - <<'EOF'
import os, platform, torch
from fp4quant import toolchain
from fp4quant.provenance import atomic_write_json, provenance
gpu = torch.cuda.is_available()
print("python", platform.python_version(), "torch", torch.__version__, "CUDA", torch.version.cuda, "GPU usable:", gpu)
if gpu:
    p = torch.cuda.get_device_properties(0)
    print(f"{p.name}: {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}")
gpus = toolchain.nvidia_gpus()
print("nvidia-smi:", gpus.describe() if gpus else "no GPU listed")
found = toolchain.nvcc_candidates([])
print("nvcc:", "; ".join(n.describe() for n in found) or "none")
atomic_write_json(os.path.join(os.environ["RESULTS"], "provenance.json"), provenance(
    "cuda" if gpu else None, script="scripts/gpu_check.sh", nvidia_smi=gpus.describe() if gpus else None,
    nvcc=[n.describe() for n in found], budget_s=int(os.environ.get("GPU_CHECK_BUDGET", 450)),
    gpu_name=torch.cuda.get_device_name(0) if gpu else None))
EOF
  lscpu | head -n 20 || true
  free -g || true
}

stage_build() {
  MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PYTHON" setup.py build_ext --inplace
  cp fp4quant/_build_info.json "$RESULTS/build_info.json"
}

stage_info() {
  "$PYTHON" -m fp4quant.info
  "$PYTHON" -m fp4quant.info --json >"$RESULTS/info.json"
  "$PYTHON" -c "
import sys
from fp4quant import ops
if ops.backend('cuda') != 'native':
    sys.exit('fp4quant: the CUDA kernels are not in use: ' + str(ops._native.unavailable_reason or 'fp4quant._C has none'))
print('CUDA kernels in use')"
}

stage_tests_cuda() {
  local xdist=()
  if "$PYTHON" -c "import xdist" 2>/dev/null; then xdist=(-n "${PYTEST_WORKERS:-8}"); fi
  # the CUDA tests spend their time in the CPU reference: spread over processes where xdist is there
  "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="-ra --strict-markers" "${xdist[@]}" -m cuda \
    tests/ops tests/comm/test_collectives.py tests/toolchain/test_cuda_build.py --junitxml="$RESULTS/junit_cuda.xml"
  # green means tested: a skipped CUDA test is a failure of this check
  "$PYTHON" -c "
import sys, xml.etree.ElementTree as ET
suite = ET.parse('$RESULTS/junit_cuda.xml').getroot().iter('testsuite').__next__()
ran, skipped = int(suite.get('tests')), int(suite.get('skipped'))
print(f'{ran} CUDA tests, {skipped} skipped')
sys.exit(f'fp4quant: {skipped} of {ran} CUDA tests were skipped' if skipped or not ran else 0)"
}

stage_bench() {
  # shellcheck disable=SC2086  # BENCH_ARGS: extra words for the benchmark, split on purpose
  "$PYTHON" -m fp4quant.bench.kernels --device cuda --out "$RESULTS/kernels_cuda.csv" ${BENCH_ARGS:-}
}

stage_projection() {
  local runs=()
  mapfile -t runs < <(find data/cpu/cluster/runs -name summary.json -exec dirname {} \; | sort)
  ((${#runs[@]})) || { echo "no training runs under data/cpu/cluster/runs"; return 1; }
  "$PYTHON" -m fp4quant.perfmodel --calibration data/cpu/cluster/calibration.json \
    --collectives data/cpu/cluster/collectives.csv --runs "${runs[@]}" \
    --gpu-kernels "$RESULTS/kernels_cuda.csv" --out "$RESULTS/projection_gpu.csv"
}

stage_data() {
  if [[ -f $TOKENS/meta.json ]]; then echo "reusing $TOKENS"; return 0; fi
  "$PYTHON" -m fp4quant.data prepare --out "$TOKENS"
}

# stage_train NAME TP COMM [BACKEND]: tiny Qwen2 on CUDA (bf16 autocast), TP ranks on this machine
stage_train() {
  local name=$1 tp=$2 comm=$3 backend=${4:-auto}
  "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$tp" -m fp4quant.train --model tiny \
    --tp "$tp" --comm "$comm" --backend "$backend" --device cuda --steps "$TRAIN_STEPS" --seq-len 256 \
    --batch-size 4 --checkpoint-every 100000 --data "$TOKENS" --out "$RESULTS/$name"
}

export -f stage_machine stage_build stage_info stage_tests_cuda stage_bench stage_projection stage_data stage_train

log "fp4quant GPU check: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')$(git diff --quiet 2>/dev/null || echo ' (modified)') on $(hostname), $(date -u)"
log "python: $PYTHON; results: $RESULTS; budget: ${GPU_CHECK_BUDGET:-450} s"

step machine 60 bash -c stage_machine
step build 240 bash -c stage_build
step info 60 bash -c stage_info
step tests_cuda 180 bash -c stage_tests_cuda
if failed info; then
  skip bench "no CUDA kernels in use (stage info failed)"
  skip projection "no CUDA kernel benchmark"
else
  step bench 150 bash -c stage_bench
  if failed bench; then skip projection "no CUDA kernel benchmark"; else step projection 60 bash -c stage_projection; fi
fi
step data 60 bash -c stage_data
if failed data; then
  skip train_tp1_bf16 "no token data"
  skip train_tp2_gloo_bf16 "no token data"
  skip train_tp2_gloo_fp4quant "no token data"
else
  step train_tp1_bf16 90 bash -c "stage_train train_tp1_bf16 1 bf16"
  step train_tp2_gloo_bf16 90 bash -c "stage_train train_tp2_gloo_bf16 2 bf16 gloo"
  step train_tp2_gloo_fp4quant 90 bash -c "stage_train train_tp2_gloo_fp4quant 2 fp4quant gloo"
fi
# the report runs past the budget if need be: it reads files and takes seconds
DEADLINE=$((SECONDS + 30))
step report 30 "$PYTHON" scripts/gpu_report.py "$RESULTS"
cat "$RESULTS/report.md" >>"$SUMMARY" 2>/dev/null || true

if ((${#FAILED[@]})); then
  log "FAILED stages: ${FAILED[*]} (total $SECONDS s)"
  exit 1
fi
log "all stages passed in $SECONDS s"
