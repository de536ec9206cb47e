#!/usr/bin/env bash
# The one-GPU acceptance run of fp4quant: one NVIDIA GPU (H100/H200), a CUDA build of torch
# and an nvcc of its CUDA major version (compute-sanitizer beside it), no network, in one
# command of at most 10 minutes, from a checkout that holds nothing but tracked files.
#
# ---- The device command (the project's one-shot GPU slot) -----------------------------------
#   command:    bash scripts/gpu_check.sh
#   timeout_s:  590        (the script's own budget is 520 s; the report and the packing follow)
#   kind:       left out (an H100; an H200 runs it the same way)
#   OUT:        set by the device tool; at most 8 files come back from it, written here:
#               gpu_check.tar.gz (every result), summary.txt, report.md, stages.tsv,
#               kernels_cuda.csv, pipeline_cuda.csv, projection.csv
# Nothing else is needed there: the extension is built in place with that machine's python3,
# PYTHONPATH is the repository root, no venv is created and nothing is downloaded.
# -----------------------------------------------------------------------------------------------
#
#   scripts/gpu_check.sh [--dry-run] [--budget S] [RESULTS_DIR]
#
# RESULTS_DIR (default ${TMPDIR:-/tmp}/fp4quant-gpu-check-<UTC time>, outside the repository):
# every stage's log and files.  Where OUT is set, an EXIT trap (also on SIGTERM and SIGINT: a
# run killed at its limit still returns what it had) packs RESULTS_DIR into OUT/gpu_check.tar.gz
# (no checkpoints, no token files) and copies the summary, the report and the main CSVs beside
# it; the archive is also refreshed after every stage, so that even a SIGKILL leaves the
# results of the stages that ended.
#
# Stages in order, each with its cap in seconds (they add up to the budget, GPU_CHECK_BUDGET,
# default 520).  A stage may end by its scheduled time: the sum of the caps up to it from the
# start, so that time an earlier stage left unused passes on, and a stage that hangs takes
# no time from the stages after it; never past the budget.
#   machine        15  nvidia-smi, nvcc, compute-sanitizer, torch, python modules -> provenance.json
#   build         145  the extension in place with its CUDA kernels: FP4QUANT_CUDA_ARCHS (default
#                      9.0: sm_90 and its PTX only), MAX_JOBS (default: all cores)
#   info           15  python -m fp4quant.info; fails unless the CUDA kernels are in use
#   tests_cuda     85  every `-m cuda` test: each kernel and preset bit for bit against the pure-
#                      PyTorch reference, fp32/bf16/fp16; the collective suite (at world size 1 on
#                      one GPU: no compressed message crosses a wire); the cubins -> junit_cuda.xml.
#                      A skipped CUDA test is a failure of this check.
#   sanitizer      65  compute-sanitizer memcheck (all kernels), racecheck and synccheck (fp4quant's
#                      kernels) around scripts/gpu_ops.py once: every op of every preset at small sizes
#   bench          40  kernel benchmark up to 256 MiB, float32 and bfloat16 inputs, one thread count,
#                      beside a device-to-device copy and torch's FP8 cast of the same tensor (and
#                      torchao's NVFP4 where it imports) -> kernels_cuda.csv
#   pipeline       25  one rank's codec stages of a two-shot all-reduce at W = 2, 4, 8, 8-256 MiB,
#                      float32 and bfloat16 (fp4quant.bench.pipeline) -> pipeline_cuda.csv
#   large          25  quantize / dequantize / dequantize_reduce of 2^31 + 2^20 values, checked
#                      against the reference on blocks either side of 2^31 -> large.json
#   projection     10  the performance model's H100 projection with the measured codec rates (bf16
#                      inputs), from the emulated cluster's committed runs under
#                      reference/figures-zen4/data/cpu/cluster -> projection.csv
#   data            5  the bundled corpus tokenized (GPU_CHECK_TOKENS, outside the repository)
#   train_tp1_bf16            30  tiny Qwen2 on CUDA with bf16 autocast, TP=1
#   train_tp2_gloo_fp4quant   35  TP=2 as two ranks on the one GPU over gloo (NCCL refuses two
#   train_tp2_gloo_bf16       25  ranks on one GPU), fp4quant and BF16 on the wire; gloo stages the
#                                 CUDA tensors through host memory: no NVLink, no NCCL
#   report         (after the budget, at most 30 s) scripts/gpu_report.py -> report.md, report.json
# A failed stage is recorded and the next runs; those that need the CUDA kernels are skipped
# (and count as failed) when `info` failed, the projection when the benchmark did.  Exit
# status 1 naming every failed stage in its last line; 128 + the signal when interrupted.
#
# --dry-run (a CPU machine; `make test` runs it on a clean copy of the tracked files): the
# stages that need no GPU run (machine, data, projection with the model's assumed codec rates,
# the report, the packing into OUT); the others are recorded "skipped (dry run)", not failed;
# exit 0 when every stage that ran passed.
#
# Environment: PYTHON (default .venv/bin/python if present, else python3), OUT, GPU_CHECK_BUDGET,
# GPU_CHECK_TOKENS, TRAIN_STEPS (100), FP4QUANT_CUDA_ARCHS (9.0), MAX_JOBS, PYTEST_WORKERS (8),
# BENCH_ARGS / PIPELINE_ARGS (extra words for the two benchmarks).
set -euo pipefail

