#include "client/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "client/fetch_wire.h"
#include "client/strategy_files.h"
#include "core/absl_compat.h"
#include "core/checksum.h"
#include "core/ckpt_format.h"
#include "core/status_macros.h"
#include "core/tile_band.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/sync_stream.h"
#include "storage/file_stream.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// The API's bound on one data message (proto/ckpt.proto: "At most 1 MiB").
constexpr size_t kDataMessageBytes = size_t{1} << 20;

// FromGrpcStatus casts the code: that is only correct while both enums number the codes alike.
static_assert(static_cast<int>(grpc::StatusCode::OK) == static_cast<int>(absl::StatusCode::kOk));
static_assert(static_cast<int>(grpc::StatusCode::CANCELLED) ==
              static_cast<int>(absl::StatusCode::kCancelled));
static_assert(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT) ==
              static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED) ==
              static_cast<int>(absl::StatusCode::kDeadlineExceeded));
static_assert(static_cast<int>(grpc::StatusCode::NOT_FOUND) ==
              static_cast<int>(absl::StatusCode::kNotFound));
static_assert(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION) ==
              static_cast<int>(absl::StatusCode::kFailedPrecondition));
static_assert(static_cast<int>(grpc::StatusCode::OUT_OF_RANGE) ==
              static_cast<int>(absl::StatusCode::kOutOfRange));
static_assert(static_cast<int>(grpc::StatusCode::UNAVAILABLE) ==
              static_cast<int>(absl::StatusCode::kUnavailable));
static_assert(static_cast<int>(grpc::StatusCode::DATA_LOSS) ==
              static_cast<int>(absl::StatusCode::kDataLoss));
static_assert(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED) ==
              static_cast<int>(absl::StatusCode::kUnauthenticated));

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

absl::Status WithPrefix(const absl::Status& status, std::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(Sv(prefix), status.message()));
}

// A decimal without sign or spaces that fits int64 comfortably (names are not numbers to trust).
std::optional<int64_t> ParseDecimal(std::string_view digits) {
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// "rank_2, rank_5" with at most `max_listed` names, then "and N more".
std::string RankList(const std::vector<int64_t>& ranks, size_t max_listed = 10) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ranks.size() && i < max_listed; ++i) {
    names.push_back(absl::StrCat("rank_", ranks[i]));
  }
  std::string out = absl::StrJoin(names, ", ");
  if (ranks.size() > max_listed) absl::StrAppend(&out, " and ", ranks.size() - max_listed, " more");
  return out;
}

// The `source_file` sent with a rank: "rank_<r>/<file>" when the file sits in a rank directory,
// which identifies it in `describe` without exposing the client's absolute paths.
std::string SourceFileLabel(const std::string& path) {
  const fs::path p(path);
  const fs::path parent = p.parent_path().filename();
  if (!parent.empty() && parent.string().starts_with("rank_")) return (parent / p.filename()).string();
  return p.filename().string();
}

// One Upload message as RankFileSender sends it: `proto` (the rank or a tensor header), or
// `data`, a piece of a tensor's bytes kept alive by `owner`. See SerializationTraits below.
struct UploadWire {
  const v1::UploadRequest* proto = nullptr;
  std::shared_ptr<const std::string> owner;
  std::string_view data;
};

// Drops the reference a gRPC slice held on an UploadWire's owner.
void ReleaseUploadBytes(void* owner) {
  delete static_cast<std::shared_ptr<const std::string>*>(owner);
}

}  // namespace
}  // namespace ckpt

// A data message is written as the wire format of UploadRequest{data} by hand, its bytes a slice
// that references the tensor bytes as read from the file: copying them into an UploadRequest and
// serialising that would cost two copies of every byte (a fifth of the upload client's CPU).
// The server receives an ordinary UploadRequest.
template <>
class grpc::SerializationTraits<ckpt::UploadWire> {
 public:
  static grpc::Status Serialize(const ckpt::UploadWire& m, grpc::ByteBuffer* buffer,
                                bool* own_buffer) {
    if (m.proto != nullptr) {
      return SerializationTraits<ckpt::v1::UploadRequest>::Serialize(*m.proto, buffer, own_buffer);
    }
    // UploadRequest.data = 3, length-delimited (proto/ckpt.proto).
    uint8_t head[1 + 10];
    head[0] = (3 << 3) | 2;
    const uint8_t* end =
        google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(m.data.size(), head + 1);
    // gRPC only reads the bytes; the owner keeps them alive until gRPC drops the slice.
    grpc::Slice slices[2] = {
        grpc::Slice(head, static_cast<size_t>(end - head)),  // copied
        grpc::Slice(const_cast<char*>(m.data.data()), m.data.size(), &ckpt::ReleaseUploadBytes,
                    new std::shared_ptr<const std::string>(m.owner))};
    *buffer = grpc::ByteBuffer(slices, 2);
    *own_buffer = true;
    return grpc::Status::OK;
  }
  // Only ever sent.
  static grpc::Status Deserialize(grpc::ByteBuffer*, ckpt::UploadWire*) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "UploadWire is never received");
  }
};

namespace ckpt {
namespace {

// Streams one rank's .ckpt into an Upload call: one Value in memory at a time, ≤ 1 MiB data
// messages, one UploadTensorHeader per tensor (consecutive same-name Values are one tensor). Not
// thread-safe; borrows the reader and the stream.
class RankFileSender {
 public:
  RankFileSender(CkptReader* reader, grpc::ClientWriter<UploadWire>* stream,
                 const std::string& path, int64_t file_size, const ProgressFn& progress)
      : reader_(reader),
        stream_(stream),
        path_(path),
        file_size_(file_size),
        progress_(progress) {}

