#!/usr/bin/env bash
# Starts ckptd in the foreground (what `make run` does after building): prints a few ckptctl
# commands to try from another terminal, then runs the server until Ctrl-C (SIGINT) or SIGTERM,
# which drain in-flight calls and flush the store before exiting.
#
# Usage: deploy/run.sh BUILD_DIR [LISTEN [DATA_DIR]]
#   BUILD_DIR  CMake build directory holding service/ckptd and client/ckptctl (e.g. build)
#   LISTEN     address to listen on (default 127.0.0.1:50051)
#   DATA_DIR   directory of the server's RocksDB store (default ./data, git-ignored)
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 3 ]; then
  echo "usage: $0 BUILD_DIR [LISTEN [DATA_DIR]]" >&2
  exit 2
fi
BUILD_DIR=$1
LISTEN=${2:-127.0.0.1:50051}
DATA_DIR=${3:-./data}
CKPTD="$BUILD_DIR/service/ckptd"
CKPTCTL="$BUILD_DIR/client/ckptctl"
for binary in "$CKPTD" "$CKPTCTL"; do
  if [ ! -x "$binary" ]; then
    echo "run: $binary not found; build first (make build)" >&2
    exit 1
  fi
done

# ckptctl's default server is 127.0.0.1:50051; any other address needs --server.
SERVER_FLAG=""
if [ "$LISTEN" != "127.0.0.1:50051" ]; then
  SERVER_FLAG=" --server $LISTEN"
fi
C="$CKPTCTL$SERVER_FLAG"

cat <<BANNER
ckptd on $LISTEN, data in $DATA_DIR (Ctrl-C stops it). From another terminal, try:

  $C sample /tmp/ckpt-demo
  $C strategy put src /tmp/ckpt-demo/src_strategy.ckpt
  $C strategy put dst /tmp/ckpt-demo/dst_strategy.json
  $C upload demo --strategy src --dir /tmp/ckpt-demo/checkpoint
  $C fetch demo --dst-strategy dst --rank 0 --out /tmp/ckpt-demo/dst_rank0.ckpt
  $C export demo --dst-strategy dst --dir /tmp/ckpt-demo/export

(make demo runs a whole walkthrough against a temporary server; README.md documents every command.)

BANNER

mkdir -p "$DATA_DIR"
exec "$CKPTD" --listen "$LISTEN" --data "$DATA_DIR"
