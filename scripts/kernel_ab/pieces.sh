#!/usr/bin/env bash
# The AVX2 (or AVX-512) quantize of fp4quant's config piece by piece (pieces.cpp,
# pieces_avx512.cpp), from a commit's csrc/ or the worktree's, compiled with setup.py's
# code-generation flags; CSV to OUT.csv or standard output.
#
#   [ISA=avx2|avx512] scripts/kernel_ab/pieces.sh [REV|worktree] [OUT.csv|-] [SPANS] [CALLS]
#   (defaults: avx2, worktree, -, 1 group (in L1), 2000 calls a timing)
set -euo pipefail
rev=${1:-worktree}
out=${2:--}
root=$(git rev-parse --show-toplevel)
here=$(cd "$(dirname "$0")" && pwd)
isa=${ISA:-avx2}
case $isa in
  avx2) source=pieces.cpp ;;
  avx512) source=pieces_avx512.cpp ;;
  *) echo "pieces.sh: ISA must be avx2 or avx512, got $isa" >&2; exit 2 ;;
esac
flag=$([ "$isa" = avx512 ] && echo avx512bw || echo avx2)
grep -qw $flag /proc/cpuinfo || { echo "pieces.sh: this CPU has no $flag" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$rev" = worktree ]; then cp -r "$root/csrc" "$work/"; else git -C "$root" archive "$rev" csrc | tar -x -C "$work"; fi
flags="-O3 -std=c++17 -ffp-contract=off -fno-fast-math -w"  # as kernel_ab.sh: setup.py's code-generation flags
g++ $flags -I "$work/csrc" "$here/$source" -o "$work/pieces"
{
  echo "# isa=$isa rev=$([ "$rev" = worktree ] && echo worktree || git -C "$root" rev-parse --short "$rev") cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) date=$(date -u +%FT%TZ)"
  "$work/pieces" "${3:-1}" "${4:-2000}"
} > "$work/result.csv"
if [ "$out" = - ]; then cat "$work/result.csv"; else cp "$work/result.csv" "$out.tmp.$$" && mv "$out.tmp.$$" "$out"; fi
