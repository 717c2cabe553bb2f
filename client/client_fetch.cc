// CkptClient's fetches: a Fetch stream read in place (client/fetch_wire.h), checked message by
// message (order, sizes, every part checksum) and assembled from bands of tiles into rows before
// the visitor sees it; FetchAll collects it in memory, FetchToFile writes a MindSpore .ckpt.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/client_internal.h"
#include "client/fetch_checker.h"
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
    return BeginFetchedTensor(header, writer_);
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
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is a symbolic link to a missing file; give the file's own path"));
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

// Receives a Fetch stream on a thread of its own into a bounded queue, for an InPlaceVisitor
// (client/fetch_checker.h): receiving the next messages (gRPC's socket reads, framing and flow
// control, and parsing them) overlaps checking and placing the current one on the calling thread.
// The queue holds at most kMaxQueued messages and, beyond its first message, kMaxQueuedBytes: with
// the message being received and the one being consumed, that is all the pipe adds to the client's
// memory. Messages are recycled, so that their vectors keep their capacity. Thread-safe between its
// reading thread and one consumer.
class MessagePipe {
 public:
  // Starts reading `stream`, which the pipe borrows until Stop() returned.
  explicit MessagePipe(grpc::ClientReader<FetchWire>* stream)
      : stream_(stream), reader_([this] { Run(); }) {}
  ~MessagePipe() { Stop(); }

  // The next message, or nullptr at the end of the stream. Waits for it, asking `stop` (when not
  // null) every kPollInterval; returns nullptr with *stopped set once it says so.
  std::unique_ptr<FetchWire> Next(const InPlaceVisitor* stop, bool* stopped) {
    std::unique_lock<std::mutex> lock(mu_);
    while (queue_.empty() && !ended_) {
      if (stop != nullptr && stop->StopRequested()) {
        *stopped = true;
        return nullptr;
      }
      ready_.wait_for(lock, kPollInterval);
    }
    if (queue_.empty()) return nullptr;
    std::unique_ptr<FetchWire> message = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= message->buffer.Length();
    space_.notify_one();
    return message;
  }

  // Returns a consumed message for reuse.
  void Recycle(std::unique_ptr<FetchWire> message) {
    // Drop the received slices now rather than when the message is next read into.
    message->reader.reset();
    message->buffer.Clear();
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(message));
  }

  // Ends the reading thread: the caller must have cancelled the call first unless the stream
  // ended (Next returned nullptr without *stopped). Idempotent.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    space_.notify_all();
    if (reader_.joinable()) reader_.join();
  }

 private:
  static constexpr size_t kMaxQueued = 4;
  static constexpr size_t kMaxQueuedBytes = size_t{8} << 20;
  static constexpr std::chrono::milliseconds kPollInterval{50};

  void Run() {
    while (true) {
      std::unique_ptr<FetchWire> message;
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_.wait(lock, [this] {
          return stopping_ || queue_.empty() ||
                 (queue_.size() < kMaxQueued && queued_bytes_ < kMaxQueuedBytes);
        });
        if (stopping_) break;
        if (!free_.empty()) {
          message = std::move(free_.back());
          free_.pop_back();
        }
      }
      if (message == nullptr) message = std::make_unique<FetchWire>();
      // After a cancellation (by the consumer) Read returns false promptly; after the stream
      // ended, at once.
      if (!stream_->Read(message.get())) break;
      std::lock_guard<std::mutex> lock(mu_);
      queued_bytes_ += message->buffer.Length();
      queue_.push_back(std::move(message));
      ready_.notify_one();
    }
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    ready_.notify_one();
  }

  grpc::ClientReader<FetchWire>* const stream_;
  std::mutex mu_;
  std::condition_variable ready_;                 // a message was queued, or the stream ended
  std::condition_variable space_;                 // the queue has room, or stopping_
  std::deque<std::unique_ptr<FetchWire>> queue_;  // guarded by mu_
  std::vector<std::unique_ptr<FetchWire>> free_;  // guarded by mu_
  size_t queued_bytes_ = 0;                       // guarded by mu_
  bool ended_ = false;                            // guarded by mu_
  bool stopping_ = false;                         // guarded by mu_
  std::thread reader_;  // last, so that it starts once every member it uses exists
};

// Consumes `stream` through `checker` with a MessagePipe (see there). `stop` (may be null) is
// asked whether to stop while no message arrives. Returns the first local failure (the call then
// cancelled and its stream read to its end), or OK once the stream ended.
absl::Status ConsumePipelined(grpc::ClientReader<FetchWire>* stream, grpc::ClientContext* context,
                              FetchChecker& checker, const InPlaceVisitor* stop) {
  MessagePipe pipe(stream);
  absl::Status local;
  while (true) {
    bool stopped = false;
    std::unique_ptr<FetchWire> message = pipe.Next(stop, &stopped);
    if (stopped) {
      local = absl::CancelledError("fetch cancelled by the caller");
      break;
    }
    if (message == nullptr) return absl::OkStatus();  // the reader ended with the stream
    local = checker.Consume(*message);
    pipe.Recycle(std::move(message));
    if (!local.ok()) break;
  }
  context->TryCancel();
  pipe.Stop();
  FetchWire rest;
  while (stream->Read(&rest)) {
  }
  return local;
}

}  // namespace

absl::Status BeginFetchedTensor(const v1::FetchTensorHeader& header, CkptWriter& writer) {
  absl::StatusOr<DType> dtype = ParseDType(header.dtype());
  if (!dtype.ok()) {
    return absl::InternalError(
        absl::StrCat("tensor ", header.name(), " from the server: ", dtype.status().message()));
  }
  // MindSpore stores scalars with empty dims and str values with dims [0].
  std::vector<int64_t> dims(header.local_shape().begin(), header.local_shape().end());
  if (*dtype == DType::kStr) dims = {0};
  return writer.BeginTensor(header.name(), *dtype, dims, header.total_bytes());
}

int OutputDescriptor(std::string_view path) {
  if (path == "-" || path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  for (std::string_view prefix :
       {std::string_view("/dev/fd/"), std::string_view("/proc/self/fd/")}) {
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
  // The checker reads batches of small tensors (FetchTensorBatch), so the library asks for them.
  static const grpc::internal::RpcMethod kFetch("/ckpt.v1.CheckpointService/Fetch",
                                                grpc::internal::RpcMethod::SERVER_STREAMING);
  v1::FetchRequest with_batches = request;
  with_batches.set_accept_batches(true);
  std::unique_ptr<grpc::ClientReader<FetchWire>> stream(
      grpc::internal::ClientReaderFactory<FetchWire>::Create(channel_.get(), kFetch, &context,
                                                             with_batches));
  FetchChecker checker(&visitor, request.checkpoint_id());
  // A visitor that lends memory has its stream received on a thread of its own (MessagePipe):
  // the calling thread then only verifies and places bytes, and receiving the next messages
  // overlaps it. Other visitors read on the calling thread: a process among many on few cores
  // (a job's workers starting together) pays more for the hand-offs between two threads than
  // the overlap gains it. The visitor's methods are all called on this thread.
  absl::Status local;
  if (const auto* in_place = dynamic_cast<const InPlaceVisitor*>(&visitor)) {
    local = ConsumePipelined(stream.get(), &context, checker, in_place);
  } else {
    FetchWire message;
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
    }
  }
  if (!local.ok()) {
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
