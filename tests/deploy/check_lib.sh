# Shared by the tests/deploy shell checks (sourced, not run): `check DESCRIPTION COMMAND...` runs
# COMMAND, prints "ok   DESCRIPTION" or "FAIL DESCRIPTION" with its indented output, and counts
# both; `finish NAME` prints the tally and returns non-zero when any check failed. The caller
# sets WORK to a scratch directory first.
# shellcheck shell=bash

passes=0
failures=0

check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@" >"$WORK/last.log" 2>&1; then
    passes=$((passes + 1))
    echo "ok   $what"
  else
    failures=$((failures + 1))
    echo "FAIL $what"
    sed 's/^/    /' "$WORK/last.log"
  fi
}

finish() {  # finish NAME
  echo "$1: $passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}
