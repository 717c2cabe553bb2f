#include "service/rpc/checkpoint_service.h"

#include <deque>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "service/rpc/grpc_status.h"
#include "service/rpc/wire_format.h"
#include "spdlog/spdlog.h"

namespace ckpt {
namespace {

std::shared_ptr<spdlog::logger> Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::default_logger()->clone("service");
    return l;
  }();
  return logger;
}

absl::Status Unavailable() {
  return absl::UnavailableError("ckptd is shutting down");
}

}  // namespace

void LogRpc(const char* method, const std::string& peer, const absl::Status& status,
            int64_t bytes, absl::Duration latency, const std::string& detail) {
  const auto level = status.ok() ? spdlog::level::info : spdlog::level::warn;
  Logger()->log(level, "event=rpc method={} peer={} status={} bytes={} ms={:.1f}{}{}{}", method,
                peer, absl::StatusCodeToString(status.code()), bytes,
                absl::ToDoubleMilliseconds(latency), detail.empty() ? "" : " ", detail,
                status.ok() ? "" : absl::StrCat(" error=\"", status.message(), "\""));
}

// ------------------------------------------------------------------------------- ByteBudget

bool ByteBudget::TryAcquire(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ > 0 && used_ + n > limit_) return false;
  used_ += n;
  return true;
}

void ByteBudget::Release(int64_t n) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= n;
    wake.swap(waiters_);
  }
  for (auto& w : wake) w();
}

void ByteBudget::Wait(std::function<void()> wake) {
  std::unique_lock<std::mutex> lock(mu_);
  if (used_ == 0) {
    lock.unlock();
    wake();
    return;
  }
  waiters_.push_back(std::move(wake));
}

int64_t ByteBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

int64_t FetchQueueShare(int64_t stream_bytes_in_flight, int64_t active_streams) {
  return stream_bytes_in_flight / std::max<int64_t>(1, active_streams);
}

// ------------------------------------------------------------------------------- unary

CheckpointServiceImpl::CheckpointServiceImpl(CheckpointManager* manager, JobRunner* jobs,
                                             Executor* executor, ServiceOptions options)
    : manager_(manager),
      jobs_(jobs),
      executor_(executor),
      options_(options),
      budget_(options.server_bytes_in_flight) {}

