// CkptClient's fetches: a Fetch stream read in place (client/fetch_wire.h), checked message by
// message (order, sizes, every part checksum) and assembled from bands of tiles into rows before
// the visitor sees it; FetchAll collects it in memory, FetchToFile writes a MindSpore .ckpt.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/client_internal.h"
#include "client/fetch_wire.h"
#include "core/absl_compat.h"
#include "core/checksum.h"
#include "core/ckpt_format.h"
#include "core/status_macros.h"
#include "core/tile_band.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/sync_stream.h"
#include "storage/file_stream.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace {

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
      return absl::DataLossError(absl::StrCat("fetch stream ended after ", tensors_, " of ",
                                              summary_->tensor_count(), " tensors and ", bytes_,
                                              " of ", summary_->total_bytes(), " bytes"));
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
      return absl::InternalError(
          absl::StrCat("tensor ", header.name(), " announces ", header.total_bytes(), " bytes"));
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
                      absl::Span<const uint64_t> part_checksums, absl::Span<const int64_t> tile_box,
                      int64_t band_rows) {
    if (!current_) return absl::InternalError("fetch stream sent data outside a tensor");
    if (current_->band && tile_box.empty()) {
      return absl::DataLossError(
          absl::StrCat("tensor ", current_->name, ": row-major data inside a band of tiles"));
    }
    if (size > static_cast<uint64_t>(current_->total - current_->received)) {
      return absl::DataLossError(absl::StrCat("tensor ", current_->name,
                                              ": received more than its ", current_->total,
                                              " announced bytes"));
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
      auto band =
          TileBand::Start(*c.dtype, c.local, c.received / *row_bytes, band_rows, kMaxBandBytes);
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
    return absl::DataLossError(
        absl::StrCat("checkpoint ", checkpoint_, " tensor ", current_->name, ": bytes [", begin,
                     ", ", begin + static_cast<int64_t>(size), ") failed their ", kChecksumName,
                     " checksum (received ", absl::Hex(actual), ", expected ", absl::Hex(expected),
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
    // MindSpore stores scalars with empty dims and str values with dims [0].
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

// Writes sequentially, through a 1 MiB buffer, to a descriptor it does not own (standard
// output, or another already open descriptor). Not thread-safe.
class DescriptorSink final : public ByteSink {
 public:
  DescriptorSink(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}

  absl::Status Write(std::string_view bytes) override {
    buffer_.append(bytes.data(), bytes.size());
    if (buffer_.size() >= kBufferBytes) return Flush();
    return absl::OkStatus();
  }
  absl::Status Flush() {
    const char* data = buffer_.data();
    size_t n = buffer_.size();
    while (n > 0) {
      const ssize_t put = ::write(fd_, data, n);
      if (put < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, "write", name_);
      }
      data += put;
      n -= static_cast<size_t>(put);
    }
    buffer_.clear();
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBufferBytes = 1 << 20;
  const int fd_;
  const std::string name_;
  std::string buffer_;
};

// Where FetchToFile writes `path` when it is a file to (re)place: the path itself, or for a
// symbolic link the file it names (so that the link is never replaced by the file). Creates the
// missing parent directories of a new file.
absl::StatusOr<std::string> ResolveOutputFile(const std::string& path) {
  namespace fs = std::filesystem;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISLNK(st.st_mode)) return path;
    std::error_code ec;
    const fs::path target = fs::canonical(path, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " is a symbolic link to a missing file; give the file's own path"));
    }
    return target.string();
  }
  if (errno != ENOENT) return ErrnoToStatus(errno, "stat", path);
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) return ErrnoToStatus(ec.value(), "create directory", parent.string());
  }
  return path;
}

}  // namespace

int OutputDescriptor(std::string_view path) {
  if (path == "-" || path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  for (std::string_view prefix : {std::string_view("/dev/fd/"), std::string_view("/proc/self/fd/")}) {
    if (!path.starts_with(prefix)) continue;
    std::string_view digits = path.substr(prefix.size());
    if (digits.empty() || digits.size() > 9) return -1;
    int fd = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return -1;
      fd = fd * 10 + (c - '0');
    }
    return fd;
  }
  return -1;
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
  if (const int fd = OutputDescriptor(path); fd >= 0) {
    // An open descriptor: written in place, never created, replaced or renamed over.
    DescriptorSink sink(fd, path == "-" ? std::string("standard output") : path);
    CkptFileVisitor visitor(&sink, &progress);
    CKPT_RETURN_IF_ERROR(FetchImpl(request, visitor, group));
    CKPT_RETURN_IF_ERROR(visitor.Finish());
    CKPT_RETURN_IF_ERROR(sink.Flush());
    return visitor.summary();
  }
  CKPT_ASSIGN_OR_RETURN(const std::string file, ResolveOutputFile(path));
  // The sink writes a temporary file and publishes it only on Commit(); returning early destroys
  // it, which removes the temporary, so a failed fetch leaves no file behind. A character device
  // or a pipe is written in place.
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileSink> sink, AtomicFileSink::Create(file));
  CkptFileVisitor visitor(sink.get(), &progress);
  CKPT_RETURN_IF_ERROR(FetchImpl(request, visitor, group));
  CKPT_RETURN_IF_ERROR(visitor.Finish());
  CKPT_RETURN_IF_ERROR(sink->Commit());
  return visitor.summary();
}

}  // namespace ckpt