  // Sends `header` and every tensor of the file. Returns an error for a bad file (the caller
  // cancels the call), or OK: either everything was sent, or broken() is true because the server
  // ended the call early, and its status comes from Finish().
  absl::Status Send(const v1::UploadHeader& header) {
    *message_.mutable_header() = header;
    if (!Write()) return absl::OkStatus();
    Report(0);
    CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> value, reader_->NextValue());
    while (value.has_value()) {
      CKPT_ASSIGN_OR_RETURN(value, SendTensor(*std::move(value)));
      if (broken_) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  bool broken() const { return broken_; }

 private:
  // Sends the tensor starting with Value `first` and returns the first Value of the next one
  // (nullopt at the end of the file).
  absl::StatusOr<std::optional<CkptTensor>> SendTensor(CkptTensor first) {
    std::optional<CkptTensor> next;
    int64_t total = 0;
    if (first.dtype == DType::kStr) {
      // str values carry no element count in their dims, so the size is only known once every
      // Value of the tensor is read; they are short scalars, so joining them costs nothing.
      while (true) {
        CKPT_ASSIGN_OR_RETURN(next, reader_->NextValue());
        if (!next || next->name != first.name) break;
        if (next->dtype != DType::kStr) {
          return FileError(absl::StrCat("tensor ", first.name, " mixes str and ",
                                        Sv(DTypeName(next->dtype)), " chunks"));
        }
        first.data += next->data;
      }
      total = static_cast<int64_t>(first.data.size());
    } else {
      // Every chunk of a split tensor repeats the tensor's full dims (spec §1.2), so the first
      // one tells the total size before any byte is sent.
      absl::StatusOr<int64_t> elements = NumElements(first.shape());
      absl::StatusOr<int64_t> bytes =
          elements.ok() ? ByteSizeOf(first.dtype, *elements) : elements.status();
      if (!bytes.ok()) {
        return FileError(absl::StrCat("tensor ", first.name, ": ", bytes.status().message()));
      }
      total = *bytes;
    }

    v1::UploadTensorHeader* header = message_.mutable_tensor();
    header->set_name(first.name);
    header->set_dtype(std::string(DTypeName(first.dtype)));
    header->mutable_dims()->Assign(first.dims.begin(), first.dims.end());
    header->set_total_bytes(total);
    if (!Write()) return std::nullopt;

    // `first.data` holds the current chunk; the next one replaces it, so one chunk is held.
    int64_t sent = 0;
    while (true) {
      const int64_t size = static_cast<int64_t>(first.data.size());
      if (size > total - sent) {
        return FileError(absl::StrCat("tensor ", first.name, " (", Sv(DTypeName(first.dtype)),
                                      ", dims ", ShapeToString(first.dims),
                                      ") has more content than the ", total,
                                      " bytes its dims need"));
      }
      if (!WriteData(std::move(first.data), reader_->offset())) return std::nullopt;
      sent += size;
      if (first.dtype == DType::kStr) break;  // `next` is already the following tensor
      CKPT_ASSIGN_OR_RETURN(next, reader_->NextValue());
      if (!next || next->name != first.name) break;
      if (next->dtype != first.dtype || next->dims != first.dims) {
        return FileError(absl::StrCat(
            "tensor ", first.name, " has chunks of different dtype or dims (",
            Sv(DTypeName(first.dtype)), " ", ShapeToString(first.dims), " then ",
            Sv(DTypeName(next->dtype)), " ", ShapeToString(next->dims), ")"));
      }
      first.data = std::move(next->data);
      next.reset();
    }
    if (sent != total) {
      return FileError(absl::StrCat("tensor ", first.name, " (", Sv(DTypeName(first.dtype)),
                                    ", dims ", ShapeToString(first.dims), ") has ", sent,
                                    " bytes of content but its dims need ", total));
    }
    return next;
  }

  // Sends `bytes` in ≤ 1 MiB messages that reference it (no copy); `end_offset` is the file
  // offset just past the Value that holds them, from which progress is derived.
  bool WriteData(std::string bytes, int64_t end_offset) {
    const auto owner = std::make_shared<const std::string>(std::move(bytes));
    const std::string_view all = *owner;
    for (size_t pos = 0; pos < all.size();) {
      const size_t n = std::min(kDataMessageBytes, all.size() - pos);
      if (!Write({nullptr, owner, all.substr(pos, n)})) return false;
      pos += n;
      Report(end_offset - static_cast<int64_t>(all.size() - pos));
    }
    return true;
  }

  bool Write() { return Write({&message_, nullptr, {}}); }
  bool Write(const UploadWire& m) {
    if (!stream_->Write(m)) broken_ = true;
    return !broken_;
  }

  void Report(int64_t done) {
    if (progress_) progress_(std::clamp<int64_t>(done, 0, file_size_), file_size_);
  }

  // The reader's own errors already name the file (FileByteSource::Describe()); ours must too.
  absl::Status FileError(std::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", Sv(message)));
  }

  CkptReader* reader_;
  grpc::ClientWriter<UploadWire>* stream_;
  const std::string& path_;
  const int64_t file_size_;
  const ProgressFn& progress_;
  v1::UploadRequest message_;  // the current header
  bool broken_ = false;
};

// Checks the order and sizes of a Fetch stream and verifies every part checksum of each data
// message before handing its bytes to the visitor. Not thread-safe (one stream).
class FetchChecker {
 public:
  // `checkpoint` names the fetched checkpoint in checksum errors.
  FetchChecker(TensorVisitor* visitor, std::string checkpoint)
      : visitor_(visitor), checkpoint_(std::move(checkpoint)) {}

  absl::Status Consume(const FetchWire& message) {
    if (!message.is_data) return Consume(message.message);
    return OnData(message.data, message.data_bytes, message.part_bytes, message.part_checksums,
                  message.tile_box, message.band_rows);
  }

  absl::Status Consume(const v1::FetchResponse& message) {
    switch (message.kind_case()) {
      case v1::FetchResponse::kSummary:
        return OnSummary(message.summary());
      case v1::FetchResponse::kTensor:
        return OnTensor(message.tensor());
      case v1::FetchResponse::kData:
        return OnData(message.data());
      case v1::FetchResponse::KIND_NOT_SET:
        break;
    }
    // A newer server's message kind we cannot interpret: skipping it could silently drop data.
    return absl::InternalError("fetch stream holds a message of an unknown kind (client too old?)");
  }

  // After the server closed the stream successfully.
  absl::Status End() {
    if (!summary_) return absl::DataLossError("fetch stream ended before its plan summary");
    CKPT_RETURN_IF_ERROR(EndTensor("the end of the stream"));
    if (tensors_ != summary_->tensor_count() || bytes_ != summary_->total_bytes()) {
      return absl::DataLossError(absl::StrCat(
          "fetch stream ended after ", tensors_, " of ", summary_->tensor_count(), " tensors and ",
          bytes_, " of ", summary_->total_bytes(), " bytes"));
    }
    return absl::OkStatus();
  }

 private:
  struct Current {
    std::string name;
    int64_t total = 0;
    int64_t received = 0;
    // For tiles (FetchData.tile_box): the slice's dtype and shape, and the band being assembled.
    std::optional<DType> dtype;
    Shape local;
    std::unique_ptr<TileBand> band;
  };
  // The largest band of tiles the client assembles (the server's bands are about 1 MiB).
  static constexpr int64_t kMaxBandBytes = int64_t{256} << 20;

  absl::Status OnSummary(const v1::FetchPlanSummary& summary) {
    if (summary_) return absl::InternalError("fetch stream holds a second plan summary");
    if (summary.tensor_count() < 0 || summary.total_bytes() < 0) {
      return absl::InternalError(absl::StrCat("fetch plan summary announces ",
                                              summary.tensor_count(), " tensors and ",
                                              summary.total_bytes(), " bytes"));
    }
    summary_ = summary;
    return visitor_->OnSummary(summary);
  }

  absl::Status OnTensor(const v1::FetchTensorHeader& header) {
    if (!summary_) return absl::InternalError("fetch stream sent a tensor before its plan summary");
    CKPT_RETURN_IF_ERROR(EndTensor(absl::StrCat("the header of tensor ", header.name())));
    if (tensors_ >= summary_->tensor_count()) {
      return absl::DataLossError(absl::StrCat("fetch stream sent tensor ", header.name(),
                                              " beyond the plan's ", summary_->tensor_count(),
                                              " tensors"));
    }
    if (header.total_bytes() < 0) {
      return absl::InternalError(absl::StrCat("tensor ", header.name(), " announces ",
                                              header.total_bytes(), " bytes"));
    }
    ++tensors_;
    current_.emplace();
    current_->name = header.name();
    current_->total = header.total_bytes();
    if (auto dtype = ParseDType(header.dtype()); dtype.ok()) current_->dtype = *dtype;
    current_->local.assign(header.local_shape().begin(), header.local_shape().end());
    return visitor_->OnTensor(header);
  }

