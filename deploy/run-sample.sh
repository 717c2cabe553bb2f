#!/usr/bin/env bash
# Offline ckptctl demo (what `make run` shows until the ckptd server exists): generates a small
# sharded checkpoint with its strategies, then inspects it, shows and merges strategies, and asks
# which source ranks each destination rank needs.
#
# Usage: deploy/run-sample.sh BUILD_DIR [SAMPLE_DIR]
#   BUILD_DIR   CMake build directory holding client/ckptctl (e.g. build)
#   SAMPLE_DIR  where the demo files go (default: ./sample, git-ignored)
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BUILD_DIR [SAMPLE_DIR]" >&2
  exit 2
fi
BUILD_DIR=$1
SAMPLE_DIR=${2:-sample}
CKPTCTL="$BUILD_DIR/client/ckptctl"
if [ ! -x "$CKPTCTL" ]; then
  echo "run-sample: $CKPTCTL not found; build first (make build)" >&2
  exit 1
fi

section() {
  printf '\n=== %s ===\n' "$*"
}

# Echoes the command as a user would type it, then runs it.
run() {
  printf '\n$ ckptctl %s\n' "$*"
  "$CKPTCTL" "$@"
}

echo "ckptctl offline demo (binary: $CKPTCTL, files: $SAMPLE_DIR/)"

section "Generate a demo: 8-rank source (2 pipeline stages x 4 devices), 3-rank destination"
run sample "$SAMPLE_DIR"

section "Inspect one rank's file (its local slices) and the whole-tensor checkpoint"
run inspect "$SAMPLE_DIR/checkpoint/rank_0/sample-1_10.ckpt"
run inspect "$SAMPLE_DIR/whole.ckpt"

section "Show the source (binary) and destination (JSON) strategies"
run strategy show "$SAMPLE_DIR/src_strategy.ckpt"
run strategy show "$SAMPLE_DIR/dst_strategy.json"

section "Merge per-stage strategy files (one per pipeline stage, as MindSpore writes them)"
stages="$SAMPLE_DIR/stages"
rm -rf "$stages"
mkdir -p "$stages"
# Each rank of a pipelined job saves only its stage's layouts; the operator items carry the stage.
cat >"$stages/strategy_rank_0.json" <<'EOF'
{"current_stage": 0,
 "parallel_strategy_item": {
   "MatMul_layers.0.dense.weight": {"stage": 0, "parallel_strategy": [[2, 1], [1, 2]]}},
 "parallel_layout_item": {
   "embedding.weight": {"dev_matrix": [2, 2], "tensor_map": [0, -1], "tensor_shape": [96, 24],
                        "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0},
   "layers.0.dense.weight": {"dev_matrix": [2, 2], "tensor_map": [1, 0], "tensor_shape": [48, 24],
                             "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}}
EOF
cat >"$stages/strategy_rank_4.json" <<'EOF'
{"current_stage": 1,
 "parallel_strategy_item": {
   "MatMul_layers.1.dense.weight": {"stage": 1, "parallel_strategy": [[1, 2], [2, 1]]}},
 "parallel_layout_item": {
   "embedding.weight": {"dev_matrix": [2, 2], "tensor_map": [0, -1], "tensor_shape": [96, 24],
                        "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0},
   "layers.1.dense.weight": {"dev_matrix": [2, 2], "tensor_map": [-1, 0], "tensor_shape": [48, 24],
                             "field": 0, "opt_weight_shard_step": 1, "opt_weight_shard_size": 2}}}
EOF
echo "(wrote $stages/strategy_rank_0.json for stage 0 and $stages/strategy_rank_4.json for stage 1)"
run strategy merge "$stages" --out "$SAMPLE_DIR/merged_strategy.json"
run strategy show "$SAMPLE_DIR/merged_strategy.json"

section "Which source ranks does each destination rank read? (8 ranks -> 3 ranks)"
run deps --src-strategy "$SAMPLE_DIR/src_strategy.ckpt" --dst-strategy "$SAMPLE_DIR/dst_strategy.json" --rank 0
run deps --src-strategy "$SAMPLE_DIR/src_strategy.ckpt" --dst-strategy "$SAMPLE_DIR/dst_strategy.json" --all --json

printf '\nDone. The demo files are in %s/; see README.md for every ckptctl command.\n' "$SAMPLE_DIR"
