#!/usr/bin/env bash
# In-step transfers of the probe's kind and of the run's bytes, and the training runs, on each
# link rate back to back (see scripts/instep_transfers.py); then their summary.
#   scripts/instep_transfers.sh OUT_DIR "30 60 120"
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [RATES]}
rates=${2:-30 60 120}
py=${PYTHON:-python}
mkdir -p "$out"
[ -f "$out/tokens/meta.json" ] || $py -m fp4quant.data prepare --out "$out/tokens"
runs=()
for rate in $rates; do
  $py -m fp4quant.cluster run --rate-mbit "$rate" --nodes 2 -- scripts/instep_transfers.py \
    --rate-mbit "$rate" --out "$out/transfers_$rate.csv"
  for comm in bf16 fp4quant; do
    run="$out/rate$rate/$comm"
    rm -rf "$run"
    $py -m fp4quant.cluster run --rate-mbit "$rate" --nodes 2 --nproc-per-node 1 --record "$run/cluster.json" -- \
      -m fp4quant.train --model tiny --tp 2 --comm "$comm" --steps 30 --seq-len 128 --batch-size 2 \
      --data "$out/tokens" --eval-batches 0 --checkpoint-every 1000000 --device cpu --out "$run"
    runs+=(--run "$rate:$comm:$run")
  done
done
$py scripts/instep_transfers.py summarize "$out"/transfers_*.csv "${runs[@]}" --out "$out/summary.csv"
