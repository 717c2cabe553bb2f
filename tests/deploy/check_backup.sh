#!/usr/bin/env bash
# The offline backup and restore procedure of docs/operations.md, end to end with the built
# binaries: upload a checkpoint, fetch a rank, stop ckptd (SIGTERM), copy the store directory
# with `cp -a`, start a fresh ckptd on a copy of that backup, and fetch the same rank and the
# merged checkpoint again: both must be byte-identical to what the original store served. Also
# checks that a second ckptd cannot open a store that a running one holds, which is why the copy
# is taken with ckptd stopped.
#
# Usage: check_backup.sh CKPTD CKPTCTL
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 CKPTD CKPTCTL" >&2
  exit 2
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CKPTD=$(realpath "$1")
CKPTCTL=$(realpath "$2")
WORK=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK"
# Flags only from the command line below.
while IFS= read -r name; do unset "$name"; done < <(env | sed -n 's/^\(CKPTD_[A-Z_]*\)=.*/\1/p')

# shellcheck source-path=SCRIPTDIR source=check_lib.sh
source "$HERE/check_lib.sh"

# start_server STORE LOG: ckptd on a free loopback port; sets server_pid and CKPT_SERVER.
start_server() {
  rm -f "$WORK/port"
  "$CKPTD" --listen 127.0.0.1:0 --port-file "$WORK/port" --data "$1" >"$2" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 300); do
    if [ -s "$WORK/port" ]; then
      CKPT_SERVER="127.0.0.1:$(cat "$WORK/port")"
      export CKPT_SERVER
      return 0
    fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "ckptd did not start on $1:" >&2
  cat "$2" >&2
  return 1
}

# stop_server: SIGTERM, as systemctl stop / docker stop / Kubernetes send it; must exit 0.
stop_server() {
  kill -TERM "$server_pid"
  local status=0
  wait "$server_pid" || status=$?
  server_pid=""
  return "$status"
}

# ---------------------------------------------------------------- the original store
mkdir before after
start_server "$WORK/store" "$WORK/original.log"
check "sample" "$CKPTCTL" sample sample
check "strategy put src" "$CKPTCTL" strategy put src sample/src_strategy.ckpt
check "strategy put dst" "$CKPTCTL" strategy put dst sample/dst_strategy.json
check "upload demo" "$CKPTCTL" upload demo --strategy src --dir sample/checkpoint
check "fetch rank 1 from the original" \
  "$CKPTCTL" fetch demo --dst-strategy dst --rank 1 --out before/rank1.ckpt
check "fetch merged from the original" "$CKPTCTL" fetch demo --merged --out before/merged.ckpt
# second_refused: a second ckptd on the held store exits at once, naming RocksDB's lock.
second_refused() {
  local out
  if out=$(timeout 20 "$CKPTD" --listen 127.0.0.1:0 --data "$WORK/store" 2>&1); then
    echo "a second ckptd ran on the store: $out"
    return 1
  fi
  echo "$out"
  grep -q LOCK <<<"$out"
}
check "a second ckptd cannot open the running one's store" second_refused

# ---------------------------------------------------------------- backup: stop, copy, start
check "ckptd exits 0 on SIGTERM" stop_server
check "cp -a the stopped store" cp -a "$WORK/store" "$WORK/backup"
start_server "$WORK/store" "$WORK/restarted.log"
check "the original serves again after the copy" "$CKPTCTL" describe demo
check "stop the original" stop_server
# Whatever happens to the original after the backup does not touch the copy.
rm -rf "$WORK/store"

# ---------------------------------------------------------------- restore onto a fresh directory
check "cp -a the backup into place" cp -a "$WORK/backup" "$WORK/restored"
start_server "$WORK/restored" "$WORK/restored.log"
check "the restored store lists demo" bash -c "'$CKPTCTL' ls | grep -qw demo"
check "the restored store has both strategies" \
  bash -c "'$CKPTCTL' strategy ls | grep -qw src && '$CKPTCTL' strategy ls | grep -qw dst"
check "fetch rank 1 from the restored store" \
  "$CKPTCTL" fetch demo --dst-strategy dst --rank 1 --out after/rank1.ckpt
check "fetch merged from the restored store" "$CKPTCTL" fetch demo --merged --out after/merged.ckpt
check "rank 1 is byte-identical" cmp before/rank1.ckpt after/rank1.ckpt
check "the merged checkpoint is byte-identical" cmp before/merged.ckpt after/merged.ckpt
check "the restored store takes a new upload" \
  "$CKPTCTL" upload demo2 --strategy src --dir sample/checkpoint
check "stop the restored ckptd" stop_server

finish deploy_backup_restore
