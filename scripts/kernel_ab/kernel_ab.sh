#!/usr/bin/env bash
# The CPU quantize (or dequantize, dequantize_reduce) of two commits side by side in one process (kernel_ab.cpp):
# each commit's csrc/ compiled with the extension's flags, then, per preset and size,
# alternating calls (one thread unless THREADS) on the same input; B's output must equal A's.
#
#   [ISA=avx512|avx2] [OPS="quantize dequantize dequantize_reduce"] [ROUNDING=stochastic] [THREADS=2] scripts/kernel_ab/kernel_ab.sh
#       REV_A REV_B [OUT.csv|-] [SIZES_MIB] [PRESETS]
#   (REV_B may be "worktree"; defaults: avx512, quantize, nearest, - (standard output), "1 64",
#   "fp4quant no_fwht nvfp4"; stochastic: the trainer's backward config, micro-scales rounded up;
#   THREADS: the spans split over that many threads, as the extension splits them; default 1)
#
# Columns: op, preset, rounding, MiB, calls of each, A's median and fastest GB/s (of float32 values in
# or out; dequantize_reduce: summed), B's, and B's speedup (A's time over B's: median, fastest).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,15p "$0"; exit 2; }
isa=${ISA:-avx512}
case $isa in avx512|avx2) ;; *) echo "kernel_ab: ISA must be avx512 or avx2, got $isa" >&2; exit 2 ;; esac
root=$(git rev-parse --show-toplevel)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${3:--}
sizes=${4:-1 64}
presets=${5:-fp4quant no_fwht nvfp4}
ops=${OPS:-quantize}
rounding=${ROUNDING:-nearest}
flags="-O3 -std=c++17 -ffp-contract=off -fno-fast-math -w"  # setup.py's, for the kernels
for side in a b; do
  rev=$([ $side = a ] && echo "$1" || echo "$2")
  mkdir -p "$work/$side"
  if [ "$rev" = worktree ]; then cp -r "$root/csrc" "$work/$side/"; else git -C "$root" archive "$rev" csrc | tar -x -C "$work/$side"; fi
  printf '#define kernels_%s kernels_%s\n#include "%s/csrc/cpu/codec_%s.cpp"\n' $isa $side "$work/$side" $isa > "$work/kernel_ab_$side.cpp"
  g++ $flags -I "$work/$side/csrc" -c "$work/kernel_ab_$side.cpp" -o "$work/$side.o" &
done
wait
g++ $flags -pthread -I "$work/a/csrc" "$here/kernel_ab.cpp" "$work/a.o" "$work/b.o" -o "$work/kernel_ab"
{
  echo "# isa=$isa threads=${THREADS:-1} A=$(git -C "$root" rev-parse --short "$1") B=$([ "$2" = worktree ] && echo worktree || git -C "$root" rev-parse --short "$2") cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) date=$(date -u +%FT%TZ)"
  echo "op,preset,rounding,mib,calls,a_gbps_median,a_gbps_best,b_gbps_median,b_gbps_best,speedup_median,speedup_best"
  for op in $ops; do for mib in $sizes; do for p in $presets; do
    "$work/kernel_ab" "$p" "$mib" "$([ "$mib" -ge 16 ] && echo 60 || echo 400)" "$op" "$rounding"
  done; done; done
} > "$work/result.csv"
if [ "$out" = - ]; then cat "$work/result.csv"; else cp "$work/result.csv" "$out.tmp.$$" && mv "$out.tmp.$$" "$out"; fi