  absl::Status OnData(const v1::FetchData& data) {
    const std::vector<std::string_view> views = {data.data()};
    return OnData(views, data.data().size(),
                  absl::MakeConstSpan(data.part_bytes().data(), data.part_bytes_size()),
                  absl::MakeConstSpan(data.part_checksums().data(), data.part_checksums_size()),
                  absl::MakeConstSpan(data.tile_box().data(), data.tile_box_size()),
                  data.band_rows());
  }

  // A data message of `size` bytes, the concatenated `views`.
  absl::Status OnData(const std::vector<std::string_view>& views, uint64_t size,
                      absl::Span<const uint64_t> part_bytes,
                      absl::Span<const uint64_t> part_checksums,
                      absl::Span<const int64_t> tile_box, int64_t band_rows) {
    if (!current_) return absl::InternalError("fetch stream sent data outside a tensor");
    if (current_->band && tile_box.empty()) {
      return absl::DataLossError(absl::StrCat("tensor ", current_->name,
                                              ": row-major data inside a band of tiles"));
    }
    if (size > static_cast<uint64_t>(current_->total - current_->received)) {
      return absl::DataLossError(absl::StrCat("tensor ", current_->name, ": received more than its ",
                                              current_->total, " announced bytes"));
    }
    // Parts end to end, each with its own checksum (FetchData.part_bytes, part_checksums).
    if (part_bytes.empty() || part_bytes.size() != part_checksums.size()) {
      return absl::DataLossError(absl::StrCat(
          "tensor ", current_->name, ": a data message lists ", part_bytes.size(),
          " part sizes and ", part_checksums.size(),
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
    current_->received += static_cast<int64_t>(size);
    bytes_ += static_cast<int64_t>(size);
    for (std::string_view v : views) CKPT_RETURN_IF_ERROR(visitor_->OnData(v));
    return absl::OkStatus();
  }

  // Places a verified message of tiles (part i is tile i) into the current band, opening it at
  // the first row not yet delivered; hands the band on once its tiles cover it.
  absl::Status AddTiles(const std::vector<std::string_view>& views,
                        absl::Span<const uint64_t> part_bytes, absl::Span<const int64_t> tile_box,
                        int64_t band_rows) {
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
    if (!c.band) {
      Shape row(c.local.begin() + 1, c.local.end());
      auto row_elements = NumElements(row);
      auto row_bytes = row_elements.ok() ? ByteSizeOf(*c.dtype, *row_elements) : row_elements;
      if (!row_bytes.ok() || *row_bytes <= 0 || c.received % *row_bytes != 0) {
        return fail("tiles do not start at a whole row");
      }
      auto band = TileBand::Start(*c.dtype, c.local, c.received / *row_bytes, band_rows,
                                  kMaxBandBytes);
      if (!band.ok()) return fail(std::string(band.status().message()));
      c.band = std::move(*band);
    } else if (band_rows != c.band->box().extent(0)) {
      return fail(absl::StrCat("a band of ", c.band->box().extent(0), " rows continues as one of ",
                               band_rows));
    }
    ViewCursor cursor(views);  // the parts cover the views exactly (checked by OnData)
    for (size_t i = 0; i < part_bytes.size(); ++i) {
      Box tile;
      tile.lo.assign(tile_box.begin() + 2 * rank * i, tile_box.begin() + 2 * rank * i + rank);
      tile.hi.assign(tile_box.begin() + 2 * rank * i + rank, tile_box.begin() + 2 * rank * (i + 1));
      if (absl::Status s = c.band->Add(tile, cursor.Next(part_bytes[i])); !s.ok()) {
        return fail(std::string(s.message()));
      }
    }
    if (!c.band->complete()) return absl::OkStatus();
    const std::string_view band = c.band->bytes();
    c.received += static_cast<int64_t>(band.size());
    bytes_ += static_cast<int64_t>(band.size());
    CKPT_RETURN_IF_ERROR(visitor_->OnData(band));
    c.band.reset();
    return absl::OkStatus();
  }

  // Checks `actual`, the checksum of the `size` bytes at `offset` in the current data message.
  absl::Status Verify(uint64_t actual, uint64_t offset, uint64_t size, uint64_t expected) const {
    if (actual == expected) return absl::OkStatus();
    const int64_t begin = current_->received + static_cast<int64_t>(offset);
    // Whole stored chunks are checked only here (the server sends their stored checksum without
    // hashing them), so a mismatch may be corruption in the store as well as in transit.
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", checkpoint_, " tensor ", current_->name, ": bytes [", begin, ", ",
        begin + static_cast<int64_t>(size), ") failed their ", kChecksumName,
        " checksum (received ",
        absl::Hex(actual), ", expected ", absl::Hex(expected),
        "): corrupted in the server's store or in transit"));
  }

  // Closes the open tensor (if any) at `where`, checking it got all its bytes.
  absl::Status EndTensor(std::string_view where) {
    if (!current_) return absl::OkStatus();
    if (current_->band) {
      return absl::DataLossError(absl::StrCat("tensor ", current_->name, ": a band of tiles ",
                                              current_->band->box().ToString(),
                                              " was incomplete before ", Sv(where)));
    }
    if (current_->received != current_->total) {
      return absl::DataLossError(absl::StrCat("tensor ", current_->name, ": received ",
                                              current_->received, " of ", current_->total,
                                              " bytes before ", Sv(where)));
    }
    current_.reset();
    return visitor_->OnTensorEnd();
  }

  TensorVisitor* visitor_;
  const std::string checkpoint_;
  std::optional<v1::FetchPlanSummary> summary_;
  std::optional<Current> current_;
  int64_t tensors_ = 0;
  int64_t bytes_ = 0;
};

// Collects a whole fetch in memory. Not thread-safe.
class CollectingVisitor final : public TensorVisitor {
 public:
  absl::Status OnSummary(const v1::FetchPlanSummary& summary) override {
    summary_ = summary;
    return absl::OkStatus();
  }
  absl::Status OnTensor(const v1::FetchTensorHeader& header) override {
    tensors_.push_back({header, {}});
    tensors_.back().data.reserve(static_cast<size_t>(header.total_bytes()));
    return absl::OkStatus();
  }
  absl::Status OnData(std::string_view data) override {
    tensors_.back().data.append(data);
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override { return absl::OkStatus(); }

  v1::FetchPlanSummary& summary() { return summary_; }
  std::vector<FetchedTensor>& tensors() { return tensors_; }

 private:
  v1::FetchPlanSummary summary_;
  std::vector<FetchedTensor> tensors_;
};

// Writes a fetch as a MindSpore .ckpt through a CkptWriter, never holding a whole tensor. Not
// thread-safe; `sink` must outlive it.
class CkptFileVisitor final : public TensorVisitor {
 public:
  CkptFileVisitor(ByteSink* sink, const ProgressFn* progress)
      : writer_(sink), progress_(progress) {}

  absl::Status OnSummary(const v1::FetchPlanSummary& summary) override {
    summary_ = summary;
    Report();
    return absl::OkStatus();
  }
  absl::Status OnTensor(const v1::FetchTensorHeader& header) override {
    absl::StatusOr<DType> dtype = ParseDType(header.dtype());
    if (!dtype.ok()) {
      return absl::InternalError(
          absl::StrCat("tensor ", header.name(), " from the server: ", dtype.status().message()));
    }
    // MindSpore stores scalars with empty dims and str values with dims [0] (spec §1.4).
    std::vector<int64_t> dims(header.local_shape().begin(), header.local_shape().end());
    if (*dtype == DType::kStr) dims = {0};
    return writer_.BeginTensor(header.name(), *dtype, dims, header.total_bytes());
  }
  absl::Status OnData(std::string_view data) override {
    CKPT_RETURN_IF_ERROR(writer_.Append(data));
    done_ += static_cast<int64_t>(data.size());
    Report();
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override { return absl::OkStatus(); }

  absl::Status Finish() { return writer_.Finish(); }
  const v1::FetchPlanSummary& summary() const { return summary_; }

 private:
  void Report() {
    if (*progress_) (*progress_)(done_, summary_.total_bytes());
  }

  CkptWriter writer_;
  const ProgressFn* progress_;
  v1::FetchPlanSummary summary_;
  int64_t done_ = 0;
};

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// Streams of one UploadDirectory: the first failure cancels every registered stream and keeps
// new ones from starting. Thread-safe.
class CkptClient::CancelGroup {
 public:
  // False when the group is already cancelled: the caller must not start its stream.
  bool Add(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return false;
    active_.insert(context);
    return true;
  }
  // Must be called before `context` is destroyed.
  void Remove(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    active_.erase(context);
  }
  void CancelAll() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    // TryCancel only flags the call; it never blocks, so holding mu_ is fine.
    for (grpc::ClientContext* context : active_) context->TryCancel();
  }

  // Registers `context` in `group` (may be null: then always joined) for its own lifetime, which
  // must end before `context` is destroyed.
  class Membership {
   public:
    Membership(CancelGroup* group, grpc::ClientContext* context)
        : group_(group), context_(context), joined_(group == nullptr || group->Add(context)) {}
    ~Membership() {
      if (group_ != nullptr && joined_) group_->Remove(context_);
    }
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

    // False when the group was already cancelled: the call must not start.
    bool joined() const { return joined_; }

   private:
    CancelGroup* const group_;
    grpc::ClientContext* const context_;
    const bool joined_;
  };

 private:
  std::mutex mu_;
  bool cancelled_ = false;
  std::set<grpc::ClientContext*> active_;
};

CkptClient::CkptClient(std::string address, ClientOptions options,
                       std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      options_(options),
      channel_(std::move(channel)),
      stub_(v1::CheckpointService::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<CkptClient>> CkptClient::Connect(const std::string& address,
                                                                ClientOptions options) {
  if (address.empty()) return absl::InvalidArgumentError("empty server address");
  if (options.unary_timeout <= absl::ZeroDuration() ||
      options.stream_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("client timeouts must be positive");
  }
  if (options.max_receive_message_bytes <= 0) {
    return absl::InvalidArgumentError("max_receive_message_bytes must be positive");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", address));
  }
  if (options.connect_timeout > absl::ZeroDuration() &&
      !channel->WaitForConnected(DeadlineAfter(options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("ckptd at ", address, " is not reachable within ",
                                               absl::FormatDuration(options.connect_timeout)));
  }
  return std::unique_ptr<CkptClient>(new CkptClient(address, options, std::move(channel)));
}

absl::Status CkptClient::Annotate(absl::Status status) const {
  // These two mean the server never answered; the address is then the useful context. Other
  // codes carry the server's own message, which already names what failed.
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    return WithPrefix(status, absl::StrCat("ckptd at ", address_, ": "));
  }
  // gRPC's own answer for a method the server does not have carries no message.
  if (status.code() == absl::StatusCode::kUnimplemented && status.message().empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "ckptd at ", address_, " does not support this call (is it older than this ckptctl?)"));
  }
  return status;
}

void CkptClient::SetStreamDeadline(grpc::ClientContext* context) const {
  if (options_.stream_timeout != absl::InfiniteDuration()) {
    context->set_deadline(DeadlineAfter(options_.stream_timeout));
  }
}

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> CkptClient::Unary(Method method, const Request& request) {
  grpc::ClientContext context;
  if (options_.unary_timeout != absl::InfiniteDuration()) {
    context.set_deadline(DeadlineAfter(options_.unary_timeout));
  }
  Response response;
  const grpc::Status status = (stub_.get()->*method)(&context, request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status));
  return response;
}

// ---------------------------------------------------------------- strategies

absl::StatusOr<v1::StrategyInfo> CkptClient::PutStrategy(const std::string& name,
                                                         const Strategy& strategy,
                                                         bool overwrite) {
  v1::PutStrategyRequest request;
  request.set_name(name);
  // JSON rather than binary: it keeps tensor_shape, which the server uses to validate uploads.
  request.set_content(SerializeStrategy(strategy, StrategyFormat::kJson));
  request.set_format(v1::STRATEGY_FORMAT_JSON);
  request.set_overwrite(overwrite);
  CKPT_ASSIGN_OR_RETURN(v1::PutStrategyResponse response,
                        (Unary<v1::PutStrategyRequest, v1::PutStrategyResponse>(
                            &v1::CheckpointService::Stub::PutStrategy, request)));
  return response.info();
}

absl::StatusOr<v1::StrategyInfo> CkptClient::PutStrategyFile(const std::string& name,
                                                             const std::string& path,
                                                             bool overwrite) {
  CKPT_ASSIGN_OR_RETURN(Strategy strategy, LoadStrategyPath(path));
  return PutStrategy(name, strategy, overwrite);
}

absl::StatusOr<RemoteStrategy> CkptClient::GetStrategy(const std::string& name) {
  v1::GetStrategyRequest request;
  request.set_name(name);
  request.set_format(v1::STRATEGY_FORMAT_JSON);
  CKPT_ASSIGN_OR_RETURN(v1::GetStrategyResponse response,
                        (Unary<v1::GetStrategyRequest, v1::GetStrategyResponse>(
                            &v1::CheckpointService::Stub::GetStrategy, request)));
  absl::StatusOr<Strategy> strategy = ParseStrategy(response.content(), StrategyFormat::kJson);
  if (!strategy.ok()) {
    return WithPrefix(strategy.status(), absl::StrCat("strategy ", name, " from the server: "));
  }
  return RemoteStrategy{response.info(), *std::move(strategy)};
}

absl::StatusOr<std::vector<v1::StrategyInfo>> CkptClient::ListStrategies() {
  CKPT_ASSIGN_OR_RETURN(v1::ListStrategiesResponse response,
                        (Unary<v1::ListStrategiesRequest, v1::ListStrategiesResponse>(
                            &v1::CheckpointService::Stub::ListStrategies, {})));
  return std::vector<v1::StrategyInfo>(response.strategies().begin(),
                                       response.strategies().end());
}

absl::Status CkptClient::DeleteStrategy(const std::string& name) {
  v1::DeleteStrategyRequest request;
  request.set_name(name);
  return Unary<v1::DeleteStrategyRequest, v1::DeleteStrategyResponse>(
             &v1::CheckpointService::Stub::DeleteStrategy, request)
      .status();
}

// ---------------------------------------------------------------- uploads

absl::StatusOr<v1::UploadResponse> CkptClient::UploadRank(const std::string& checkpoint_id,
                                                          const std::string& source_strategy,
                                                          int64_t rank,
                                                          const std::string& file_path,
                                                          ProgressFn progress) {
  return UploadRankImpl(checkpoint_id, source_strategy, rank, file_path, progress, nullptr);
}

absl::StatusOr<v1::UploadResponse> CkptClient::UploadWholeFile(const std::string& checkpoint_id,
                                                               const std::string& path,
                                                               ProgressFn progress) {
  return UploadRankImpl(checkpoint_id, "", 0, path, progress, nullptr);
}

absl::StatusOr<v1::UploadResponse> CkptClient::UploadRankImpl(
    const std::string& checkpoint_id, const std::string& source_strategy, int64_t rank,
    const std::string& file_path, const ProgressFn& progress, CancelGroup* group) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<FileByteSource> source, FileByteSource::Open(file_path));
  const int64_t file_size = std::max<int64_t>(source->size(), 0);
  CkptReader reader(source.get());

