#!/usr/bin/env bash
# Runs the fuzz campaign (`make fuzz`): writes the seed corpora, then runs every target for
# SECONDS seconds, JOBS targets at a time (default 1). Fails (exit 1) if any target crashes, leaks,
# times out or runs out of memory; each crash input is kept in FUZZ_DIR/artifacts/<target>/ and
# its reproduction command printed.
#   tests/fuzz/run.sh FUZZ_DIR CKPTCTL SECONDS [JOBS]
# FUZZ_DIR is the clang build holding the targets (tests/fuzz/fuzz_*); CKPTCTL writes the sample.
# CKPT_FIXTURES_DIR (default: ../shared/fixtures/mindspore beside the checkout) adds the
# MindSpore fixtures to the seeds when present.
set -euo pipefail
FUZZ_DIR=$1
CKPTCTL=$2
SECONDS_PER_TARGET=$3
JOBS=${4:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIXTURES=${CKPT_FIXTURES_DIR:-$ROOT/../shared/fixtures/mindspore}
BIN=$FUZZ_DIR/tests/fuzz
WORK=$FUZZ_DIR/fuzz-run
TARGETS=(ckpt_decode strategy_binary strategy_json fetch_wire upload)

rm -rf "$WORK/sample" "$WORK/seeds"
mkdir -p "$WORK"
"$CKPTCTL" sample "$WORK/sample" >/dev/null
"$BIN/ckpt_fuzz_seeds" "$WORK/sample" "$FIXTURES" "$WORK/seeds"

# One target's campaign; its log is WORK/<target>.log. Prints its stats, or its failure with the
# last lines of its log and how to reproduce each crash input; exit status 1 on failure.
run_target() {
  local t=$1 log=$WORK/$1.log
  # The corpus grows across runs in WORK/corpus (never in the repository); seeds are read too.
  mkdir -p "$WORK/corpus/$t" "$FUZZ_DIR/artifacts/$t"
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     "$BIN/fuzz_$t" "$WORK/corpus/$t" "$WORK/seeds/$t" \
       -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 -max_len=1048576 \
       -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/artifacts/$t/" >"$log" 2>&1; then
    grep -E "^(stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)" "$log" |
      sed "s/^/fuzz: $t /" || true
    return 0
  fi
  {
    echo "fuzz: $t FAILED; last lines of $log:"
    tail -n 40 "$log"
    for a in "$FUZZ_DIR/artifacts/$t"/*; do
      [ -e "$a" ] && echo "fuzz: reproduce with: $BIN/fuzz_$t $a"
    done
  } >&2
  return 1
}

# JOBS targets at a time, each a single-process campaign on its own core.
failed=()
running=()
wait_first() {
  local pid=${running[0]%%:*} t=${running[0]#*:}
  running=("${running[@]:1}")
  wait "$pid" || failed+=("$t")
}
for t in "${TARGETS[@]}"; do
  [ ${#running[@]} -ge "$JOBS" ] && wait_first
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s"
  run_target "$t" &
  running+=("$!:$t")
done
while [ ${#running[@]} -gt 0 ]; do
  wait_first
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: crashes in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets ran ${SECONDS_PER_TARGET}s each without a crash"
