// Debian 12's abseil (20220623) has its own absl::string_view, not an alias of std::string_view,
// so absl::StrCat/StrJoin do not accept std::string_view. Our APIs use std::string_view; this
// converts at the boundary without copying.
#ifndef CKPT_CORE_ABSL_COMPAT_H_
#define CKPT_CORE_ABSL_COMPAT_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace ckpt {

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace ckpt

#endif  // CKPT_CORE_ABSL_COMPAT_H_