  grpc::ClientContext context;
  SetStreamDeadline(&context);
  // Leaves the group before `context` dies, whichever way this function returns.
  CancelGroup::Membership membership(group, &context);
  if (!membership.joined()) {
    return absl::CancelledError(
        absl::StrCat("upload of rank ", rank, " not started: another rank failed"));
  }

  v1::UploadResponse response;
  // The generated stub's Upload, but sending UploadWire (see its SerializationTraits).
  static const grpc::internal::RpcMethod kUpload("/ckpt.v1.CheckpointService/Upload",
                                                 grpc::internal::RpcMethod::CLIENT_STREAMING);
  std::unique_ptr<grpc::ClientWriter<UploadWire>> stream(
      grpc::internal::ClientWriterFactory<UploadWire>::Create(channel_.get(), kUpload, &context,
                                                              &response));

  v1::UploadHeader header;
  header.set_checkpoint_id(checkpoint_id);
  header.set_source_strategy(source_strategy);
  header.set_rank(rank);
  header.set_source_file(SourceFileLabel(file_path));
  RankFileSender sender(&reader, stream.get(), file_path, file_size, progress);
  const absl::Status local = sender.Send(header);
  if (!local.ok()) {
    // The server drops a rank whose stream is cancelled, so nothing half-sent becomes visible.
    context.TryCancel();
    stream->Finish().ok();  // the call's status is CANCELLED; the local error is the news
    return local;
  }
  if (!sender.broken()) stream->WritesDone();
  const grpc::Status status = stream->Finish();
  if (!status.ok()) return Annotate(FromGrpcStatus(status));
  if (sender.broken()) {
    return absl::InternalError(absl::StrCat("ckptd closed the upload of ", file_path,
                                            " early without an error"));
  }
  if (progress) progress(file_size, file_size);
  return response;
}

absl::StatusOr<UploadSummary> CkptClient::UploadDirectory(const std::string& checkpoint_id,
                                                          const std::string& source_strategy,
                                                          const std::string& dir,
                                                          UploadDirectoryOptions options,
                                                          ProgressFn progress) {
  if (options.parallelism < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload parallelism must be at least 1, got ", options.parallelism));
  }
  if (source_strategy.empty()) {
    return absl::InvalidArgumentError("uploading a rank directory needs a source strategy name");
  }
  CKPT_ASSIGN_OR_RETURN(const int64_t world, StrategyWorldSize(source_strategy));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> files, ResolveRankFiles(dir, world));

