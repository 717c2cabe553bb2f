// Small helpers for absl::Status plumbing. Debian's abseil 20220623 has no status macros.
#ifndef CKPT_CORE_STATUS_MACROS_H_
#define CKPT_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CKPT_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPT_STATUS_CONCAT_(a, b) CKPT_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define CKPT_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::absl::Status ckpt_status_ = (expr);           \
    if (!ckpt_status_.ok()) return ckpt_status_;    \
  } while (0)

// `lhs = value of expr` where expr is an absl::StatusOr<T>; returns its status on error.
#define CKPT_ASSIGN_OR_RETURN(lhs, expr) \
  CKPT_ASSIGN_OR_RETURN_IMPL_(CKPT_STATUS_CONCAT_(ckpt_statusor_, __LINE__), lhs, expr)
#define CKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(*tmp)

#endif  // CKPT_CORE_STATUS_MACROS_H_
