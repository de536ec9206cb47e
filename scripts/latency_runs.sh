#!/usr/bin/env bash
# The trainer's communication at two batch sizes on one emulated link, alternated: what the
# step model's latency runs rest on (fp4quant.perfmodel.model_validation's LatencyRun: the trainer
# with fewer tokens a step than the runs it helps predict).  Per alternation, rate, comm and
# batch size, a 30-step run under `python -m fp4quant.cluster run`; then their summary.
#   scripts/latency_runs.sh OUT_DIR "120 60" ["1 2"] [ALTERNATIONS]
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [RATES] [BATCH_SIZES] [ALTERNATIONS]}
rates=${2:-120 60}
batches=${3:-1 2}
alternations=${4:-2}
py=${PYTHON:-python}
mkdir -p "$out"
[ -f "$out/tokens/meta.json" ] || $py -m fp4quant.data prepare --out "$out/tokens" --tokenizer bytes
for alt in $(seq 1 "$alternations"); do
  for rate in $rates; do
    for comm in fp4quant bf16; do
      for batch in $batches; do
        run="$out/a$alt/rate$rate/$comm/b$batch"
        rm -rf "$run" && mkdir -p "$(dirname "$run")"
        $py -m fp4quant.cluster run --rate-mbit "$rate" --nodes 2 --nproc-per-node 1 --record "$run/cluster.json" -- \
          -m fp4quant.train --model tiny --tp 2 --comm "$comm" --steps 30 --seq-len 128 --batch-size "$batch" \
          --data "$out/tokens" --eval-batches 0 --checkpoint-every 1000000 --device cpu --out "$run" > "$run.log" 2>&1
      done
    done
  done
done
$py scripts/latency_runs.py "$out" --out "$out/summary.csv"