  UploadSummary summary;
  summary.checkpoint_id = checkpoint_id;
  summary.ranks.resize(files.size());
  for (size_t r = 0; r < files.size(); ++r) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(files[r], ec);
    summary.ranks[r].rank = static_cast<int64_t>(r);
    summary.ranks[r].file = files[r];
    summary.ranks[r].file_bytes = ec ? 0 : static_cast<int64_t>(size);
    summary.file_bytes += summary.ranks[r].file_bytes;
  }

  CancelGroup group;
  std::mutex mu;
  absl::Status first_error;  // guarded by mu
  std::atomic<size_t> next_rank{0};
  std::atomic<int64_t> done_bytes{0};
  const int64_t total_bytes = summary.file_bytes;

  auto worker = [&]() {
    while (true) {
      const size_t r = next_rank.fetch_add(1);
      if (r >= files.size()) return;
      // Each rank reports its own file offset; the sum over ranks is what the caller sees.
      ProgressFn rank_progress;
      if (progress) {
        rank_progress = [&, reported = int64_t{0}](int64_t done, int64_t) mutable {
          const int64_t sum = done_bytes.fetch_add(done - reported) + (done - reported);
          reported = done;
          progress(sum, total_bytes);
        };
      }
      absl::StatusOr<v1::UploadResponse> response =
          UploadRankImpl(checkpoint_id, source_strategy, static_cast<int64_t>(r), files[r],
                         rank_progress, &group);
      if (!response.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu);
          // Ranks cancelled because of this failure report CANCELLED; keep the cause.
          if (first_error.ok()) first_error = response.status();
        }
        group.CancelAll();
        return;
      }
      summary.ranks[r].response = *std::move(response);
    }
  };
  const size_t thread_count =
      std::min(files.size(), static_cast<size_t>(options.parallelism));
  std::vector<std::thread> threads;
  threads.reserve(thread_count);
  for (size_t i = 0; i < thread_count; ++i) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error;

  summary.ranks_total = world;
  for (const RankUploadResult& result : summary.ranks) {
    const v1::UploadResponse& response = result.response;
    summary.committed = summary.committed || response.committed();
    summary.ranks_received = std::max(summary.ranks_received, response.ranks_received());
    if (response.ranks_total() > 0) summary.ranks_total = response.ranks_total();
    summary.bytes_stored += response.bytes_stored();
  }
  return summary;
}

// ---------------------------------------------------------------- fetch

absl::Status CkptClient::Fetch(const v1::FetchRequest& request, TensorVisitor& visitor) {
  return FetchImpl(request, visitor, nullptr);
}

