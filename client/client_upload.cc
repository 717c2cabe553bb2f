// CkptClient's uploads: rank files streamed from disk one MindSpore Value at a time, their bytes
// sent without a copy (UploadWire), and UploadDirectory's ranks in parallel.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_internal.h"
#include "client/rank_directory.h"
#include "core/absl_compat.h"
#include "core/ckpt_format.h"
#include "core/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/sync_stream.h"
#include "storage/file_stream.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// The API's bound on one data message (proto/ckpt.proto: "At most 1 MiB"), and so on the bytes of
// one UploadTensorBatch.
constexpr size_t kDataMessageBytes = size_t{1} << 20;
// Tensors of at most this many bytes (in one Value) go in UploadTensorBatch messages, at most
// kMaxBatchTensors per message: a tensor sent on its own costs two messages (its header and its
// bytes, each a round trip through the server's executor), which dominates a checkpoint of many
// tensors of up to a few hundred KiB per rank. Every tensor that fits in a message qualifies;
// its bytes are then copied once into the batch's serialisation, against the zero-copy data
// messages of larger tensors.
constexpr int64_t kBatchTensorBytes = int64_t{kDataMessageBytes};
constexpr int kMaxBatchTensors = 4096;
// A batched tensor of at least this many bytes is referenced by the batch's message rather than
// copied into it (a gRPC slice of its own costs more than copying a smaller one).
constexpr size_t kReferencedTensorBytes = size_t{64} << 10;

// The `source_file` sent with a rank: "rank_<r>/<file>" when the file sits in a rank directory,
// which identifies it in `describe` without exposing the client's absolute paths.
std::string SourceFileLabel(const std::string& path) {
  const fs::path p(path);
  const fs::path parent = p.parent_path().filename();
  if (!parent.empty() && parent.string().starts_with("rank_"))
    return (parent / p.filename()).string();
  return p.filename().string();
}

// A batch of whole tensors (UploadRequest{batch}) in its wire format: `bytes` holds the framing,
// the headers and the bytes of the small tensors; the bytes of each larger tensor are referenced
// instead (kept alive by their owner) and go on the wire at offset `at` of `bytes`.
struct BatchWire {
  struct Ref {
    size_t at = 0;
    std::shared_ptr<const std::string> owner;
  };
  std::shared_ptr<const std::string> bytes;
  std::vector<Ref> refs;
};