template <typename Fn>
grpc::ServerUnaryReactor* CheckpointServiceImpl::Unary(grpc::CallbackServerContext* ctx,
                                                       const char* method, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  if (shutting_down_) {
    LogRpc(method, ctx->peer(), Unavailable(), 0, absl::Now() - start);
    reactor->Finish(ToGrpcStatus(Unavailable()));
    return reactor;
  }
  executor_->Submit([ctx, reactor, method, start, fn = std::move(fn)]() mutable {
    const absl::Status status = fn();
    LogRpc(method, ctx->peer(), status, 0, absl::Now() - start);
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::PutStrategy(grpc::CallbackServerContext* ctx,
                                                             const v1::PutStrategyRequest* req,
                                                             v1::PutStrategyResponse* resp) {
  return Unary(ctx, "PutStrategy", [this, req, resp]() -> absl::Status {
    auto info = manager_->PutStrategy(req->name(), req->content(), req->format(), req->overwrite());
    if (!info.ok()) return info.status();
    *resp->mutable_info() = *info;
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::GetStrategy(grpc::CallbackServerContext* ctx,
                                                             const v1::GetStrategyRequest* req,
                                                             v1::GetStrategyResponse* resp) {
  return Unary(ctx, "GetStrategy", [this, req, resp]() -> absl::Status {
    auto s = manager_->GetStrategy(req->name());
    if (!s.ok()) return s.status();
    *resp->mutable_info() = CheckpointManager::InfoOf(req->name(), **s);
    resp->set_content(SerializeStrategy(**s, req->format() == v1::STRATEGY_FORMAT_JSON
                                                 ? StrategyFormat::kJson
                                                 : StrategyFormat::kBinary));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListStrategies(
    grpc::CallbackServerContext* ctx, const v1::ListStrategiesRequest*,
    v1::ListStrategiesResponse* resp) {
  return Unary(ctx, "ListStrategies", [this, resp]() -> absl::Status {
    auto list = manager_->ListStrategies();
    if (!list.ok()) return list.status();
    for (auto& info : *list) *resp->add_strategies() = std::move(info);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::DeleteStrategy(
    grpc::CallbackServerContext* ctx, const v1::DeleteStrategyRequest* req,
    v1::DeleteStrategyResponse*) {
  return Unary(ctx, "DeleteStrategy",
               [this, req]() { return manager_->DeleteStrategy(req->name()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest*,
    v1::ListCheckpointsResponse* resp) {
  return Unary(ctx, "ListCheckpoints", [this, resp]() -> absl::Status {
    auto list = manager_->ListCheckpoints();
    if (!list.ok()) return list.status();
    for (auto& info : *list) *resp->add_checkpoints() = std::move(info);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::DescribeCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::DescribeCheckpointRequest* req,
    v1::DescribeCheckpointResponse* resp) {
  return Unary(ctx, "DescribeCheckpoint", [this, req, resp]() -> absl::Status {
    auto d = manager_->DescribeCheckpoint(req->checkpoint_id());
    if (!d.ok()) return d.status();
    *resp = std::move(*d);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::DeleteCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::DeleteCheckpointRequest* req,
    v1::DeleteCheckpointResponse*) {
  return Unary(ctx, "DeleteCheckpoint",
               [this, req]() { return manager_->DeleteCheckpoint(req->checkpoint_id()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::RankDependencies(
    grpc::CallbackServerContext* ctx, const v1::RankDependenciesRequest* req,
    v1::RankDependenciesResponse* resp) {
  return Unary(ctx, "RankDependencies", [this, req, resp]() -> absl::Status {
    auto r = manager_->RankDependencies(*req);
    if (!r.ok()) return r.status();
    *resp = std::move(*r);
    return absl::OkStatus();
  });
}

// ------------------------------------------------------------------------------- jobs

grpc::ServerUnaryReactor* CheckpointServiceImpl::SubmitTransform(
    grpc::CallbackServerContext* ctx, const v1::SubmitTransformRequest* req,
    v1::SubmitTransformResponse* resp) {
  return Unary(ctx, "SubmitTransform", [this, req, resp]() -> absl::Status {
    auto r = jobs_->Submit(*req);
    if (!r.ok()) return r.status();
    *resp->mutable_job() = std::move(r->job);
    resp->set_created(r->created);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                        const v1::GetJobRequest* req,
                                                        v1::Job* resp) {
  return Unary(ctx, "GetJob", [this, req, resp]() -> absl::Status {
    auto job = jobs_->Get(req->job_id());
    if (!job.ok()) return job.status();
    *resp = std::move(*job);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                           const v1::CancelJobRequest* req,
                                                           v1::Job* resp) {
  // Waits (bounded) on the executor for the job to stop and remove its partial output, so the
  // reply normally shows CANCELLED.
  return Unary(ctx, "CancelJob", [this, req, resp]() -> absl::Status {
    auto job = jobs_->Cancel(req->job_id());
    if (!job.ok()) return job.status();
    *resp = std::move(*job);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                          const v1::ListJobsRequest*,
                                                          v1::ListJobsResponse* resp) {
  return Unary(ctx, "ListJobs", [this, resp]() -> absl::Status {
    for (v1::Job& job : jobs_->List()) *resp->add_jobs() = std::move(job);
    return absl::OkStatus();
  });
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory memory;
  std::ifstream status("/proc/self/status");
  std::string line;
  // Lines such as "VmHWM:    123456 kB".
  auto kib = [](const std::string& text) -> int64_t {
    try {
      return std::stoll(text) * 1024;
    } catch (const std::exception&) {
      return 0;
    }
  };
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) memory.rss_bytes = kib(line.substr(6));
    if (line.rfind("VmHWM:", 0) == 0) memory.peak_rss_bytes = kib(line.substr(6));
  }
  return memory;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::GetStats(grpc::CallbackServerContext* ctx,
                                                          const v1::GetStatsRequest*,
                                                          v1::ServerStats* resp) {
  return Unary(ctx, "GetStats", [this, resp]() -> absl::Status {
    const StoreStats store = manager_->store()->stats();
    resp->set_store_bytes_read(store.chunk_bytes_read);
    resp->set_store_chunks_read(store.chunks_read);
    resp->set_store_bytes_written(store.chunk_bytes_written);
    resp->set_store_chunks_written(store.chunks_written);
    resp->set_store_bytes_copied(store.chunk_bytes_copied);
    resp->set_store_mapped_bytes(store.mapped_bytes);
    resp->set_fetch_bytes_sent(fetch_bytes_sent_.load(std::memory_order_relaxed));
    resp->set_fetch_bytes_in_flight(budget_.in_use());
    resp->set_fetch_streams(active_fetches_.load(std::memory_order_relaxed));
    const ProcessMemory memory = ReadProcessMemory();
    resp->set_rss_bytes(memory.rss_bytes);
    resp->set_peak_rss_bytes(memory.peak_rss_bytes);
    return absl::OkStatus();
  });
}

// ------------------------------------------------------------------------------- Upload

namespace {

// Reads one rank's stream. Each message is handled on the executor, and the next read starts
// only after it was handled: backpressure towards the client. Deleted by gRPC in OnDone.
class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
                grpc::ByteBuffer* response)
      : service_(service), ctx_(ctx), response_(response), start_(absl::Now()) {
    if (service_->shutting_down()) {
      Done(Unavailable());
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close by the client, or cancellation
      service_->executor()->Submit([this] { Complete(); });
      return;
    }
    service_->executor()->Submit([this] {
      const absl::Status s = Handle();
      request_.Clear();  // the message's bytes are chunked or copied by now
      slices_.clear();
      data_.clear();
      if (!s.ok()) {
        upload_.reset();  // undoes this rank's contributions
        Done(s);
        return;
      }
      StartRead(&request_);
    });
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Handle() {
    if (UploadDataViews(request_, &slices_, &data_)) {
      size_t size = 0;
      for (std::string_view d : data_) size += d.size();
      CKPT_RETURN_IF_ERROR(CheckData(size));
      for (std::string_view d : data_) CKPT_RETURN_IF_ERROR(upload_->Append(d));
      return absl::OkStatus();
    }
    v1::UploadRequest request;
    if (!grpc::SerializationTraits<v1::UploadRequest>::Deserialize(&request_, &request).ok()) {
      return absl::InvalidArgumentError("malformed upload message (not a ckpt.v1.UploadRequest)");
    }
    switch (request.kind_case()) {
      case v1::UploadRequest::kHeader: {
        if (upload_) return absl::InvalidArgumentError("a second upload header in one stream");
        header_ = request.header();
        auto u = service_->manager()->BeginUpload(header_);
        if (!u.ok()) return u.status();
        upload_ = std::move(*u);
        return absl::OkStatus();
      }
      case v1::UploadRequest::kTensor:
        if (!upload_) return absl::InvalidArgumentError("the first message must be the header");
        return upload_->StartTensor(request.tensor());
      case v1::UploadRequest::kData:
        CKPT_RETURN_IF_ERROR(CheckData(request.data().size()));
        return upload_->Append(request.data());
      case v1::UploadRequest::KIND_NOT_SET:
        return absl::InvalidArgumentError("empty upload message");
    }
    return absl::InvalidArgumentError("unknown upload message");
  }

  // A data message of `size` bytes may come now.
  absl::Status CheckData(size_t size) const {
    if (!upload_) return absl::InvalidArgumentError("the first message must be the header");
    if (static_cast<int64_t>(size) > service_->options().max_upload_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("data message of ", size, " bytes exceeds ",
                                                     service_->options().max_upload_message_bytes));
    }
    return absl::OkStatus();
  }

  void Complete() {
    if (ctx_->IsCancelled()) {
      upload_.reset();
      Done(absl::CancelledError("upload cancelled by the client"));
      return;
    }
    if (!upload_) {
      Done(absl::InvalidArgumentError("upload stream ended before its header"));
      return;
    }
    auto r = upload_->Finish();
    if (!r.ok()) {
      upload_.reset();
      Done(r.status());
      return;
    }
    if (r->committed()) service_->manager()->OnUploadFinished(header_.checkpoint_id());
    bool own_buffer = false;
    if (!grpc::SerializationTraits<v1::UploadResponse>::Serialize(*r, response_, &own_buffer)
             .ok()) {
      Done(absl::InternalError("cannot serialise the upload response"));
      return;
    }
    Done(absl::OkStatus(), r->committed());
  }

  // Logs and finishes; nothing may touch `this` afterwards (OnDone may run at once).
  void Done(const absl::Status& s, bool committed = false) {
    std::string detail = absl::StrCat("checkpoint=", header_.checkpoint_id(), " rank=", header_.rank());
    if (s.ok() && committed) detail += " committed=true";
    LogRpc("Upload", ctx_->peer(), s, upload_ ? upload_->bytes_received() : 0,
           absl::Now() - start_, detail);
    Finish(ToGrpcStatus(s));
  }

  CheckpointServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const response_;  // an UploadResponse
  const absl::Time start_;
  grpc::ByteBuffer request_;  // an UploadRequest
  std::vector<grpc::Slice> slices_;  // of a data message's request_, and views of its bytes
  std::vector<std::string_view> data_;
  v1::UploadHeader header_;
  std::unique_ptr<RankUpload> upload_;
};

// ------------------------------------------------------------------------------- Fetch

bool ParseRequest(const grpc::ByteBuffer& buffer, v1::FetchRequest* request) {
  grpc::ByteBuffer copy(buffer);  // Deserialize consumes its buffer; slices are shared, not copied
  return grpc::SerializationTraits<v1::FetchRequest>::Deserialize(&copy, request).ok();
}

// The state of one Fetch, shared by the reactor (gRPC events) and the producer task (executor).
// The producer fills a bounded queue; writes drain it. At most one producer task runs at a time.
class FetchCall : public std::enable_shared_from_this<FetchCall> {
 public:
  FetchCall(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
            const grpc::ByteBuffer& request, grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor)
      : service_(service),
        peer_(ctx->peer()),
        request_ok_(ParseRequest(request, &request_)),
        reactor_(reactor),
        start_(absl::Now()) {
    service_->FetchStarted();
  }

  void Start() {
    if (service_->shutting_down() || !request_ok_) {
      std::lock_guard<std::mutex> lock(mu_);
      final_ = request_ok_ ? Unavailable()
                           : absl::InvalidArgumentError("the FetchRequest could not be parsed");
      producer_done_ = true;
      MaybeFinishLocked();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = true;
    }
    auto self = shared_from_this();
    service_->executor()->Submit([self] { self->Produce(); });
  }

  void OnWriteDone(bool ok) {
    int64_t released = 0;
    bool resume = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ok) service_->CountFetchBytesSent(data_sizes_.front());
      data_sizes_.pop_front();
      released += sizes_.front();
      queued_bytes_ -= sizes_.front();
      queue_.pop_front();
      sizes_.pop_front();
      writing_ = false;
      if (!ok) {
        cancelled_ = true;
        for (int64_t s : sizes_) released += s;
        queue_.clear();
        sizes_.clear();
        data_sizes_.clear();
        queued_bytes_ = 0;
      } else if (!queue_.empty()) {
        writing_ = true;
        reactor_->StartWrite(&queue_.front());
      }
      // The paused producer resumes once the queue is down to half its limit (it then fills it
      // again): with 8 concurrent streams, resuming below the limit instead made 1.90-2.15
      // GiB/s against 2.00-2.26 in four alternating pairs (server CPU 0.50-0.56 against
      // 0.47-0.53 s/GiB); single streams were unchanged.
      if (!running_ && !producer_done_ && !cancelled_ &&
          queued_bytes_ <= service_->FetchQueueLimit() / 2) {
        running_ = true;
        resume = true;
      }
      MaybeFinishLocked();
    }
    service_->budget()->Release(released);
    if (resume) {
      auto self = shared_from_this();
      service_->executor()->Submit([self] { self->Produce(); });
    }
  }

  void OnCancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    MaybeFinishLocked();
  }

  void OnDone() {
    service_->FetchEnded();
    int64_t released = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reactor_ = nullptr;
      for (int64_t s : sizes_) released += s;
      queue_.clear();
      sizes_.clear();
      data_sizes_.clear();
    }
    service_->budget()->Release(released);
  }

 private:
  // Runs on the executor: produces messages until the stream's queue is full, the server budget
  // is exhausted, or the stream ends.
  void Produce() {
    if (!stream_) {
      auto s = service_->manager()->OpenFetch(request_);
      if (!s.ok()) {
        EndProducer(s.status());
        return;
      }
      stream_ = std::move(*s);
    }
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (cancelled_ || reactor_ == nullptr) {
          running_ = false;
          MaybeFinishLocked();
          return;
        }
        if (queued_bytes_ >= service_->FetchQueueLimit()) {
          running_ = false;  // OnWriteDone resumes us
          return;
        }
      }
      if (!has_next_) {
        auto more = stream_->NextPiece(&piece_, FetchReader::kClient);
        if (!more.ok()) {
          EndProducer(more.status());
          return;
        }
        if (!*more) {
          EndProducer(absl::OkStatus());
          return;
        }
        has_next_ = true;
        next_data_ = piece_.data_bytes;
        next_ = EncodeFetchResponse(std::move(piece_));
        next_size_ = static_cast<int64_t>(next_.Length());
      }
      if (!service_->budget()->TryAcquire(next_size_)) {
        // Server-wide budget exhausted: wait for any stream to release bytes.
        {
          std::lock_guard<std::mutex> lock(mu_);
          running_ = false;
        }
        std::weak_ptr<FetchCall> weak = shared_from_this();
        service_->budget()->Wait([weak] {
          if (auto self = weak.lock()) self->Resume();
        });
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (reactor_ == nullptr || cancelled_) {
        service_->budget()->Release(next_size_);
        has_next_ = false;
        continue;
      }
      bytes_ += next_data_;
      queue_.push_back(std::move(next_));
      next_.Clear();
      sizes_.push_back(next_size_);
      data_sizes_.push_back(next_data_);
      queued_bytes_ += next_size_;
      has_next_ = false;
      if (!writing_) {
        // The writer is idle: restart it on another executor thread rather than here. gRPC
        // sends a message inline in StartWrite, and the next writes start from OnWriteDone where
        // the previous one completed; started from the producer, every byte would be read,
        // assembled and sent by this one thread while the other core idles.
        writing_ = true;
        auto self = shared_from_this();
        service_->executor()->Submit([self] { self->StartWriting(); });
      }
    }
  }

  // Runs on the executor: writes the front of the queue (Produce set writing_ for this).
  void StartWriting() {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || cancelled_ || queue_.empty()) {
      writing_ = false;
      MaybeFinishLocked();
      return;
    }
    reactor_->StartWrite(&queue_.front());
  }

  void Resume() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_ || producer_done_ || reactor_ == nullptr) return;
      running_ = true;
    }
    auto self = shared_from_this();
    service_->executor()->Submit([self] { self->Produce(); });
  }

  void EndProducer(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    final_ = status;
    producer_done_ = true;
    running_ = false;
    MaybeFinishLocked();
  }

  // Finishes exactly once, when nothing is being written and either everything was produced or
  // the call was cancelled.
  void MaybeFinishLocked() {
    if (finished_ || reactor_ == nullptr || writing_ || running_) return;
    absl::Status status;
    if (cancelled_) {
      status = absl::CancelledError("fetch cancelled (client gone or deadline exceeded)");
    } else if (producer_done_ && queue_.empty()) {
      status = final_;
    } else {
      return;
    }
    finished_ = true;
    LogRpc("Fetch", peer_, status, bytes_, absl::Now() - start_,
           absl::StrCat("checkpoint=", request_.checkpoint_id(), " target=",
                        request_.merged() ? std::string("merged")
                                          : absl::StrCat(request_.destination_strategy(), "/",
                                                         request_.rank())));
    reactor_->Finish(ToGrpcStatus(status));
  }

  CheckpointServiceImpl* const service_;
  const std::string peer_;
  v1::FetchRequest request_;
  const bool request_ok_;
  std::unique_ptr<FetchStream> stream_;  // producer only
  FetchPiece piece_;                     // producer only
  grpc::ByteBuffer next_;                // producer only: the encoded piece_
  bool has_next_ = false;                // producer only
  int64_t next_size_ = 0;                // producer only: encoded bytes
  int64_t next_data_ = 0;                // producer only: tensor bytes in it

  std::mutex mu_;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor_;  // null after OnDone
  std::deque<grpc::ByteBuffer> queue_;  // front is being written while writing_
  std::deque<int64_t> sizes_;           // encoded bytes of each queued message
  std::deque<int64_t> data_sizes_;      // tensor bytes of each queued message
  int64_t queued_bytes_ = 0;
  int64_t bytes_ = 0;
  bool writing_ = false;
  bool running_ = false;
  bool producer_done_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
  absl::Status final_;
  const absl::Time start_;
};

class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
               const grpc::ByteBuffer* request)
      : call_(std::make_shared<FetchCall>(service, ctx, *request, this)) {
    call_->Start();
  }
  void OnWriteDone(bool ok) override { call_->OnWriteDone(ok); }
  void OnCancel() override { call_->OnCancel(); }
  void OnDone() override {
    call_->OnDone();
    delete this;
  }

 private:
  std::shared_ptr<FetchCall> call_;
};

// ------------------------------------------------------------------------------- WatchJob

// The state of one WatchJob, shared by the reactor (gRPC events) and the JobRunner's watch
// callback (runner, job or RPC threads). One Job is written at a time; states arriving meanwhile
// collapse into the newest, so a slow watcher never holds up a job. Thread-safe (mu_).
// Lock order: the runner's per-watch lock (held while it calls OnJob), then mu_; the JobWatch
// is therefore only ever destroyed outside mu_.
class WatchCall : public std::enable_shared_from_this<WatchCall> {
 public:
  WatchCall(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx, std::string job_id,
            grpc::ServerWriteReactor<v1::Job>* reactor)
      : service_(service),
        peer_(ctx->peer()),
        job_id_(std::move(job_id)),
        start_(absl::Now()),
        reactor_(reactor) {}

  void Start() {
    auto self = shared_from_this();
    if (service_->shutting_down()) {
      std::lock_guard<std::mutex> lock(mu_);
      FinishLocked(Unavailable());
      return;
    }
    std::weak_ptr<WatchCall> weak = self;
    // The current state arrives through OnJob before Watch returns.
    auto watch = service_->jobs()->Watch(job_id_, [weak](const v1::Job* job) {
      if (auto call = weak.lock()) call->OnJob(job);
    });
    std::unique_ptr<JobWatch> unused;
    std::lock_guard<std::mutex> lock(mu_);
    if (!watch.ok()) {
      FinishLocked(watch.status());
      return;
    }
    if (reactor_ == nullptr) {
      unused = std::move(*watch);  // already done; destroyed after unlocking (declared first)
    } else {
      watch_ = std::move(*watch);
    }
  }

  void OnWriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(absl::CancelledError("watcher gone"));
    } else if (JobRunner::IsTerminal(current_.state())) {
      FinishLocked(absl::OkStatus());  // the job ended: nothing more to say
    } else if (cancelled_) {
      FinishLocked(absl::CancelledError("watch cancelled by the client"));
    } else {
      MaybeWriteLocked();
      if (!writing_ && closing_) FinishLocked(Unavailable());
    }
  }

  void OnCancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(absl::CancelledError("watch cancelled by the client"));
  }

  void OnDone() {
    std::unique_ptr<JobWatch> watch;  // destroyed after unlocking: see the lock order above
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    watch = std::move(watch_);
  }

 private:
  // A new state, or null when the runner shuts down.
  void OnJob(const v1::Job* job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || reactor_ == nullptr) return;
    if (job == nullptr) {
      closing_ = true;
      if (!writing_) FinishLocked(Unavailable());
      return;
    }
    pending_ = *job;
    has_pending_ = true;
    MaybeWriteLocked();
  }

  void MaybeWriteLocked() {
    if (writing_ || finished_ || !has_pending_ || reactor_ == nullptr) return;
    current_ = std::move(pending_);
    has_pending_ = false;
    writing_ = true;
    ++updates_;
    reactor_->StartWrite(&current_);
  }

  // Finishes exactly once; nothing may be in flight.
  void FinishLocked(const absl::Status& status) {
    if (finished_ || reactor_ == nullptr) return;
    finished_ = true;
    LogRpc("WatchJob", peer_, status, 0, absl::Now() - start_,
           absl::StrCat("job=", job_id_, " updates=", updates_));
    reactor_->Finish(ToGrpcStatus(status));
  }

  CheckpointServiceImpl* const service_;
  const std::string peer_;
  const std::string job_id_;
  const absl::Time start_;

  std::mutex mu_;
  grpc::ServerWriteReactor<v1::Job>* reactor_;  // null after OnDone
  std::unique_ptr<JobWatch> watch_;
  v1::Job current_;  // being written while writing_
  v1::Job pending_;  // newest unsent state when has_pending_
  bool has_pending_ = false;
  bool writing_ = false;
  bool cancelled_ = false;
  bool closing_ = false;  // the runner shut down: finish once the queue is written
  bool finished_ = false;
  int64_t updates_ = 0;
};

class WatchJobReactor final : public grpc::ServerWriteReactor<v1::Job> {
 public:
  WatchJobReactor(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
                  const v1::WatchJobRequest* request)
      : call_(std::make_shared<WatchCall>(service, ctx, request->job_id(), this)) {
    call_->Start();
  }
  void OnWriteDone(bool ok) override { call_->OnWriteDone(ok); }
  void OnCancel() override { call_->OnCancel(); }
  void OnDone() override {
    call_->OnDone();
    delete this;
  }

 private:
  std::shared_ptr<WatchCall> call_;
};

}  // namespace

grpc::ServerWriteReactor<v1::Job>* CheckpointServiceImpl::WatchJob(
    grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* req) {
  return new WatchJobReactor(this, ctx, req);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* CheckpointServiceImpl::Upload(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  return new UploadReactor(this, ctx, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CheckpointServiceImpl::Fetch(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return new FetchReactor(this, ctx, req);
}

}  // namespace ckpt
