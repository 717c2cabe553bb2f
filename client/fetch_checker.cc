#include "client/fetch_checker.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/absl_compat.h"
#include "core/checksum.h"
#include "core/status_macros.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace ckpt {

namespace fetch_checker_internal {

void CopyBytes(char* dst, const char* src, size_t n, bool streaming) {
#if defined(__x86_64__)
  if (streaming && n >= 256) {
    constexpr size_t kLine = 64;
    size_t head = (kLine - (reinterpret_cast<uintptr_t>(dst) & (kLine - 1))) & (kLine - 1);
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    const size_t lines = n / kLine;
    for (size_t i = 0; i < lines; ++i, dst += kLine, src += kLine) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    }
    std::memcpy(dst, src, n - lines * kLine);
    return;
  }
#endif
  (void)streaming;
  std::memcpy(dst, src, n);
}

void StoreFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void StreamingCopy(char* dst, const char* src, size_t n) { CopyBytes(dst, src, n, true); }

}  // namespace fetch_checker_internal

absl::Status FetchChecker::Consume(const FetchWire& message) {
  if (message.is_batch) {
    return OnBatch(absl::MakeConstSpan(message.batch_headers.data(), message.batch_header_count),
                   message.data, message.data_bytes, message.part_bytes, message.part_checksums);
  }
  if (!message.is_data) return Consume(message.message);
  return OnData(message.data, message.data_bytes, message.part_bytes, message.part_checksums,
                message.tile_box, message.band_rows);
}

absl::Status FetchChecker::Consume(const v1::FetchResponse& message) {
  switch (message.kind_case()) {
    case v1::FetchResponse::kSummary:
      return OnSummary(message.summary());
    case v1::FetchResponse::kTensor:
      return OnTensor(message.tensor());
    case v1::FetchResponse::kData:
      return OnData(message.data());
    case v1::FetchResponse::kBatch:
      return OnBatch(message.batch());
    case v1::FetchResponse::KIND_NOT_SET:
      break;
  }
  // A newer server's message kind we cannot interpret: skipping it could silently drop data.
  return absl::InternalError("fetch stream holds a message of an unknown kind (client too old?)");
}

// After the server closed the stream successfully.
absl::Status FetchChecker::End() {
  if (!summary_) return absl::DataLossError("fetch stream ended before its plan summary");
  CKPT_RETURN_IF_ERROR(EndTensor("the end of the stream"));
  if (tensors_ != summary_->tensor_count() || bytes_ != summary_->total_bytes()) {
    return absl::DataLossError(absl::StrCat("fetch stream ended after ", tensors_, " of ",
                                            summary_->tensor_count(), " tensors and ", bytes_,
                                            " of ", summary_->total_bytes(), " bytes"));
  }
  return absl::OkStatus();
}

absl::Status FetchChecker::OnSummary(const v1::FetchPlanSummary& summary) {
  if (summary_) return absl::InternalError("fetch stream holds a second plan summary");
  if (summary.tensor_count() < 0 || summary.total_bytes() < 0) {
    return absl::InternalError(absl::StrCat("fetch plan summary announces ", summary.tensor_count(),
                                            " tensors and ", summary.total_bytes(), " bytes"));
  }
  summary_ = summary;
  return visitor_->OnSummary(summary);
}

absl::Status FetchChecker::OnTensor(const v1::FetchTensorHeader& header) {
  if (!summary_) return absl::InternalError("fetch stream sent a tensor before its plan summary");
  CKPT_RETURN_IF_ERROR(EndTensor("the header of tensor ", header.name()));
  if (tensors_ >= summary_->tensor_count()) {
    return absl::DataLossError(absl::StrCat("fetch stream sent tensor ", header.name(),
                                            " beyond the plan's ", summary_->tensor_count(),
                                            " tensors"));
  }
  if (header.total_bytes() < 0) {
    return absl::InternalError(
        absl::StrCat("tensor ", header.name(), " announces ", header.total_bytes(), " bytes"));
  }
  ++tensors_;
  // The one Tensor is reset rather than made anew, so that its name and shape keep their storage
  // from tensor to tensor (a batch holds thousands).
  current_ = &tensor_;
  current_->name.assign(header.name());
  current_->total = header.total_bytes();
  current_->received = 0;
  current_->dtype.reset();
  if (auto dtype = ParseDType(header.dtype()); dtype.ok()) current_->dtype = *dtype;
  current_->local.assign(header.local_shape().begin(), header.local_shape().end());
  current_->band.reset();
  current_->memory = nullptr;
  CKPT_RETURN_IF_ERROR(visitor_->OnTensor(header));
  if (in_place_ != nullptr) current_->memory = in_place_->TensorMemory();
  return absl::OkStatus();
}