absl::Status CkptClient::FetchImpl(const v1::FetchRequest& request, TensorVisitor& visitor,
                                   CancelGroup* group) {
  grpc::ClientContext context;
  SetStreamDeadline(&context);
  CancelGroup::Membership membership(group, &context);
  if (!membership.joined()) {
    return absl::CancelledError(absl::StrCat("fetch of rank ", request.rank(), " of ",
                                             request.checkpoint_id(),
                                             " not started: another rank failed"));
  }
  // As the generated stub's Fetch, but data messages are read in place (client/fetch_wire.h).
  static const grpc::internal::RpcMethod kFetch("/ckpt.v1.CheckpointService/Fetch",
                                                grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<FetchWire>> stream(
      grpc::internal::ClientReaderFactory<FetchWire>::Create(channel_.get(), kFetch, &context,
                                                             request));
  FetchChecker checker(&visitor, request.checkpoint_id());
  FetchWire message;
  absl::Status local;
  while (stream->Read(&message)) {
    local = checker.Consume(message);
    if (!local.ok()) break;
  }
  if (!local.ok()) {
    // Stop the server producing bytes nobody reads; drain what is already in flight so that
    // Finish() can complete.
    context.TryCancel();
    while (stream->Read(&message)) {
    }
    stream->Finish().ok();  // CANCELLED; the local error is the news
    return local;
  }
  CKPT_RETURN_IF_ERROR(Annotate(FromGrpcStatus(stream->Finish())));
  return checker.End();
}

absl::StatusOr<std::vector<FetchedTensor>> CkptClient::FetchAll(const v1::FetchRequest& request,
                                                                v1::FetchPlanSummary* summary) {
  CollectingVisitor visitor;
  CKPT_RETURN_IF_ERROR(Fetch(request, visitor));
  if (summary != nullptr) *summary = std::move(visitor.summary());
  return std::move(visitor.tensors());
}

absl::StatusOr<v1::FetchPlanSummary> CkptClient::FetchToFile(const v1::FetchRequest& request,
                                                             const std::string& path,
                                                             ProgressFn progress) {
  return FetchToFileImpl(request, path, progress, nullptr);
}

absl::StatusOr<v1::FetchPlanSummary> CkptClient::FetchToFileImpl(const v1::FetchRequest& request,
                                                                 const std::string& path,
                                                                 const ProgressFn& progress,
                                                                 CancelGroup* group) {
  // The sink writes a temporary file and publishes it only on Commit(); returning early destroys
  // it, which removes the temporary, so a failed fetch leaves no file behind.
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileSink> sink, AtomicFileSink::Create(path));
  CkptFileVisitor visitor(sink.get(), &progress);
  CKPT_RETURN_IF_ERROR(FetchImpl(request, visitor, group));
  CKPT_RETURN_IF_ERROR(visitor.Finish());
  CKPT_RETURN_IF_ERROR(sink->Commit());
  return visitor.summary();
}

// ---------------------------------------------------------------- checkpoints

absl::StatusOr<std::vector<v1::CheckpointInfo>> CkptClient::ListCheckpoints() {
  CKPT_ASSIGN_OR_RETURN(v1::ListCheckpointsResponse response,
                        (Unary<v1::ListCheckpointsRequest, v1::ListCheckpointsResponse>(
                            &v1::CheckpointService::Stub::ListCheckpoints, {})));
  return std::vector<v1::CheckpointInfo>(response.checkpoints().begin(),
                                         response.checkpoints().end());
}

absl::StatusOr<v1::DescribeCheckpointResponse> CkptClient::DescribeCheckpoint(
    const std::string& checkpoint_id) {
  v1::DescribeCheckpointRequest request;
  request.set_checkpoint_id(checkpoint_id);
  return Unary<v1::DescribeCheckpointRequest, v1::DescribeCheckpointResponse>(
      &v1::CheckpointService::Stub::DescribeCheckpoint, request);
}

absl::Status CkptClient::DeleteCheckpoint(const std::string& checkpoint_id) {
  v1::DeleteCheckpointRequest request;
  request.set_checkpoint_id(checkpoint_id);
  return Unary<v1::DeleteCheckpointRequest, v1::DeleteCheckpointResponse>(
             &v1::CheckpointService::Stub::DeleteCheckpoint, request)
      .status();
}

absl::StatusOr<v1::RankDependenciesResponse> CkptClient::RankDependencies(
    const v1::RankDependenciesRequest& request) {
  return Unary<v1::RankDependenciesRequest, v1::RankDependenciesResponse>(
      &v1::CheckpointService::Stub::RankDependencies, request);
}

absl::StatusOr<int64_t> CkptClient::StrategyWorldSize(const std::string& strategy_name) {
  // The info comes with any format; binary is the cheapest for the server to encode.
  v1::GetStrategyRequest request;
  request.set_name(strategy_name);
  request.set_format(v1::STRATEGY_FORMAT_BINARY);
  CKPT_ASSIGN_OR_RETURN(v1::GetStrategyResponse response,
                        (Unary<v1::GetStrategyRequest, v1::GetStrategyResponse>(
                            &v1::CheckpointService::Stub::GetStrategy, request)));
  if (response.info().world_size() < 1) {
    return absl::InternalError(absl::StrCat("ckptd reports a world of ",
                                            response.info().world_size(), " ranks for strategy ",
                                            strategy_name));
  }
  return response.info().world_size();
}

// ---------------------------------------------------------------- jobs

bool IsTerminalJobState(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string JobStateName(v1::JobState state) {
  constexpr std::string_view kPrefix = "JOB_STATE_";
  if (!v1::JobState_IsValid(state)) return absl::StrCat("STATE_", static_cast<int>(state));
  const std::string& name = v1::JobState_Name(state);
  return name.starts_with(kPrefix) ? name.substr(kPrefix.size()) : name;
}

absl::StatusOr<v1::SubmitTransformResponse> CkptClient::SubmitTransform(
    const v1::SubmitTransformRequest& request) {
  return Unary<v1::SubmitTransformRequest, v1::SubmitTransformResponse>(
      &v1::CheckpointService::Stub::SubmitTransform, request);
}

absl::StatusOr<v1::Job> CkptClient::GetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::GetJobRequest, v1::Job>(&v1::CheckpointService::Stub::GetJob, request);
}

absl::StatusOr<v1::Job> CkptClient::CancelJob(const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::CancelJobRequest, v1::Job>(&v1::CheckpointService::Stub::CancelJob, request);
}

absl::StatusOr<std::vector<v1::Job>> CkptClient::ListJobs() {
  CKPT_ASSIGN_OR_RETURN(v1::ListJobsResponse response,
                        (Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
                            &v1::CheckpointService::Stub::ListJobs, {})));
  return std::vector<v1::Job>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<v1::Job> CkptClient::WatchJob(const std::string& job_id,
                                             std::function<void(const v1::Job&)> on_update) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  // A job legitimately runs for hours: the stream deadline (none by default) applies.
  SetStreamDeadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::Job>> stream = stub_->WatchJob(&context, request);
  std::optional<v1::Job> last;
  v1::Job job;
  while (stream->Read(&job)) {
    if (on_update) on_update(job);
    last = job;
  }
  const absl::Status status = FromGrpcStatus(stream->Finish());
  if (!status.ok()) {
    return WithPrefix(Annotate(status), absl::StrCat("watching job ", job_id, ": "));
  }
  if (!last.has_value()) {
    return absl::InternalError(
        absl::StrCat("ckptd ended the watch of job ", job_id, " without sending its state"));
  }
  if (!IsTerminalJobState(last->state())) {
    // A server that stops streaming early (e.g. shutting down) should fail the call; be safe.
    return absl::UnavailableError(absl::StrCat(
        "ckptd ended the watch of job ", job_id, " while it was ", JobStateName(last->state()),
        "; the job continues on the server"));
  }
  return *std::move(last);
}

