#!/usr/bin/env bash
# The ctest `fuzz_seed_replay` of ordinary builds: writes the seed corpora as `make fuzz` does
# (tests/fuzz/run.sh) and runs every fuzz target once over its seeds through replay_main.cc.
# Fails if a target crashes or finds no seeds.
#   tests/fuzz/replay_seeds.sh BIN_DIR CKPTCTL WORK_DIR
set -euo pipefail
BIN=$1
CKPTCTL=$2
WORK=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIXTURES=${CKPT_FIXTURES_DIR:-$ROOT/../shared/fixtures/mindspore}
rm -rf "$WORK"
mkdir -p "$WORK"
"$CKPTCTL" sample "$WORK/sample" >/dev/null
"$BIN/ckpt_fuzz_seeds" "$WORK/sample" "$FIXTURES" "$WORK/seeds"
for t in ckpt_decode strategy_binary strategy_json fetch_wire upload; do
  if [ -z "$(ls -A "$WORK/seeds/$t" 2>/dev/null)" ]; then
    echo "replay: no seeds for $t in $WORK/seeds/$t" >&2
    exit 1
  fi
  "$BIN/fuzz_$t" "$WORK/seeds/$t"
done
rm -rf "$WORK"