absl::Status FetchChecker::OnData(const v1::FetchData& data) {
  const std::vector<std::string_view> views = {data.data()};
  return OnData(views, data.data().size(),
                absl::MakeConstSpan(data.part_bytes().data(), data.part_bytes_size()),
                absl::MakeConstSpan(data.part_checksums().data(), data.part_checksums_size()),
                absl::MakeConstSpan(data.tile_box().data(), data.tile_box_size()),
                data.band_rows());
}

absl::Status FetchChecker::OnBatch(const v1::FetchTensorBatch& batch) {
  const std::vector<std::string_view> views = {batch.data()};
  return OnBatch(batch.tensors(), views, batch.data().size(),
                 absl::MakeConstSpan(batch.part_bytes().data(), batch.part_bytes_size()),
                 absl::MakeConstSpan(batch.part_checksums().data(), batch.part_checksums_size()));
}

// Verifies every part of the batch's data, then delivers each tensor as its header and its
// total_bytes bytes (as views of the received data, in one or more OnData calls).
template <typename Headers>
absl::Status FetchChecker::OnBatch(const Headers& headers,
                                   const std::vector<std::string_view>& views, uint64_t size,
                                   absl::Span<const uint64_t> part_bytes,
                                   absl::Span<const uint64_t> part_checksums) {
  static const std::string kNone = "(none)";
  if (!summary_) return absl::InternalError("fetch stream sent a batch before its plan summary");
  if (current_ && current_->in_band()) {
    return absl::DataLossError(
        absl::StrCat("tensor ", current_->name, ": a batch inside a band of tiles"));
  }
  const size_t count = static_cast<size_t>(headers.size());
  const std::string& first = count > 0 ? headers[0].name() : kNone;
  auto fail = [&](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("a batch of ", count, " tensors from tensor ", first, ": ", what));
  };
  if (count == 0) return fail("it holds no tensor");
  if (part_bytes.size() != part_checksums.size()) {
    return fail(absl::StrCat("it lists ", part_bytes.size(), " part sizes and ",
                             part_checksums.size(), " part checksums"));
  }
  ViewCursor cursor(views);
  uint64_t offset = 0;
  for (size_t i = 0; i < part_bytes.size(); ++i) {
    const uint64_t part = part_bytes[i];
    if (part == 0 || part > size - offset) {
      return fail(absl::StrCat("of ", size, " bytes, it lists part ", i, " of ", part,
                               " bytes at offset ", offset));
    }
    const uint64_t actual = cursor.Checksum(part);
    if (actual != part_checksums[i]) {
      // The tensors whose bytes the part holds.
      std::vector<std::string> names;
      uint64_t at = 0;
      for (const v1::FetchTensorHeader& h : headers) {
        const auto n = static_cast<uint64_t>(std::max<int64_t>(0, h.total_bytes()));
        if (at < offset + part && at + n > offset) names.push_back(h.name());
        at += n;
      }
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", checkpoint_, " tensor ", absl::StrJoin(names, ", "), ": bytes [", offset,
          ", ", offset + part, ") of a batch of ", count, " tensors from tensor ", first,
          " failed their ", kChecksumName, " checksum (received ", absl::Hex(actual), ", expected ",
          absl::Hex(part_checksums[i]), "): corrupted in the server's store or in transit"));
    }
    offset += part;
  }
  if (offset != size) {
    return fail(absl::StrCat("its parts cover ", offset, " of its ", size, " bytes"));
  }
  uint64_t announced = 0;
  for (const v1::FetchTensorHeader& header : headers) {
    if (header.total_bytes() < 0 ||
        static_cast<uint64_t>(header.total_bytes()) > size - announced) {
      announced = size + 1;  // more than it holds, however much
      break;
    }
    announced += static_cast<uint64_t>(header.total_bytes());
  }
  if (announced != size) {
    return fail(absl::StrCat("its tensors announce ",
                             announced > size ? "more" : std::to_string(announced),
                             " bytes but it holds ", size));
  }
  ViewCursor tensors(views);
  for (const v1::FetchTensorHeader& header : headers) {
    CKPT_RETURN_IF_ERROR(OnTensor(header));
    const auto n = static_cast<uint64_t>(header.total_bytes());
    if (n > 0) CKPT_RETURN_IF_ERROR(Deliver(tensors.Next(n), n));
  }
  return absl::OkStatus();
}