// One Upload message as RankFileSender sends it: `proto` (the rank or a tensor header), `batch`,
// or `data`, a piece of a tensor's bytes kept alive by `owner`. See SerializationTraits below.
struct UploadWire {
  const v1::UploadRequest* proto = nullptr;
  const BatchWire* batch = nullptr;
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
// serialising that would copy every byte twice more, and the upload client's CPU is spent mostly
// moving bytes. The server receives an ordinary UploadRequest.
template <>
class grpc::SerializationTraits<ckpt::UploadWire> {
 public:
  static grpc::Status Serialize(const ckpt::UploadWire& m, grpc::ByteBuffer* buffer,
                                bool* own_buffer) {
    if (m.proto != nullptr) {
      return SerializationTraits<ckpt::v1::UploadRequest>::Serialize(*m.proto, buffer, own_buffer);
    }
    if (m.batch != nullptr) {
      // Runs of the batch's own bytes and the referenced tensors' bytes, in order, each a slice
      // that references its owner (gRPC only reads them).
      const std::shared_ptr<const std::string>& bytes = m.batch->bytes;
      std::vector<grpc::Slice> slices;
      slices.reserve(2 * m.batch->refs.size() + 1);
      auto reference = [&slices](const std::shared_ptr<const std::string>& owner, size_t at,
                                 size_t n) {
        slices.emplace_back(const_cast<char*>(owner->data() + at), n, &ckpt::ReleaseUploadBytes,
                            new std::shared_ptr<const std::string>(owner));
      };
      size_t from = 0;
      for (const ckpt::BatchWire::Ref& r : m.batch->refs) {
        if (r.at > from) reference(bytes, from, r.at - from);
        from = r.at;
        if (!r.owner->empty()) reference(r.owner, 0, r.owner->size());
      }
      if (bytes->size() > from) reference(bytes, from, bytes->size() - from);
      *buffer = grpc::ByteBuffer(slices.data(), slices.size());
      *own_buffer = true;
      return grpc::Status::OK;
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
      : reader_(reader), stream_(stream), path_(path), file_size_(file_size), progress_(progress) {}

  // Sends `header` and every tensor of the file. Returns an error for a bad file (the caller
  // cancels the call), or OK: either everything was sent, or broken() is true because the server
  // ended the call early, and its status comes from Finish().
  absl::Status Send(const v1::UploadHeader& header) {
    // An empty file (0 bytes, or only a trailer) would otherwise be committed as a checkpoint
    // without tensors: refused before anything is sent.
    CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> value, reader_->NextValue());
    if (!value.has_value()) {
      return FileError(absl::StrCat("holds no tensors (", file_size_,
                                    " bytes); refusing to upload an empty checkpoint"));
    }
    *message_.mutable_header() = header;
    if (!Write()) return absl::OkStatus();
    Report(0);
    while (value.has_value()) {
      if (Batchable(*value)) {
        CKPT_ASSIGN_OR_RETURN(value, AddToBatch(*std::move(value)));
      } else {
        if (!FlushBatch()) return absl::OkStatus();
        CKPT_ASSIGN_OR_RETURN(value, SendTensor(*std::move(value)));
      }
      if (broken_) return absl::OkStatus();
    }
    FlushBatch();
    return absl::OkStatus();
  }

  bool broken() const { return broken_; }

 private:
  // A small non-str tensor whose Value holds all of its bytes (a tensor saved as several Values
  // is large): it goes in a batch.
  static bool Batchable(const CkptTensor& value) {
    if (value.dtype == DType::kStr) return false;
    absl::StatusOr<int64_t> elements = NumElements(value.shape());
    if (!elements.ok()) return false;
    absl::StatusOr<int64_t> bytes = ByteSizeOf(value.dtype, *elements);
    return bytes.ok() && *bytes <= kBatchTensorBytes &&
           *bytes == static_cast<int64_t>(value.data.size());
  }

  // Adds the whole tensor `value` to the batch (sending the batch first when it is full) and
  // returns the first Value of the next tensor (nullopt at the end of the file).
  absl::StatusOr<std::optional<CkptTensor>> AddToBatch(CkptTensor value) {
    const auto size = static_cast<int64_t>(value.data.size());
    if (batched_ >= static_cast<size_t>(kMaxBatchTensors) ||
        batch_bytes_ + size > static_cast<int64_t>(kDataMessageBytes)) {
      if (!FlushBatch()) return std::nullopt;
    }
    if (staged_.size() <= batched_) staged_.emplace_back();
    Staged& tensor = staged_[batched_++];
    header_.set_name(value.name);
    header_.set_dtype(std::string(DTypeName(value.dtype)));
    header_.mutable_dims()->Assign(value.dims.begin(), value.dims.end());
    header_.set_total_bytes(size);
    tensor.header.clear();
    header_.AppendToString(&tensor.header);
    tensor.data = std::move(value.data);
    batch_bytes_ += size;
    CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> next, reader_->NextValue());
    if (next && next->name == value.name) {
      return FileError(absl::StrCat("tensor ", value.name, " (", Sv(DTypeName(value.dtype)),
                                    ", dims ", ShapeToString(value.dims),
                                    ") has more content than the ", size, " bytes its dims need"));
    }
    return next;
  }

