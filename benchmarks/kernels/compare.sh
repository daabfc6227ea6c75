#!/usr/bin/env bash
# Device time per call (CUDA graph of 20 calls, median of 30 replays) of the c128 and metadata
# kernels from two source trees, built side by side and run in alternating rounds on one GPU, so
# that "old vs new" is measured in one lease. Each run also checks the GPU results against the host
# backend. Usage (on a GPU machine, from the repository root):
#   git archive <old-commit> native/src | tar -x -C /tmp/old      # the older sources
#   benchmarks/kernels/compare.sh /tmp/old/native/src [rounds]
# Both trees must share native/include/dsa_kernels.h (same ABI). Prints one line per case and tree.
# cases.txt: one prefill case per line, "name|extend lengths|prefix lengths" (the bench's prefill
# cases, a few small ones and two-list plans of one wave, 1-8K tokens); decode (B = 1 / 32 / 256 /
# 8192) and metadata cases are built in; each run ends with the floors (floors() in kernel_times.cu).
set -euo pipefail
cd "$(dirname "$0")/../.."
old=$1; rounds=${2:-3}
b=$(mktemp -d)
nv="nvcc -arch=sm_90 -O3 -std=c++17 --expt-relaxed-constexpr -Inative/include"
$nv -c native/src/abi.cu -o "$b/abi.o" & $nv -c native/src/plan.cpp -o "$b/plan.o" &
$nv -c benchmarks/kernels/kernel_times.cu -o "$b/main.o" &
$nv -c native/src/c128.cu -o "$b/c128_new.o" & $nv -c native/src/metadata_copy.cu -o "$b/md_new.o" &
$nv -c "$old/c128.cu" -o "$b/c128_old.o" & $nv -c "$old/metadata_copy.cu" -o "$b/md_old.o" &
wait
for t in old new; do $nv "$b/main.o" "$b/abi.o" "$b/plan.o" "$b/c128_$t.o" "$b/md_$t.o" -o "$b/times_$t"; done
for r in $(seq "$rounds"); do
  for t in old new; do "$b/times_$t" "$t" benchmarks/kernels/cases.txt; done
done
