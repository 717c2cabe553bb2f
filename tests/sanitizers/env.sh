#!/usr/bin/env bash
# Runs a command with the sanitizer runtime options of the project: every process the command
# starts (tests, the ckptd and ckptctl they spawn) inherits them. Usage: env.sh COMMAND [ARG...]
# Reports stop the process (halt_on_error; the build uses -fno-sanitize-recover=all) so that
# ctest sees the failure; suppressions name third-party frames only (README.md here).
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=${dir}/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=${dir}/ubsan.supp:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=${dir}/tsan.supp:print_suppressions=0:${TSAN_OPTIONS:-}"
exec "$@"