// A data message of `size` bytes, the concatenated `views`.
absl::Status FetchChecker::OnData(const std::vector<std::string_view>& views, uint64_t size,
                                  absl::Span<const uint64_t> part_bytes,
                                  absl::Span<const uint64_t> part_checksums,
                                  absl::Span<const int64_t> tile_box, int64_t band_rows) {
  if (!current_) return absl::InternalError("fetch stream sent data outside a tensor");
  if (current_->in_band() && tile_box.empty()) {
    return absl::DataLossError(
        absl::StrCat("tensor ", current_->name, ": row-major data inside a band of tiles"));
  }
  if (size > static_cast<uint64_t>(current_->total - current_->received)) {
    return absl::DataLossError(absl::StrCat("tensor ", current_->name, ": received more than its ",
                                            current_->total, " announced bytes"));
  }
  // Parts end to end, each with its own checksum (FetchData.part_bytes, part_checksums).
  if (part_bytes.empty() || part_bytes.size() != part_checksums.size()) {
    return absl::DataLossError(absl::StrCat(
        "tensor ", current_->name, ": a data message lists ", part_bytes.size(), " part sizes and ",
        part_checksums.size(),
        " part checksums (expected at least one of each, as many of one as of the other)"));
  }
  ViewCursor cursor(views);
  uint64_t offset = 0;
  for (size_t i = 0; i < part_bytes.size(); ++i) {
    const uint64_t part = part_bytes[i];
    if (part == 0 || part > size - offset) {
      return absl::DataLossError(absl::StrCat("tensor ", current_->name, ": a data message of ",
                                              size, " bytes lists part ", i, " of ", part,
                                              " bytes at offset ", offset));
    }
    CKPT_RETURN_IF_ERROR(Verify(cursor.Checksum(part), offset, part, part_checksums[i]));
    offset += part;
  }
  if (offset != size) {
    return absl::DataLossError(absl::StrCat("tensor ", current_->name,
                                            ": the parts of a data message cover ", offset,
                                            " of its ", size, " bytes"));
  }
  if (!tile_box.empty()) return AddTiles(views, part_bytes, tile_box, band_rows);
  return Deliver(views, size);
}

absl::Status FetchChecker::Deliver(absl::Span<const std::string_view> views, uint64_t size) {
  Current& c = *current_;
  if (c.memory != nullptr) {
    // OnData checked `size` against the bytes still due.
    char* dst = c.memory + c.received;
    const bool streaming = c.total >= kStreamingMinBytes;
    for (std::string_view v : views) {
      fetch_checker_internal::CopyBytes(dst, v.data(), v.size(), streaming);
      dst += v.size();
    }
  }
  c.received += static_cast<int64_t>(size);
  bytes_ += static_cast<int64_t>(size);
  if (c.memory != nullptr) {
    fetch_checker_internal::StoreFence();
    return in_place_->OnPlaced(static_cast<int64_t>(size));
  }
  for (std::string_view v : views) CKPT_RETURN_IF_ERROR(visitor_->OnData(v));
  return absl::OkStatus();
}