// ---------------------------------------------------------------- export

absl::Status ValidateExportPrefix(std::string_view prefix) {
  const bool valid_chars = std::all_of(prefix.begin(), prefix.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
  if (prefix.empty() || prefix.size() > 200 || !valid_chars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid file name prefix \"", Sv(prefix),
        "\": use 1-200 characters of A-Z a-z 0-9 . _ - (default ", kDefaultExportPrefix, ")"));
  }
  return absl::OkStatus();
}

namespace {

// Creates `parent`/`stem`<random> with mode 0777 minus the umask (mkdtemp's 0700 would be kept
// by the final rename and surprise users sharing the export).
absl::StatusOr<std::string> MakeUniqueDirectory(const fs::path& parent, const std::string& stem) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device random;
  std::string path;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix(8, ' ');
    for (char& c : suffix) c = kAlphabet[random() % (sizeof(kAlphabet) - 1)];
    path = (parent / (stem + suffix)).string();
    if (::mkdir(path.c_str(), 0777) == 0) return path;
    if (errno != EEXIST) return ErrnoToStatus(errno, "create directory", path);
  }
  return absl::AlreadyExistsError(absl::StrCat("cannot create a unique directory like ", path));
}

// A directory that is removed with everything in it when the guard dies, unless released.
class TempDirGuard {
 public:
  explicit TempDirGuard(std::string path) : path_(std::move(path)) {}
  ~TempDirGuard() {
    if (path_.empty()) return;
    std::error_code ec;
    fs::remove_all(path_, ec);  // best effort: the export already failed
  }
  TempDirGuard(const TempDirGuard&) = delete;
  TempDirGuard& operator=(const TempDirGuard&) = delete;

  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

// Sums the progress of several rank fetches. The total is exact once every rank has reported its
// plan; before that it is extrapolated from the plans known so far (ranks of one strategy are
// usually of similar size), so that a rate and ETA can be shown from the start. Thread-safe.
class ExportProgress {
 public:
  ExportProgress(size_t rank_count, ProgressFn progress)
      : ranks_(rank_count), progress_(std::move(progress)) {}

  ProgressFn ForRank(size_t index) {
    if (!progress_) return nullptr;
    return [this, index](int64_t done, int64_t total) { Update(index, done, total); };
  }

 private:
  struct Rank {
    bool planned = false;
    int64_t done = 0;
    int64_t total = 0;
  };

  void Update(size_t index, int64_t done, int64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    Rank& rank = ranks_[index];
    done_ += done - rank.done;
    rank.done = done;
    if (!rank.planned) {
      rank.planned = true;
      ++planned_;
      known_total_ += total;
    }
    int64_t estimate = known_total_;
    if (planned_ < ranks_.size()) {
      estimate = static_cast<int64_t>(static_cast<double>(known_total_) *
                                      static_cast<double>(ranks_.size()) /
                                      static_cast<double>(planned_));
    }
    // Called under mu_ so that the caller sees monotonic sums.
    progress_(done_, std::max(estimate, done_));
  }

  std::mutex mu_;
  std::vector<Rank> ranks_;  // guarded by mu_
  size_t planned_ = 0;       // guarded by mu_
  int64_t known_total_ = 0;  // guarded by mu_
  int64_t done_ = 0;         // guarded by mu_
  const ProgressFn progress_;
};

}  // namespace

absl::StatusOr<ExportSummary> CkptClient::ExportRanks(const std::string& checkpoint_id,
                                                      const std::string& destination_strategy,
                                                      const std::string& dir,
                                                      const std::vector<int64_t>& ranks,
                                                      const std::string& prefix, int parallelism,
                                                      ProgressFn progress) {
  if (parallelism < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("export parallelism must be at least 1, got ", parallelism));
  }
  if (destination_strategy.empty()) {
    return absl::InvalidArgumentError("export needs a destination strategy name");
  }
  CKPT_RETURN_IF_ERROR(ValidateExportPrefix(prefix));
  // "out/" names the directory "out": drop trailing separators before taking the name apart.
  std::string target_str = dir;
  while (target_str.size() > 1 && target_str.back() == '/') target_str.pop_back();
  const fs::path target(target_str);
  const std::string name = target.filename().string();
  if (target_str.empty() || name.empty() || name == "." || name == ".." || target_str == "/") {
    return absl::InvalidArgumentError(absl::StrCat(
        "export directory \"", dir, "\" does not name a new directory (e.g. ./export)"));
  }
  std::error_code ec;
  const fs::file_status target_status = fs::symlink_status(target, ec);
  if (fs::exists(target_status)) {
    if (!fs::is_directory(target_status)) {
      return absl::AlreadyExistsError(
          absl::StrCat(target_str, " exists and is not a directory; export writes a new one"));
    }
    if (!fs::is_empty(target, ec) || ec) {
      return absl::AlreadyExistsError(absl::StrCat(
          target_str, " exists and is not empty; export writes a new or empty directory"));
    }
  }

  CKPT_ASSIGN_OR_RETURN(const int64_t world, StrategyWorldSize(destination_strategy));
  std::vector<int64_t> selected = ranks;
  if (selected.empty()) {
    selected.resize(static_cast<size_t>(world));
    for (int64_t r = 0; r < world; ++r) selected[static_cast<size_t>(r)] = r;
  }
  std::sort(selected.begin(), selected.end());
  if (std::adjacent_find(selected.begin(), selected.end()) != selected.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", *std::adjacent_find(selected.begin(), selected.end()),
        " is listed more than once"));
  }
  for (int64_t r : selected) {
    if (r < 0 || r >= world) {
      return absl::OutOfRangeError(absl::StrCat("destination rank ", r,
                                                " is outside the world of strategy ",
                                                destination_strategy,
                                                " (", world, " ranks)"));
    }
  }

  // The temporary sibling lives on the same file system, so the final rename is atomic.
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  if (ec) return ErrnoToStatus(ec.value(), "create directory", parent.string());
  CKPT_ASSIGN_OR_RETURN(std::string temp_path,
                        MakeUniqueDirectory(parent, absl::StrCat(".", name, ".ckptctl-export-")));
  TempDirGuard temp(std::move(temp_path));

  ExportSummary summary;
  summary.dir = target_str;
  summary.ranks.resize(selected.size());
  for (size_t i = 0; i < selected.size(); ++i) {
    const std::string rank_dir = absl::StrCat("rank_", selected[i]);
    const std::string file = absl::StrCat(prefix, selected[i], ".ckpt");
    summary.ranks[i].rank = selected[i];
    summary.ranks[i].file = (target / rank_dir / file).string();
    fs::create_directory(fs::path(temp.path()) / rank_dir, ec);
    if (ec) return ErrnoToStatus(ec.value(), "create directory", temp.path() + "/" + rank_dir);
  }

  CancelGroup group;
  ExportProgress export_progress(selected.size(), std::move(progress));
  std::mutex mu;
  absl::Status first_error;  // guarded by mu
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    while (true) {
      const size_t i = next.fetch_add(1);
      if (i >= selected.size()) return;
      v1::FetchRequest request;
      request.set_checkpoint_id(checkpoint_id);
      request.set_destination_strategy(destination_strategy);
      request.set_rank(selected[i]);
      const std::string path =
          (fs::path(temp.path()) / absl::StrCat("rank_", selected[i]) /
           absl::StrCat(prefix, selected[i], ".ckpt"))
              .string();
      absl::StatusOr<v1::FetchPlanSummary> fetched =
          FetchToFileImpl(request, path, export_progress.ForRank(i), &group);
      if (!fetched.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu);
          // Ranks cancelled because of this failure report CANCELLED; keep the cause.
          if (first_error.ok()) {
            first_error = WithPrefix(fetched.status(),
                                     absl::StrCat("export of rank ", selected[i], ": "));
          }
        }
        group.CancelAll();
        return;
      }
      summary.ranks[i].summary = *std::move(fetched);
    }
  };
  const size_t thread_count = std::min(selected.size(), static_cast<size_t>(parallelism));
  std::vector<std::thread> threads;
  threads.reserve(thread_count);
  for (size_t i = 0; i < thread_count; ++i) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error;

  // Every rank file is already synced (FetchToFile); make their directory entries durable, then
  // present the whole directory at once. rename(2) replaces an empty directory and fails on a
  // non-empty one, so a directory filled by someone else meanwhile is never merged into.
  for (const RankExportResult& r : summary.ranks) {
    CKPT_RETURN_IF_ERROR(
        SyncDirectory((fs::path(temp.path()) / absl::StrCat("rank_", r.rank)).string()));
  }
  CKPT_RETURN_IF_ERROR(SyncDirectory(temp.path()));
  if (::rename(temp.path().c_str(), target_str.c_str()) != 0) {
    const int error = errno;
    if (error == ENOTEMPTY || error == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat(target_str, " was filled by someone else during the export; nothing "
                                   "was written to it"));
    }
    return ErrnoToStatus(error, "rename", temp.path() + " to " + target_str);
  }
  temp.Release();
  CKPT_RETURN_IF_ERROR(SyncDirectory(parent.string()));

  for (const RankExportResult& r : summary.ranks) {
    summary.tensors += r.summary.tensor_count();
    summary.bytes += r.summary.total_bytes();
  }
  return summary;
}

