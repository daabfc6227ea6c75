#!/usr/bin/env bash
# The GPU checks of a source tree in one call of a lent GPU machine, most needed first, within a time budget:
#   bash benchmarks/gpu_checks.sh REFERENCE_BUILD OUT [SECONDS]
# 1. builds this tree for sm_90 into /tmp/pydsa-build (pip --target; the reference build's wheels into /tmp/site);
# 2. the GPU suite (pytest -m gpu) beside compute-sanitizer's memcheck and racecheck over $SANITIZE_MODULES
#    (default: the c4, store, sglang c4, offline c128 and c4 plan tests; tests/sanitize.sh; SANITIZE_K, a pytest
#    -k expression, runs fewer of each module's tests where the call's time is short);
# 3. the reference build's c4 checks (python -m pydsa.bench.c4 --only checks: ring rows bit-equal, entries and
#    both caches against sglang 0.5.23's c4 modules);
# 4. then, while the budget lasts, each part of $BENCH: X runs `python -m pydsa.bench.c4 --only X --rounds 3`,
#    release:Y `python -m pydsa.bench.release --only Y` (e.g. BENCH="plan decode release:offline release:v4-step");
#    with BASE=<another source tree> (e.g. main's, from git archive), that tree is built too and each part runs
#    $AB_ROUNDS times (default 2) in alternating processes, base then this tree: the same-run A/B.
# On a machine still warm from an earlier call: REUSE=1 keeps the builds already in /tmp (built again where
# absent), SUITE=0 skips step 2, CHECKS=0 step 3. PACK=1 leaves OUT as one archive, OUT.tgz.
# Step 2 gets SECONDS - 90 s less what the builds took: on an H100 (2026-12-07) the suite alone took 115 s and
# memcheck / racecheck over test_c4 77 s, over test_c128_offline more than 110 s; give SECONDS >= 300 where the
# suite must finish (a call that times the benches first, SUITE=0, then the suite with REUSE=1, gets both).
# OUT gets one file per step, each headed by the GPU, date, commit and command, and summary.txt. COMMIT and
# BASE_COMMIT name the trees where they carry no git history (a copied working tree, a git archive).
# REFERENCE_BUILD: benchmarks/reference/build.sh's output, carried to the GPU machine.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
ref=$(realpath "${1:?REFERENCE_BUILD}"); out=$(realpath -m "${2:?OUT}"); budget=${3:-560}
t0=$(date +%s); mkdir -p "$out"
left() { echo $((budget - ($(date +%s) - t0))); }
commit=${COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ -z "${COMMIT:-}" ] && [ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ] && commit="$commit+changes"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
head_of() { echo "# $1: $gpu, $(date -u +%Y-%m-%dT%H:%MZ), tree $commit"; echo "# command: $2"; }
note() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/summary.txt"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$ref"/wheels/*.whl > /dev/null 2>&1
build() {  # tree folder log
  [ "${REUSE:-0}" = 1 ] && [ -d "$2/pydsa" ] && { echo "reused $2" > "$3"; return 0; }
  rm -rf "$2"
  python3 -m pip install -q --no-build-isolation --no-deps -Ccmake.define.PYDSA_CUDA_ARCHITECTURES=90-real \
    --target "$2" "$1" > "$3" 2>&1
}
base=${BASE:+$(realpath "$BASE")}
[ -n "$base" ] && { build "$base" /tmp/pydsa-base "$out/build-base.log" & }
if ! build "$root" /tmp/pydsa-build "$out/build.log"; then
  note "build failed (build.log)"; tail -30 "$out/build.log"; exit 1
fi
wait
[ -n "$base" ] && { [ -d /tmp/pydsa-base/pydsa ] && note "built base $base" || { note "base build failed"; base=; }; }
note "built $commit"
export PYTHONPATH=/tmp/pydsa-build:/tmp/site
cd /tmp
s=$(( $(left) - 90 ))
if [ "${SUITE:-1}" != 0 ] && [ "$s" -gt 60 ]; then
  ( { head_of "GPU suite" "pytest -q -m gpu tests (installed build)"
      timeout "$s" python3 -m pytest -q -p no:cacheprovider -m gpu -rfs "$root/tests" 2>&1; echo "rc=$?"; } \
      > "$out/gpu-suite.txt" ) &
  sanitize() {  # the runs, or (SANITIZE_SKIP_RUN=1) the summary of their logs as they stand
    SANITIZE_MODULES="${SANITIZE_MODULES:-test_c4 test_store test_sglang_c4 test_c128_offline test_c4_plan}" \
      SANITIZE_TOOLS="memcheck racecheck" SANITIZE_LOGS="$out/sanitizer-logs" \
      "$@" bash "$root/tests/sanitize.sh" "$out/sanitizer.txt" > /dev/null 2>&1
  }
  ( sanitize timeout "$s" ) &
  wait
  # stopped by the budget: the logs summarized as they stand (a run stopped after its tests: INCOMPLETE)
  [ -f "$out/sanitizer.txt" ] || SANITIZE_SKIP_RUN=1 sanitize
  summary=$(grep -E '[0-9]+ (passed|failed|skipped)' "$out/gpu-suite.txt" | tail -1)
  note "suite: ${summary:-no summary: cut off at $s s? (gpu-suite.txt)}"
  fails=$(grep -c ": FAIL;" "$out/sanitizer.txt" 2>/dev/null)  # prints 0 (and fails) where none failed
  cut=$(grep -c ": INCOMPLETE;" "$out/sanitizer.txt" 2>/dev/null)
  note "sanitizer: ${fails:-?} failing runs, ${cut:-?} stopped before the tool's summary (sanitizer.txt)"
fi
if [ "${CHECKS:-1}" != 0 ] && [ "$(left)" -gt 60 ]; then
  { head_of "reference c4 checks" "python3 -m pydsa.bench.c4 OUT --reference-build REF --only checks"
    timeout $(( $(left) - 10 )) python3 -m pydsa.bench.c4 "$out/c4-checks.json" --reference-build "$ref" --only checks 2>&1
    echo "rc=$?"; } > "$out/c4-checks.log"
  note "c4 checks: $(tail -1 "$out/c4-checks.log")"
fi
bench() {  # part label build-folder
  local module=c4 only=$1 extra="--rounds 3" name
  local which=$commit
  [ "${2#base}" != "$2" ] && which="base-${BASE_COMMIT:-$(git -C "$base" rev-parse --short HEAD 2>/dev/null || basename "$base")}"
  case "$1" in release:*) module=release only=${1#release:} extra="--commit $which";; esac
  name=$module-$only-$2
  { head_of "$module rows: $only ($2: $which)" "python3 -m pydsa.bench.$module OUT --reference-build REF --only $only $extra"
    PYTHONPATH="$3:/tmp/site" timeout $(( $(left) - 5 )) python3 -m pydsa.bench.$module "$out/$name.json" \
      --reference-build "$ref" --only "$only" $extra 2>&1; echo "rc=$?"; } > "$out/$name.log"
  note "$module $only ($2): $(tail -1 "$out/$name.log")"
}
for part in ${BENCH:-}; do
  if [ -z "$base" ]; then
    [ "$(left)" -gt 45 ] && bench "$part" tree /tmp/pydsa-build || note "no time left for $part"
    continue
  fi
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    [ "$(left)" -gt 90 ] || { note "no time left for $part round $round"; break; }
    bench "$part" "base-$round" /tmp/pydsa-base
    bench "$part" "tree-$round" /tmp/pydsa-build
  done
done
cat "$out/summary.txt"
# PACK=1: OUT as one archive, OUT.tgz (a lent machine returns only a few files a call)
if [ "${PACK:-0}" = 1 ]; then
  tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
fi