// Places a verified message of tiles (part i is tile i) into the current band, opening it at
// the first row not yet delivered; hands the band on once its tiles cover it.
absl::Status FetchChecker::AddTiles(const std::vector<std::string_view>& views,
                                    absl::Span<const uint64_t> part_bytes,
                                    absl::Span<const int64_t> tile_box, int64_t band_rows) {
  Current& c = *current_;
  auto fail = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("tensor ", c.name, ": ", what));
  };
  const size_t rank = c.local.size();
  if (!c.dtype || rank == 0 || part_bytes.empty() ||
      tile_box.size() != 2 * rank * part_bytes.size()) {
    return fail(absl::StrCat("a data message of ", part_bytes.size(), " parts lists ",
                             tile_box.size(), " tile coordinates for a slice of rank ", rank));
  }
  if (!c.in_band()) {
    Shape row(c.local.begin() + 1, c.local.end());
    auto row_elements = NumElements(row);
    auto row_bytes = row_elements.ok() ? ByteSizeOf(*c.dtype, *row_elements) : row_elements;
    if (!row_bytes.ok() || *row_bytes <= 0 || c.received % *row_bytes != 0) {
      return fail("tiles do not start at a whole row");
    }
    const int64_t first_row = c.received / *row_bytes;
    // In lent memory the band is assembled where it belongs; otherwise in a buffer of its own.
    auto band =
        c.memory != nullptr
            ? TileBand::StartIn(
                  *c.dtype, c.local, first_row, band_rows, kMaxBandBytes, c.memory,
                  c.total >= kStreamingMinBytes ? &fetch_checker_internal::StreamingCopy : nullptr)
            : TileBand::Start(*c.dtype, c.local, first_row, band_rows, kMaxBandBytes);
    if (!band.ok()) return fail(std::string(band.status().message()));
    // Each message was checked against the bytes still due, but the band delivers all of its
    // messages at once: it must fit as a whole too (the header's shape and size may disagree).
    // Nothing is written before this check.
    const auto band_bytes = static_cast<int64_t>((*band)->bytes().size());
    if (band_bytes > c.total - c.received) {
      return fail(absl::StrCat("a band of ", band_bytes, " bytes exceeds the ",
                               c.total - c.received, " announced bytes still due"));
    }
    c.band = std::move(*band);
  } else if (band_rows != c.band->box().extent(0)) {
    return fail(absl::StrCat("a band of ", c.band->box().extent(0), " rows continues as one of ",
                             band_rows));
  }
  ViewCursor cursor(views);  // the parts cover the views exactly (checked by OnData)
  for (size_t i = 0; i < part_bytes.size(); ++i) {
    const absl::Span<const int64_t> lo = tile_box.subspan(2 * rank * i, rank);
    const absl::Span<const int64_t> hi = tile_box.subspan(2 * rank * i + rank, rank);
    const std::vector<std::string_view>& bytes = cursor.Next(part_bytes[i]);
    if (absl::Status s = c.band->Add(lo, hi, bytes); !s.ok()) return fail(std::string(s.message()));
  }
  if (!c.band->complete()) return absl::OkStatus();
  const std::string_view band = c.band->bytes();
  const auto size = static_cast<int64_t>(band.size());
  c.received += size;
  bytes_ += size;
  if (c.memory != nullptr) {
    c.band.reset();
    fetch_checker_internal::StoreFence();
    return in_place_->OnPlaced(size);
  }
  CKPT_RETURN_IF_ERROR(visitor_->OnData(band));
  c.band.reset();
  return absl::OkStatus();
}

// Checks `actual`, the checksum of the `size` bytes at `offset` in the current data message.
absl::Status FetchChecker::Verify(uint64_t actual, uint64_t offset, uint64_t size,
                                  uint64_t expected) const {
  if (actual == expected) return absl::OkStatus();
  const int64_t begin = current_->received + static_cast<int64_t>(offset);
  // Whole stored chunks are checked only here (the server sends their stored checksum without
  // hashing them), so a mismatch may be corruption in the store as well as in transit.
  return absl::DataLossError(
      absl::StrCat("checkpoint ", checkpoint_, " tensor ", current_->name, ": bytes [", begin, ", ",
                   begin + static_cast<int64_t>(size), ") failed their ", kChecksumName,
                   " checksum (received ", absl::Hex(actual), ", expected ", absl::Hex(expected),
                   "): corrupted in the server's store or in transit"));
}

// Closes the open tensor (if any) at `where` followed by `what`, checking it got all its bytes.
absl::Status FetchChecker::EndTensor(std::string_view where, std::string_view what) {
  if (!current_) return absl::OkStatus();
  if (current_->in_band()) {
    return absl::DataLossError(absl::StrCat("tensor ", current_->name, ": a band of tiles ",
                                            current_->band->box().ToString(),
                                            " was incomplete before ", Sv(where), Sv(what)));
  }
  if (current_->received != current_->total) {
    return absl::DataLossError(absl::StrCat("tensor ", current_->name, ": received ",
                                            current_->received, " of ", current_->total,
                                            " bytes before ", Sv(where), Sv(what)));
  }
  current_ = nullptr;
  return visitor_->OnTensorEnd();
}

}  // namespace ckpt