  // Sends the batch if it holds tensors; false when the server ended the call. The message is
  // UploadRequest{batch: UploadTensorBatch{tensors: [UploadTensor{header, data}...]}} in
  // protobuf's wire format (fields in number order, lengths as varints), written here so that a
  // tensor's bytes are copied at most once (small ones, into the message) or referenced.
  bool FlushBatch() {
    if (batched_ == 0) return !broken_;
    using google::protobuf::io::CodedOutputStream;
    auto tensor_size = [](const Staged& t) {
      return 1 + CodedOutputStream::VarintSize64(t.header.size()) + t.header.size() + 1 +
             CodedOutputStream::VarintSize64(t.data.size()) + t.data.size();
    };
    size_t payload = 0;
    size_t referenced = 0;
    for (size_t i = 0; i < batched_; ++i) {
      const size_t n = tensor_size(staged_[i]);
      payload += 1 + CodedOutputStream::VarintSize64(n) + n;
      if (staged_[i].data.size() >= kReferencedTensorBytes) referenced += staged_[i].data.size();
    }
    auto bytes = std::make_shared<std::string>();
    bytes->reserve(1 + 10 + payload - referenced);
    auto put_varint = [&bytes](uint64_t v) {
      uint8_t buf[10];
      const uint8_t* end = CodedOutputStream::WriteVarint64ToArray(v, buf);
      bytes->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
    };
    BatchWire wire;
    bytes->push_back(static_cast<char>((4 << 3) | 2));  // UploadRequest.batch
    put_varint(payload);
    for (size_t i = 0; i < batched_; ++i) {
      Staged& t = staged_[i];
      bytes->push_back(static_cast<char>((1 << 3) | 2));  // UploadTensorBatch.tensors
      put_varint(tensor_size(t));
      bytes->push_back(static_cast<char>((1 << 3) | 2));  // UploadTensor.header
      put_varint(t.header.size());
      bytes->append(t.header);
      bytes->push_back(static_cast<char>((2 << 3) | 2));  // UploadTensor.data
      put_varint(t.data.size());
      if (t.data.size() >= kReferencedTensorBytes) {
        wire.refs.push_back(
            {bytes->size(), std::make_shared<const std::string>(std::move(t.data))});
        t.data = std::string();
      } else {
        bytes->append(t.data);
      }
    }
    wire.bytes = std::move(bytes);
    const bool ok = Write({nullptr, &wire, nullptr, {}});
    batched_ = 0;
    batch_bytes_ = 0;
    if (ok) Report(reader_->offset());
    return ok;
  }

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
      // MindSpore saves a large tensor as consecutive Values of the same name that each repeat
      // the tensor's full dims, so the first one tells the total size before any byte is sent.
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
        return FileError(
            absl::StrCat("tensor ", first.name, " has chunks of different dtype or dims (",
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
      if (!Write({nullptr, nullptr, owner, all.substr(pos, n)})) return false;
      pos += n;
      Report(end_offset - static_cast<int64_t>(all.size() - pos));
    }
    return true;
  }

  bool Write() { return Write({&message_, nullptr, nullptr, {}}); }
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
  // The tensors of the batch not sent yet (AddToBatch): staged_[0, batched_), each its header
  // serialised and its bytes; the entries and their strings are reused from batch to batch.
  struct Staged {
    std::string header;
    std::string data;
  };
  std::vector<Staged> staged_;
  size_t batched_ = 0;
  int64_t batch_bytes_ = 0;        // their bytes
  v1::UploadTensorHeader header_;  // reused to serialise each header
  bool broken_ = false;
};

}  // namespace

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
    return absl::InternalError(
        absl::StrCat("ckptd closed the upload of ", file_path, " early without an error"));
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
  std::atomic<int64_t> done_bytes{0};
  const int64_t total_bytes = summary.file_bytes;
  CKPT_RETURN_IF_ERROR(group.RunTasks(files.size(), options.parallelism, [&](size_t r) {
    // Each rank reports its own file offset; the sum over ranks is what the caller sees.
    ProgressFn rank_progress;
    if (progress) {
      rank_progress = [&, reported = int64_t{0}](int64_t done, int64_t) mutable {
        const int64_t sum = done_bytes.fetch_add(done - reported) + (done - reported);
        reported = done;
        progress(sum, total_bytes);
      };
    }
    absl::StatusOr<v1::UploadResponse> response = UploadRankImpl(
        checkpoint_id, source_strategy, static_cast<int64_t>(r), files[r], rank_progress, &group);
    if (!response.ok()) return response.status();
    summary.ranks[r].response = *std::move(response);
    return absl::OkStatus();
  }));

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

}  // namespace ckpt