// ---------------------------------------------------------------- rank directory helpers

std::optional<std::pair<int64_t, int64_t>> ParseEpochStep(std::string_view file_name) {
  constexpr std::string_view kSuffix = ".ckpt";
  if (!file_name.ends_with(kSuffix)) return std::nullopt;
  const std::string_view stem = file_name.substr(0, file_name.size() - kSuffix.size());
  const size_t dash = stem.rfind('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const std::string_view numbers = stem.substr(dash + 1);
  const size_t underscore = numbers.find('_');
  if (underscore == std::string_view::npos) return std::nullopt;
  const std::optional<int64_t> epoch = ParseDecimal(numbers.substr(0, underscore));
  const std::optional<int64_t> step = ParseDecimal(numbers.substr(underscore + 1));
  if (!epoch || !step) return std::nullopt;
  return std::make_pair(*epoch, *step);
}

absl::StatusOr<std::string> SelectRankCheckpointFile(const std::string& rank_dir) {
  struct Candidate {
    std::string name;
    fs::path path;
    std::optional<std::pair<int64_t, int64_t>> epoch_step;
    fs::file_time_type mtime;
  };
  std::vector<Candidate> candidates;
  std::error_code ec;
  fs::directory_iterator it(rank_dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.size() <= 5 || !name.ends_with(".ckpt")) continue;
    std::error_code entry_ec;
    if (!it->is_regular_file(entry_ec)) continue;
    const fs::file_time_type mtime = it->last_write_time(entry_ec);
    if (entry_ec) {
      return absl::NotFoundError(
          absl::StrCat("cannot stat ", it->path().string(), ": ", entry_ec.message()));
    }
    std::optional<std::pair<int64_t, int64_t>> epoch_step = ParseEpochStep(name);
    candidates.push_back({std::move(name), it->path(), epoch_step, mtime});
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", rank_dir, ": ", ec.message()));
  if (candidates.empty()) {
    return absl::NotFoundError(absl::StrCat(rank_dir, " holds no .ckpt file"));
  }
  // Epoch/step numbers are only comparable when every name has them; a stray "final.ckpt" makes
  // the modification time the only meaningful order.
  const bool numbered = std::all_of(candidates.begin(), candidates.end(),
                                    [](const Candidate& c) { return c.epoch_step.has_value(); });
  auto older = [numbered](const Candidate& a, const Candidate& b) {
    if (numbered && a.epoch_step != b.epoch_step) return a.epoch_step < b.epoch_step;
    if (a.mtime != b.mtime) return a.mtime < b.mtime;
    return a.name < b.name;
  };
  return std::max_element(candidates.begin(), candidates.end(), older)->path.string();
}

absl::StatusOr<std::vector<std::string>> ResolveRankFiles(const std::string& dir,
                                                          int64_t world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size must be positive, got ", world_size));
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  }
  std::map<int64_t, std::string> found;
  std::vector<int64_t> beyond;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("rank_")) continue;
    const std::string_view digits = std::string_view(name).substr(5);
    if (digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;  // rank_backup and the like are not rank directories (MindSpore: rank_[0-9]*)
    }
    std::error_code entry_ec;
    if (!it->is_directory(entry_ec)) continue;
    const std::optional<int64_t> rank = ParseDecimal(digits);
    if (!rank || absl::StrCat("rank_", *rank) != name) {
      // rank_01 next to rank_1 would be ambiguous; MindSpore writes no leading zeros.
      return absl::InvalidArgumentError(absl::StrCat(
          it->path().string(), ": rank directories are named rank_<r> without leading zeros"));
    }
    if (*rank >= world_size) {
      beyond.push_back(*rank);
    } else {
      found[*rank] = it->path().string();
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));

  std::vector<int64_t> missing;
  for (int64_t r = 0; r < world_size; ++r) {
    if (!found.contains(r)) missing.push_back(r);
  }
  if (!missing.empty() || !beyond.empty()) {
    std::sort(beyond.begin(), beyond.end());
    std::string problems;
    if (!missing.empty()) absl::StrAppend(&problems, "missing ", RankList(missing));
    if (!beyond.empty()) {
      absl::StrAppend(&problems, problems.empty() ? "" : "; ", "unexpected ", RankList(beyond),
                      " beyond the world");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " does not match the strategy's ", world_size, " ranks (rank_0..rank_",
        world_size - 1, "): ", problems));
  }

  std::vector<std::string> files;
  files.reserve(static_cast<size_t>(world_size));
  for (const auto& [rank, rank_dir] : found) {
    CKPT_ASSIGN_OR_RETURN(std::string file, SelectRankCheckpointFile(rank_dir));
    files.push_back(std::move(file));
  }
  return files;
}

}  // namespace ckpt