DRY_RUN=0
RESULTS=
BUDGET=${GPU_CHECK_BUDGET:-520}
usage() { echo "usage: scripts/gpu_check.sh [--dry-run] [--budget SECONDS] [RESULTS_DIR]  (more: the comment at its top)"; }
while (($#)); do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --budget=*) BUDGET=${1#*=} ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [[ -z $RESULTS ]] || { echo "gpu_check.sh: one RESULTS_DIR only" >&2; exit 2; }; RESULTS=$1 ;;
  esac
  shift
done
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: the budget must be whole seconds, got '$BUDGET'" >&2; exit 2; }

# RESULTS_DIR and OUT as the caller names them (relative to where it stands), then the repository
RESULTS=${RESULTS:-${TMPDIR:-/tmp}/fp4quant-gpu-check-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
OUT=${OUT:-}
if [[ -n $OUT ]]; then mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd); fi
cd "$(dirname "$0")/.."
ROOT=$PWD
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
TOKENS=${GPU_CHECK_TOKENS:-${TMPDIR:-/tmp}/fp4quant-gpu-check-tokens}
TRAIN_STEPS=${TRAIN_STEPS:-100}
FP4QUANT_CUDA_ARCHS=${FP4QUANT_CUDA_ARCHS:-9.0}
CLUSTER=reference/figures-zen4/data/cpu/cluster  # the emulated cluster's committed calibration and runs
export ROOT RESULTS PYTHON TOKENS TRAIN_STEPS FP4QUANT_CUDA_ARCHS CLUSTER DRY_RUN BUDGET
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PYTHONDONTWRITEBYTECODE=1
SUMMARY=$RESULTS/summary.txt
STAGES=$RESULTS/stages.tsv
: >"$SUMMARY"
printf 'stage\tstatus\tseconds\tlimit_s\tcap_s\n' >"$STAGES"

# ---- the plan: stages in order with their caps (seconds); they add up to the default budget ----
PLAN=(machine:15 build:145 info:15 tests_cuda:85 sanitizer:65 bench:40 pipeline:25 large:25 projection:10
      data:5 train_tp1_bf16:30 train_tp2_gloo_fp4quant:35 train_tp2_gloo_bf16:25)
GPU_STAGES=(build info tests_cuda sanitizer bench pipeline large train_tp1_bf16 train_tp2_gloo_fp4quant
            train_tp2_gloo_bf16)
MIN_STAGE_S=5      # a stage with less time left than this is skipped, "the time budget is spent"
KILL_AFTER_S=5     # SIGKILL this long after a stage's SIGTERM at its limit
declare -A CAP END
T0=$SECONDS
total=0
for entry in "${PLAN[@]}"; do total=$((total + ${entry#*:})); done
elapsed=0
for entry in "${PLAN[@]}"; do
  name=${entry%:*}
  CAP[$name]=${entry#*:}
  elapsed=$((elapsed + CAP[$name]))
  # a budget above the caps' sum stretches the schedule; one below it cuts its end
  if ((BUDGET > total)); then END[$name]=$((T0 + elapsed * BUDGET / total)); else END[$name]=$((T0 + elapsed)); fi
done
DEADLINE=$((T0 + BUDGET))
FAILED=()
CHILD=
CURRENT=
CURRENT_T0=0
INTERRUPTED=
FINALIZED=0

log() { echo "$*" | tee -a "$SUMMARY"; }

record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${CAP[$1]:-0}" >>"$STAGES"; }

failed() {
  local name
  for name in "${FAILED[@]}"; do [[ $name == "$1" ]] && return 0; done
  return 1
}

is_gpu_stage() {
  local name
  for name in "${GPU_STAGES[@]}"; do [[ $name == "$1" ]] && return 0; done
  return 1
}

# skip NAME WHY: a stage that cannot run; a failure of this check (a dry run's GPU stages are not)
skip() {
  FAILED+=("$1")
  record "$1" skipped 0 0
  log "-- $1: SKIPPED, $2"
}

# pack RESULTS into OUT: the archive (written beside, then renamed) and the main files beside it
package() {
  [[ -n $OUT ]] || return 0
  local parent base tmp=$OUT/gpu_check.tar.gz.tmp f big
  parent=$(dirname "$RESULTS") base=$(basename "$RESULTS")
  local exclude=(--exclude=checkpoints --exclude='*.bin' --exclude='*.pt' --exclude='*.safetensors' --exclude='core*'
                 --exclude='*.tmp')
  tar -czf "$tmp" -C "$parent" "${exclude[@]}" "$base" 2>/dev/null || true
  if [[ ! -s $tmp || $(stat -c %s "$tmp") -gt $((15 << 20)) ]]; then
    # too big for the way back (16 MiB a file): every file under 1 MiB, and the list of those left out
    big=$RESULTS/left_out_of_archive.txt
    find "$RESULTS" -type f -size +1M -printf '%P\t%s bytes\n' >"$big" 2>/dev/null || true
    tar -czf "$tmp" -C "$parent" "${exclude[@]}" --exclude-from=<(cut -f1 "$big" | sed "s|^|$base/|") "$base" \
      2>/dev/null || true
  fi
  mv -f "$tmp" "$OUT/gpu_check.tar.gz" 2>/dev/null || true
  for f in summary.txt report.md stages.tsv kernels_cuda.csv pipeline_cuda.csv projection.csv; do
    if [[ -f $RESULTS/$f && $(stat -c %s "$RESULTS/$f") -lt $((16 << 20)) ]]; then cp -f "$RESULTS/$f" "$OUT/$f"; fi
  done
}

# step NAME COMMAND...: output to NAME.log, cut at the stage's scheduled end or at the budget
step() {
  local name=$1 rc=0 t0=$SECONDS limit end
  shift
  if ((DRY_RUN)) && is_gpu_stage "$name"; then
    record "$name" "skipped (dry run)" 0 0
    log "-- $name: skipped (dry run)"
    return 0
  fi
  end=${END[$name]}
  ((end <= DEADLINE - KILL_AFTER_S)) || end=$((DEADLINE - KILL_AFTER_S))
  limit=$((end - SECONDS))
  if ((limit < MIN_STAGE_S)); then
    skip "$name" "the time budget is spent"
    package
    return 0
  fi
  log "== $name (at most ${limit} s, cap ${CAP[$name]} s): $*"
  CURRENT=$name CURRENT_T0=$SECONDS
  STAGE_LIMIT=$limit timeout --kill-after="$KILL_AFTER_S" "$limit" "$@" >"$RESULTS/$name.log" 2>&1 &
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD='' CURRENT=''
  if ((rc == 0)); then
    record "$name" ok $((SECONDS - t0)) "$limit"
    log "-- $name: ok in $((SECONDS - t0)) s"
  else
    FAILED+=("$name")
    record "$name" "failed($rc)" $((SECONDS - t0)) "$limit"
    local why=
    ((rc == 124 || rc == 137)) && why=", timed out"
    log "-- $name: FAILED (exit $rc$why) in $((SECONDS - t0)) s; first errors and tail of $name.log:"
    { grep -m 5 -E 'Error|error:|Failed:|FAILED |ERROR SUMMARY: [1-9]' "$RESULTS/$name.log" || true; echo ...
      tail -n 15 "$RESULTS/$name.log"; } | sed 's/^/   | /' | tee -a "$SUMMARY"
  fi
  package
  return 0
}

# the EXIT trap (SIGTERM and SIGINT exit through it): stop the stage in flight, report, pack
finalize() {
  local rc=$? t0=$SECONDS
  set +e
  trap - EXIT
  # a second SIGTERM (a launcher's reminder) waits for the report and the packing: seconds
  trap 'INTERRUPTED=${INTERRUPTED:-TERM}' TERM
  ((FINALIZED)) && return
  FINALIZED=1
  if ((rc != 0)) && [[ -z $INTERRUPTED ]]; then log "gpu_check.sh: stopped by an error of its own (exit $rc)"; fi
  if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then
    kill -TERM "$CHILD" 2>/dev/null  # timeout passes it on to the stage's process group
    for _ in 1 2 3 4 5 6; do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$CHILD" 2>/dev/null
    FAILED+=("$CURRENT")
    record "$CURRENT" "interrupted" $((SECONDS - CURRENT_T0)) 0
    log "-- $CURRENT: INTERRUPTED after $((SECONDS - CURRENT_T0)) s (SIG${INTERRUPTED:-?})"
  fi
  [[ -n $INTERRUPTED ]] && log "gpu_check.sh: interrupted by SIG$INTERRUPTED after $((SECONDS - T0)) s"
  timeout --kill-after=5 30 "$PYTHON" scripts/gpu_report.py "$RESULTS" >"$RESULTS/report.log" 2>&1
  local report_rc=$?
  record report "$(if ((report_rc == 0)); then echo ok; else echo "failed($report_rc)"; fi)" $((SECONDS - t0)) 30
  if ((report_rc != 0)); then
    FAILED+=(report)
    log "-- report: FAILED (exit $report_rc):"
    tail -n 15 "$RESULTS/report.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
  fi
  echo >>"$SUMMARY"
  cat "$RESULTS/report.md" >>"$SUMMARY" 2>/dev/null
  echo
  cat "$RESULTS/report.md" 2>/dev/null
  echo
  if ((${#FAILED[@]})); then
    log "FAILED stages: ${FAILED[*]} (total $((SECONDS - T0)) s)"
    ((rc != 0)) || rc=1
  elif ((DRY_RUN)); then
    log "dry run: every stage that needs no GPU passed in $((SECONDS - T0)) s (the GPU stages were skipped)"
  else
    log "all stages passed in $((SECONDS - T0)) s"
  fi
  log "results: $RESULTS${OUT:+; packed into $OUT}"
  package
  exit "$rc"
}
trap finalize EXIT
trap 'INTERRUPTED=TERM; exit 143' TERM
trap 'INTERRUPTED=INT; exit 130' INT

# ---- the stages (each runs as `bash -c stage_NAME`, in the repository root) --------------------

stage_machine() {
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  if command -v nvcc >/dev/null; then nvcc --version; else echo "no nvcc on PATH"; fi
  for tool in compute-sanitizer cuobjdump ncu; do echo "$tool: $(command -v "$tool" || echo 'not on PATH')"; done
  "$PYTHON" - <<'EOF'
import importlib.util, os, platform, torch
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
modules = {m: importlib.util.find_spec(m) is not None
           for m in ("torchao", "xdist", "pytest_timeout", "hypothesis", "scipy", "transformers", "triton")}
print("python modules:", ", ".join(f"{m} {'yes' if ok else 'ABSENT'}" for m, ok in modules.items()))
atomic_write_json(os.path.join(os.environ["RESULTS"], "provenance.json"), provenance(
    "cuda" if gpu else None, script="scripts/gpu_check.sh", nvidia_smi=gpus.describe() if gpus else None,
    nvcc=[n.describe() for n in found], budget_s=int(os.environ["BUDGET"]), dry_run=os.environ["DRY_RUN"] == "1",
    cuda_archs=os.environ["FP4QUANT_CUDA_ARCHS"], python_modules=modules,
    gpu_name=torch.cuda.get_device_name(0) if gpu else None))
EOF
  nproc || true
  free -g || true
  df -h "${TMPDIR:-/tmp}" || true
}

stage_build() {
  echo "FP4QUANT_CUDA_ARCHS=$FP4QUANT_CUDA_ARCHS MAX_JOBS=${MAX_JOBS:-$(nproc)}"
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
    sys.exit('fp4quant: the CUDA kernels are not in use: ' + str(ops.extension()[2] or 'fp4quant._C has none'))
print('CUDA kernels in use')"
}

stage_tests_cuda() {
  local args=(-q -p no:cacheprovider) addopts="-ra --strict-markers"
  if "$PYTHON" -c "import xdist" 2>/dev/null; then args+=(-n "${PYTEST_WORKERS:-8}"); fi
  if ! "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then
    # without the plugin its marks are unknown: strict markers would refuse to collect them
    echo "pytest-timeout is not installed: its marks are not enforced (this stage's own limit is)"
    addopts="-ra"
  fi
  # the CUDA tests spend their time in the CPU reference: spread over processes where xdist is there
  "$PYTHON" -m pytest "${args[@]}" -o addopts="$addopts" -m cuda \
    tests/ops tests/comm/test_collectives.py tests/toolchain/test_cuda_build.py --junitxml="$RESULTS/junit_cuda.xml"
  # green means tested: a skipped CUDA test is a failure of this check
  "$PYTHON" -c "
import sys, xml.etree.ElementTree as ET
suite = ET.parse('$RESULTS/junit_cuda.xml').getroot().iter('testsuite').__next__()
ran, skipped = int(suite.get('tests')), int(suite.get('skipped'))
print(f'{ran} CUDA tests, {skipped} skipped')
sys.exit(f'fp4quant: {skipped} of {ran} CUDA tests were skipped' if skipped or not ran else 0)"
}

stage_sanitizer() {
  local cs tool rc=0 share each r t0 filter quick end=$((SECONDS + STAGE_LIMIT - 3)) shares=100
  cs=$(command -v compute-sanitizer || true)
  for home in "${CUDA_HOME:-}" /usr/local/cuda; do
    [[ -n $cs || -z $home || ! -x $home/bin/compute-sanitizer ]] || cs=$home/bin/compute-sanitizer
  done
  [[ -n $cs ]] || { echo "compute-sanitizer: not found (PATH, CUDA_HOME, /usr/local/cuda)"; return 1; }
  "$cs" --version | tail -n 2
  # the stage's time in shares of what is left (a tool that ends early leaves its time to the next):
  # memcheck runs every case, racecheck (the slowest per launch) and synccheck the --quick ones
  for share in memcheck:40 racecheck:40 synccheck:20; do
    tool=${share%:*} each=$(((end - SECONDS) * ${share#*:} / shares)) shares=$((shares - ${share#*:}))
    # memcheck: every kernel (the few of torch's are copies); the others: fp4quant's kernels only
    filter=() quick=()
    if [[ $tool != memcheck ]]; then filter=(--kernel-name kns=fp4q) quick=(--quick); fi
    r=0 t0=$SECONDS
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout --kill-after=3 "$each" "$cs" --tool "$tool" --error-exitcode 17 \
      --print-limit 20 --report-api-errors no --show-backtrace device ${filter[@]+"${filter[@]}"} \
      "$PYTHON" scripts/gpu_ops.py once ${quick[@]+"${quick[@]}"} >"$RESULTS/sanitizer_$tool.log" 2>&1 || r=$?
    echo "$tool: exit $r in $((SECONDS - t0)) s (at most $each s): $(grep -m 1 'ERROR SUMMARY' "$RESULTS/sanitizer_$tool.log" ||
      echo 'no ERROR SUMMARY line')"
    ((r == 0)) || { rc=1; tail -n 20 "$RESULTS/sanitizer_$tool.log"; }
  done
  return "$rc"
}

stage_bench() {
  # shellcheck disable=SC2086  # BENCH_ARGS: extra words for the benchmark, split on purpose
  "$PYTHON" -m fp4quant.bench.kernels --device cuda --threads 1 --dtypes float32,bfloat16 \
    --out "$RESULTS/kernels_cuda.csv" ${BENCH_ARGS:-}
}

stage_pipeline() {
  # shellcheck disable=SC2086  # PIPELINE_ARGS: extra words for the benchmark, split on purpose
  "$PYTHON" -m fp4quant.bench.pipeline --device cuda --worlds 2,4,8 --sizes 8M,16M,32M,64M,128M,256M \
    --dtypes float32,bfloat16 --out "$RESULTS/pipeline_cuda.csv" ${PIPELINE_ARGS:-}
}

stage_large() {
  "$PYTHON" scripts/gpu_ops.py large --device cuda --dtypes float32,bfloat16 --out "$RESULTS/large.json"
}

stage_projection() {
  local runs=() kernels=()
  mapfile -t runs < <(find "$CLUSTER/throughput" -name summary.json -exec dirname {} \; 2>/dev/null | sort)
  ((${#runs[@]})) || { echo "no training runs under $CLUSTER/throughput"; return 1; }
  if [[ -f $RESULTS/kernels_cuda.csv ]]; then
    # the performance model takes the bfloat16 rows where they were measured (what a TP
    # all-reduce carries), each dtype's GB/s at its own bytes a value
    kernels=(--gpu-kernels "$RESULTS/kernels_cuda.csv")
  else
    echo "no kernels_cuda.csv (dry run): the projection with the performance model's assumed H100 codec rates"
  fi
  "$PYTHON" -m fp4quant.perfmodel --calibration "$CLUSTER/calibration.json" --collectives "$CLUSTER/collectives.csv" \
    --runs "${runs[@]}" ${kernels[@]+"${kernels[@]}"} --out "$RESULTS/projection.csv"
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
  rm -rf "$RESULTS/$name/checkpoints"  # tens of MB each, and nothing this check reads
}

export -f stage_machine stage_build stage_info stage_tests_cuda stage_sanitizer stage_bench stage_pipeline \
  stage_large stage_projection stage_data stage_train

MODE=
((DRY_RUN)) && MODE=" (DRY RUN: the stages that need a GPU are skipped)"
COMMIT="no git (a copy of the working tree)"
if git rev-parse --short HEAD >/dev/null 2>&1; then
  COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (modified)')
fi
log "fp4quant GPU check$MODE: $COMMIT on $(hostname), $(date -u)"
log "python: $PYTHON; results: $RESULTS; OUT: ${OUT:-unset}; budget: $BUDGET s (caps: ${PLAN[*]})"

step machine bash -euo pipefail -c stage_machine
step build bash -euo pipefail -c stage_build
step info bash -euo pipefail -c stage_info
for stage in tests_cuda sanitizer bench pipeline large; do
  if ! ((DRY_RUN)) && failed info; then
    skip "$stage" "no CUDA kernels in use (stage info failed)"
  else
    step "$stage" bash -euo pipefail -c "stage_$stage"
  fi
done
if ! ((DRY_RUN)) && failed bench; then
  skip projection "no CUDA kernel benchmark (stage bench did not pass)"
else
  step projection bash -euo pipefail -c stage_projection
fi
step data bash -euo pipefail -c stage_data
if failed data; then
  for stage in train_tp1_bf16 train_tp2_gloo_fp4quant train_tp2_gloo_bf16; do skip "$stage" "no token data"; done
else
  step train_tp1_bf16 bash -euo pipefail -c "stage_train train_tp1_bf16 1 bf16"
  step train_tp2_gloo_fp4quant bash -euo pipefail -c "stage_train train_tp2_gloo_fp4quant 2 fp4quant gloo"
  step train_tp2_gloo_bf16 bash -euo pipefail -c "stage_train train_tp2_gloo_bf16 2 bf16 gloo"
fi
# finalize (the EXIT trap) writes the report, the verdict and the archive
