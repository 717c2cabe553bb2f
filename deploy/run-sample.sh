#!/usr/bin/env bash
# ckptctl walkthrough (what `make demo` shows). Offline part: generates a small sharded
# checkpoint with its strategies, inspects it, shows and merges strategies, and asks which source
# ranks each destination rank needs. Online part: creates a test CA, certificates and tokens
# (deploy/make-test-pki.sh), starts a temporary ckptd with TLS and bearer tokens on a free port
# with a temporary data directory, registers the strategies, uploads the checkpoint, fetches,
# exports and transforms it, shows what other roles may not do, then stops the server and removes
# its data.
#
# Usage: deploy/run-sample.sh BUILD_DIR [SAMPLE_DIR]
#   BUILD_DIR   CMake build directory holding client/ckptctl and service/ckptd (e.g. build)
#   SAMPLE_DIR  where the demo files go (default: ./sample, git-ignored)
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BUILD_DIR [SAMPLE_DIR]" >&2
  exit 2
fi
BUILD_DIR=$1
SAMPLE_DIR=${2:-sample}
CKPTCTL="$BUILD_DIR/client/ckptctl"
CKPTD="$BUILD_DIR/service/ckptd"
for binary in "$CKPTCTL" "$CKPTD"; do
  if [ ! -x "$binary" ]; then
    echo "run-sample: $binary not found; build first (make build)" >&2
    exit 1
  fi
done

section() {
  printf '\n=== %s ===\n' "$*"
}

# Echoes the command as a user would type it, then runs it.
run() {
  printf '\n$ ckptctl %s\n' "$*"
  "$CKPTCTL" "$@"
}

echo "ckptctl demo (binary: $CKPTCTL, files: $SAMPLE_DIR/)"

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

# ---------------------------------------------------------------------------- online part

SERVER_TMP=$(mktemp -d /tmp/ckptd-demo.XXXXXX)
CKPTD_PID=""
stop_server() {
  if [ -n "$CKPTD_PID" ]; then
    kill -TERM "$CKPTD_PID" 2>/dev/null || true
    wait "$CKPTD_PID" 2>/dev/null || true
    CKPTD_PID=""
  fi
  rm -rf "$SERVER_TMP"
}
trap stop_server EXIT

section "Create a test CA, server and client certificates and bearer tokens (openssl)"
PKI="$SERVER_TMP/pki"
printf '\n$ deploy/make-test-pki.sh %s\n' "$PKI"
bash "$(dirname "$0")/make-test-pki.sh" "$PKI"
echo "ckptd's token file holds only SHA-256 hashes of the tokens:"
sed 's/^/  /' "$PKI/tokens.txt"

section "Start a temporary ckptd with TLS and tokens (any free port, data in $SERVER_TMP/data)"
printf '\n$ ckptd --tls-cert %s --tls-key %s --auth-tokens %s ...\n' \
  "$PKI/server.pem" "$PKI/server.key" "$PKI/tokens.txt"
"$CKPTD" --listen 127.0.0.1:0 --port-file "$SERVER_TMP/port" --data "$SERVER_TMP/data" \
  --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key" --auth-tokens "$PKI/tokens.txt" \
  --export-root "$SAMPLE_DIR" >"$SERVER_TMP/ckptd.log" 2>&1 &
CKPTD_PID=$!
for _ in $(seq 1 300); do
  [ -s "$SERVER_TMP/port" ] && break
  if ! kill -0 "$CKPTD_PID" 2>/dev/null; then
    echo "run-sample: ckptd exited during start-up:" >&2
    cat "$SERVER_TMP/ckptd.log" >&2
    exit 1
  fi
  sleep 0.1
done
if [ ! -s "$SERVER_TMP/port" ]; then
  echo "run-sample: ckptd did not start within 30 s" >&2
  exit 1
fi
CKPT_SERVER="127.0.0.1:$(cat "$SERVER_TMP/port")"
export CKPT_SERVER
# ckptctl connects with TLS, trusting the test CA, and authenticates as the admin principal.
CKPT_TLS_CA="$PKI/ca.pem"
CKPT_TOKEN_FILE="$PKI/admin.token"
export CKPT_TLS_CA CKPT_TOKEN_FILE
echo "ckptd is listening on $CKPT_SERVER with TLS (ckptctl reads \$CKPT_SERVER, \$CKPT_TLS_CA and"
echo "\$CKPT_TOKEN_FILE=$CKPT_TOKEN_FILE: the admin's token)"

# The server writes transform outputs only beneath its --export-root ($SAMPLE_DIR): their paths
# are relative to it (out/...).
OUT="$(cd "$SAMPLE_DIR" && pwd)/out"
rm -rf "$OUT"
mkdir -p "$OUT"

section "Register the strategies and upload the 8 rank files (committed atomically)"
run strategy put src "$SAMPLE_DIR/src_strategy.ckpt"
run strategy put dst "$SAMPLE_DIR/dst_strategy.json"
run upload demo --strategy src --dir "$SAMPLE_DIR/checkpoint"
run ls
run describe demo

section "What destination rank 1 reads, then fetch its slices (re-sharded on the fly)"
run deps demo --dst-strategy dst --rank 1
run fetch demo --dst-strategy dst --rank 1 --out "$OUT/dst_rank1.ckpt"
run inspect "$OUT/dst_rank1.ckpt"

section "Client-side export: every destination rank as MindSpore's rank_<r>/ layout, locally"
run export demo --dst-strategy dst --dir "$OUT/export"

section "Server-side transform jobs: a new stored checkpoint, an export directory, a merged file"
run transform demo --dst-strategy dst --as demo_dst --wait
run transform demo --dst-strategy dst --export-dir out/server-export --ranks 0,2 \
  --id export-02 --wait
run transform demo --merged-file out/merged.ckpt --wait
run jobs ls
run jobs get export-02
echo
echo "(the server-side export equals the client-side one:)"
for r in 0 2; do
  cmp "$OUT/export/rank_$r/checkpoint_$r.ckpt" "$OUT/server-export/rank_$r/checkpoint_$r.ckpt"
  echo "  rank_$r/checkpoint_$r.ckpt: identical"
done

section "Roles: a reader reads but may not delete; without a token nothing is served"
run --token-file "$PKI/reader.token" ls
run --token-file "$PKI/reader.token" rm demo || true
printf '\n$ env -u CKPT_TOKEN_FILE ckptctl ls\n'
env -u CKPT_TOKEN_FILE "$CKPTCTL" ls || true
echo
echo "(the audit log has a line for each mutating or refused call:)"
grep 'event=audit' "$SERVER_TMP/ckptd.log" | tail -n 3 | sed 's/^/  /'

section "Errors are one line on stderr and a non-zero exit"
run fetch demo --dst-strategy dst --rank 3 --out "$OUT/x.ckpt" || true
run transform demo --dst-strategy dst --export-dir ../outside-the-export-root || true

section "Stop the server (SIGTERM drains in-flight calls and flushes the store)"
stop_server
trap - EXIT
echo "stopped; its data directory is removed"

printf '\nDone. The demo files are in %s/; see README.md for every ckptctl command.\n' "$SAMPLE_DIR"
