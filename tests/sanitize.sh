#!/usr/bin/env bash
# Runs the GPU tests under compute-sanitizer (memcheck, racecheck, initcheck, synccheck; SANITIZE_MODULES and
# SANITIZE_TOOLS pick fewer; SANITIZE_K, a pytest -k expression, fewer tests of each module), one test
# module per process and tool, all in parallel, with the caching allocator off so that overruns
# cannot hide inside cached blocks. Writes one log per run and a summary to $1 (default
# sanitizer-summary.txt); exits non-zero if any run reported an error or failed, or was stopped before the tool's
# summary (INCOMPLETE). SANITIZE_SKIP_RUN=1 only summarizes the logs already in SANITIZE_LOGS. The tests run from
# outside the clone, so they import the installed pydsa (a wheel or an editable install), never the
# source tree's.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
summary=$(realpath -m "${1:-sanitizer-summary.txt}")
logs=$(realpath -m "${SANITIZE_LOGS:-sanitizer-logs}")
mkdir -p "$logs"
cd "$(mktemp -d)"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYDSA_HYPOTHESIS_PROFILE=${PYDSA_HYPOTHESIS_PROFILE:-sanitize}
modules=${SANITIZE_MODULES:-"test_c128_decode test_c128_prefill test_c128_plan test_speculative test_store test_dcp test_metadata test_reliability test_sglang test_calls test_c4 test_c4_edges test_c4_plan test_sglang_c4 test_c128_offline test_sglang_offline"}
tools=${SANITIZE_TOOLS:-"memcheck racecheck initcheck synccheck"}
if [ -z "${SANITIZE_SKIP_RUN:-}" ]; then
  for m in $modules; do
    for t in $tools; do
      # The >2^31-element page table is left out: 17 GB under memcheck is too slow to be useful.
      # So are the tests that list launched kernels with the torch profiler: CUPTI takes one
      # subscriber, and the sanitizer is it.
      compute-sanitizer --tool "$t" --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -x -p no:cacheprovider -m gpu "$root/tests/$m.py" -k "not beyond_32_bits and not several_threads and not takes_the_launches and not takes_the_plain_launches${SANITIZE_K:+ and (${SANITIZE_K})}" \
        > "$logs/$m.$t.log" 2>&1 &
    done
  done
  wait
fi
summarize() {
  echo "compute-sanitizer over the GPU suite: $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo "command: tests/sanitize.sh (PYTORCH_NO_CUDA_MEMORY_CACHING=1, hypothesis profile $PYDSA_HYPOTHESIS_PROFILE)"
  for m in $modules; do
    for t in $tools; do
      log="$logs/$m.$t.log"
      errors=$(grep -Eo "(ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard)" "$log" | tail -1 | grep -Eo "[0-9]+" || echo "?")
      result=$(grep -E "passed|failed|error" "$log" | grep -E "[0-9]+ (passed|failed)" | tail -1)
      # what the tool reported before its summary (a run stopped after its tests has no summary line)
      findings=$(grep -E "^========= " "$log" 2>/dev/null | grep -vcE "COMPUTE-SANITIZER|SUMMARY")
      verdict=ok
      if [ "$errors" = "?" ] && [ "${findings:-0}" = 0 ] && grep -qE "[0-9]+ passed" "$log" \
         && ! grep -qE "[0-9]+ failed" "$log"; then
        verdict=INCOMPLETE  # its tests passed, no finding printed, but the tool was stopped before its summary
      elif [ "$errors" != "0" ] || ! grep -qE "[0-9]+ passed" "$log" || grep -qE "[0-9]+ failed" "$log"; then
        verdict=FAIL
      fi
      echo "$m $t: $verdict; sanitizer errors/hazards ${errors} (findings in the log: ${findings:-0}); pytest: ${result:-no result}"
    done
  done
}
summarize | tee "$summary"
! grep -qE ": (FAIL|INCOMPLETE);" "$summary"
