// ckptd._native: the Python client's fetch fast path, a pybind11 module over the C++ client
// library (client/client.h). CkptClient::Fetch runs the stream with the GIL released: it checks
// its order and sizes and verifies every part checksum, and the visitor here lends it the memory
// of each tensor's NumPy array (InPlaceVisitor, client/fetch_checker.h), into which the library
// writes the verified bytes and assembles bands of tiles directly, while a thread of its own
// receives the next messages.
//
// The Python side (ckptd/_native_fetch.py) owns everything about arrays and results: the visitor
// calls back into Python, holding the GIL only for those calls, when the plan summary arrives
// (on_summary(serialized FetchPlanSummary)), when a tensor's header arrives
// (on_begin(serialized FetchTensorHeader) -> a writable buffer of exactly the tensor's bytes,
// whose memory the visitor then fills without the GIL) and when the tensor is complete
// (on_end()). A callback returning False, or raising, aborts the fetch (the stream is
// cancelled); the callbacks themselves keep any Python exception for the caller to re-raise.
//
// Every call returns its outcome as (code, message) with the absl::Status code (numerically the
// gRPC code) and message unchanged, which ckptd.errors turns into the matching exception class.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/fetch_checker.h"
#include "core/ckpt_format.h"
#include "core/dtype.h"
#include "storage/file_stream.h"

namespace py = pybind11;

namespace ckpt {
namespace {

using Outcome = std::pair<int, std::string>;

Outcome ToOutcome(const absl::Status& status) {
  return {static_cast<int>(status.code()), std::string(status.message())};
}

// Set from any thread (FetchIterator.close). The array visitor checks it between messages and the
// C++ library polls it while it waits for one (InPlaceVisitor::StopRequested), so that a
// cancelled fetch stops within a fraction of a second. Thread-safe.
class StopFlag {
 public:
  void Set() { stopped_.store(true, std::memory_order_relaxed); }
  bool IsSet() const { return stopped_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> stopped_{false};
};

absl::Status StoppedError() { return absl::CancelledError("fetch cancelled by the caller"); }

// The outcome of a Python callback's `result` (the GIL held): None or False means "abort", as
// does an exception, which the callbacks keep themselves (module comment); one escaping anyway
// is reported as INTERNAL with its text.
absl::Status CallbackOutcome(const py::object& result, const char* what) {
  if (result.is_none() || (py::isinstance<py::bool_>(result) && !result.cast<bool>())) {
    return absl::CancelledError(absl::StrCat("fetch aborted by its ", what, " callback"));
  }
  return absl::OkStatus();
}

absl::Status EscapedError(const py::error_already_set& e, const char* what) {
  return absl::InternalError(absl::StrCat("ckptd._native ", what, " callback: ", e.what()));
}

// Faults in the pages of the array being filled, on a thread of its own, ahead of the thread
// writing the fetched bytes into it. A large array's memory is fresh (mapped for it, or heap
// the process never touched): its first write to every page makes the kernel zero the page (2 MiB
// at a time with the transparent huge pages NumPy asks for), which would otherwise be a large
// share of the fetching thread's CPU. madvise(MADV_POPULATE_WRITE) faults the pages in without
// changing any byte already written, so the two threads may touch the same pages in any order.
// Where the kernel lacks it (before Linux 5.14) the first call fails and the thread stops trying.
// Thread-safe between the fetching thread (Start, Finish) and its own thread.
class Prefaulter {
 public:
  Prefaulter() = default;
  ~Prefaulter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
      ++generation_;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Starts faulting in [data, data + size), which must stay mapped until Finish() returned.
  void Start(char* data, int64_t size) {
    if (size < kMinBytes || unsupported_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    begin_ = data;
    end_ = data + size;
    ++generation_;
    wake_.notify_all();
  }

  // Stops working on the range Start gave and waits until the thread no longer touches it.
  void Finish() {
    std::unique_lock<std::mutex> lock(mu_);
    if (begin_ == nullptr && !busy_) return;
    begin_ = end_ = nullptr;
    ++generation_;
    idle_.wait(lock, [this] { return !busy_; });
  }

 private:
  // Arrays smaller than this are left alone (they mostly reuse memory the heap keeps).
  static constexpr int64_t kMinBytes = int64_t{4} << 20;
  // Faulted in per call, so that Finish() waits for at most one such step.
  static constexpr size_t kStepBytes = size_t{2} << 20;

  void Run() {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [this] { return quit_ || begin_ != nullptr; });
      if (quit_) return;
      const uint64_t generation = generation_;
      // Whole pages inside the range: the pages at its ends may hold other objects' bytes,
      // which MADV_POPULATE_WRITE would not change either, but they are already mapped.
      auto at = (reinterpret_cast<uintptr_t>(begin_) + page - 1) & ~(page - 1);
      const auto end = reinterpret_cast<uintptr_t>(end_) & ~(page - 1);
      busy_ = true;
      while (at < end && generation == generation_) {
        const size_t step = std::min<uintptr_t>(kStepBytes, end - at);
        lock.unlock();
        const int rc = madvise(reinterpret_cast<void*>(at), step, MADV_POPULATE_WRITE);
        lock.lock();
        if (rc != 0) {
          // EINVAL: the kernel does not know the advice; anything else: leave the rest to the
          // fetching thread's own faults.
          if (errno == EINVAL) unsupported_.store(true, std::memory_order_relaxed);
          break;
        }
        at += step;
      }
      busy_ = false;
      if (generation == generation_) begin_ = end_ = nullptr;  // done with this range
      idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;  // a range to work on, or quit_
  std::condition_variable idle_;  // busy_ went false
  char* begin_ = nullptr;         // guarded by mu_
  char* end_ = nullptr;           // guarded by mu_
  uint64_t generation_ = 0;       // guarded by mu_; bumped by every Start, Finish and quit
  bool busy_ = false;             // guarded by mu_: the thread is inside a range
  bool quit_ = false;             // guarded by mu_
  std::atomic<bool> unsupported_{false};
  std::thread thread_;
};

// Places a fetch into the arrays Python allocates (module comment): it lends each array's memory
// to the C++ library (InPlaceVisitor, client/fetch_checker.h), which writes the verified bytes
// and assembles bands of tiles there itself. Called on the thread running CkptClient::Fetch,
// which does not hold the GIL. Not thread-safe, except StopRequested.
class ArrayVisitor final : public InPlaceVisitor {
 public:
  ArrayVisitor(py::object on_summary, py::object on_begin, py::object on_end,
               const StopFlag* stop)
      : on_summary_(std::move(on_summary)),
        on_begin_(std::move(on_begin)),
        on_end_(std::move(on_end)),
        stop_(stop) {}

  ~ArrayVisitor() override {
    prefaulter_.Finish();  // before the array it may be touching can go
    py::gil_scoped_acquire gil;
    signal_error_.reset();
    target_ = py::object();
    on_summary_ = on_begin_ = on_end_ = py::object();
  }

  absl::Status OnSummary(const v1::FetchPlanSummary& summary) override {
    const std::string bytes = summary.SerializeAsString();
    py::gil_scoped_acquire gil;
    try {
      return CallbackOutcome(on_summary_(py::bytes(bytes)), "summary");
    } catch (py::error_already_set& e) {
      return EscapedError(e, "summary");
    }
  }

  absl::Status OnTensor(const v1::FetchTensorHeader& header) override {
    if (stop_ != nullptr && stop_->IsSet()) return StoppedError();
    const std::string bytes = header.SerializeAsString();
    prefaulter_.Finish();
    py::gil_scoped_acquire gil;
    target_ = py::object();
    data_ = nullptr;
    size_ = 0;
    offset_ = 0;
    py::object buffer;
    try {
      buffer = on_begin_(py::bytes(bytes));
    } catch (py::error_already_set& e) {
      return EscapedError(e, "tensor");
    }
    if (absl::Status status = CallbackOutcome(buffer, "tensor"); !status.ok()) return status;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      return absl::InternalError(absl::StrCat("tensor ", header.name(),
                                              ": the array for it is not a writable buffer"));
    }
    const int64_t len = static_cast<int64_t>(view.len);
    data_ = static_cast<char*>(view.buf);
    PyBuffer_Release(&view);  // `buffer` (kept in target_) keeps the memory alive
    if (len != header.total_bytes()) {
      data_ = nullptr;
      return absl::InternalError(absl::StrCat("tensor ", header.name(), ": an array of ", len,
                                              " bytes for ", header.total_bytes(), " bytes"));
    }
    size_ = len;
    target_ = std::move(buffer);
    prefaulter_.Start(data_, size_);
    return absl::OkStatus();
  }

  char* TensorMemory() override { return data_; }

  bool StopRequested() const override { return stop_ != nullptr && stop_->IsSet(); }

  absl::Status OnPlaced(int64_t size) override {
    if (StopRequested()) return StoppedError();
    // The C++ library checked the sizes against the header; checked again because a write past
    // the array would corrupt the interpreter's memory.
    if (size > size_ - offset_) return absl::InternalError("fetch data beyond the tensor's array");
    offset_ += size;
    return CheckSignals(size);
  }

  // Only for a tensor whose memory was not lent, which TensorMemory never refuses; kept
  // correct for any caller of the TensorVisitor interface.
  absl::Status OnData(std::string_view data) override {
    if (StopRequested()) return StoppedError();
    if (static_cast<int64_t>(data.size()) > size_ - offset_) {
      return absl::InternalError("fetch data beyond the tensor's array");
    }
    std::memcpy(data_ + offset_, data.data(), data.size());
    offset_ += static_cast<int64_t>(data.size());
    return CheckSignals(static_cast<int64_t>(data.size()));
  }

  // The exception a signal handler raised during the fetch, if any; re-raised by the caller.
  std::optional<py::error_already_set>& signal_error() { return signal_error_; }

  absl::Status OnTensorEnd() override {
    prefaulter_.Finish();
    py::gil_scoped_acquire gil;
    target_ = py::object();
    size_ = offset_ = 0;
    data_ = nullptr;
    try {
      return CallbackOutcome(on_end_(), "tensor end");
    } catch (py::error_already_set& e) {
      return EscapedError(e, "tensor end");
    }
  }

 private:
  // Python runs signal handlers (Ctrl-C's KeyboardInterrupt) only while it runs Python code;
  // a long tensor gives it that chance every kSignalCheckBytes (on the main thread only).
  absl::Status CheckSignals(int64_t size) {
    since_signal_check_ += size;
    if (since_signal_check_ < kSignalCheckBytes) return absl::OkStatus();
    since_signal_check_ = 0;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      signal_error_.emplace();  // takes the exception the handler raised
      return absl::CancelledError("fetch interrupted by a signal");
    }
    return absl::OkStatus();
  }

  py::object on_summary_;
  py::object on_begin_;
  py::object on_end_;
  const StopFlag* const stop_;
  static constexpr int64_t kSignalCheckBytes = 64 << 20;

  py::object target_;  // the current tensor's buffer
  Prefaulter prefaulter_;  // of target_'s memory
  std::optional<py::error_already_set> signal_error_;
  int64_t since_signal_check_ = 0;
  char* data_ = nullptr;
  int64_t size_ = 0;
  int64_t offset_ = 0;
};

// Writes a fetch as a MindSpore .ckpt through an AtomicFileSink (the bytes CkptClient::FetchToFile
// writes, with the same CkptWriter), reporting progress to Python, which may abort it. The file
// appears only on Commit(); dropping the sink removes the temporary file. Not thread-safe.
class FileVisitor final : public TensorVisitor {
 public:
  FileVisitor(ByteSink* sink, py::object progress)
      : writer_(sink), progress_(std::move(progress)) {}

  ~FileVisitor() override {
    py::gil_scoped_acquire gil;
    progress_ = py::object();
  }

  absl::Status OnSummary(const v1::FetchPlanSummary& summary) override {
    summary_ = summary;
    return Report();
  }
  absl::Status OnTensor(const v1::FetchTensorHeader& header) override {
    return BeginFetchedTensor(header, writer_);
  }
  absl::Status OnData(std::string_view data) override {
    absl::Status status = writer_.Append(data);
    if (!status.ok()) return status;
    done_ += static_cast<int64_t>(data.size());
    return Report();
  }
  absl::Status OnTensorEnd() override { return absl::OkStatus(); }

  absl::Status Finish() { return writer_.Finish(); }
  const v1::FetchPlanSummary& summary() const { return summary_; }

 private:
  absl::Status Report() {
    if (progress_.is_none()) return absl::OkStatus();
    const int64_t done = done_;
    const int64_t total = summary_.total_bytes();
    py::gil_scoped_acquire gil;
    try {
      return CallbackOutcome(progress_(done, total), "progress");
    } catch (py::error_already_set& e) {
      return EscapedError(e, "progress");
    }
  }

  CkptWriter writer_;
  py::object progress_;
  v1::FetchPlanSummary summary_;
  int64_t done_ = 0;
};

// One connection (channel) to a ckptd server; thread-safe as CkptClient.
class NativeClient {
 public:
  explicit NativeClient(std::unique_ptr<CkptClient> client) : client_(std::move(client)) {}

  // Streams the serialized FetchRequest into the callbacks (module comment).
  Outcome Fetch(const py::bytes& request_bytes, py::object on_summary, py::object on_begin,
                py::object on_end, const StopFlag* stop) {
    v1::FetchRequest request;
    if (!request.ParseFromString(std::string(request_bytes))) {
      return {static_cast<int>(absl::StatusCode::kInvalidArgument), "malformed FetchRequest"};
    }
    absl::Status status;
    std::optional<py::error_already_set> signal_error;
    {
      ArrayVisitor visitor(std::move(on_summary), std::move(on_begin), std::move(on_end), stop);
      {
        py::gil_scoped_release unlocked;
        status = client_->Fetch(request, visitor);
      }
      signal_error = std::move(visitor.signal_error());
    }
    if (signal_error) throw std::move(*signal_error);
    return ToOutcome(status);
  }

  // Writes the fetch as a .ckpt at `path` atomically (nothing there unless it succeeded).
  // Returns the outcome and, on success, the serialized plan summary.
  std::pair<Outcome, py::bytes> FetchToFile(const py::bytes& request_bytes,
                                            const std::string& path, py::object progress) {
    v1::FetchRequest request;
    if (!request.ParseFromString(std::string(request_bytes))) {
      return {{static_cast<int>(absl::StatusCode::kInvalidArgument), "malformed FetchRequest"},
              py::bytes()};
    }
    absl::Status status;
    std::string summary;
    {
      py::gil_scoped_release unlocked;
      absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
      if (!sink.ok()) {
        status = sink.status();
      } else {
        // Destroyed before the sink it writes to; its destructor takes the GIL.
        FileVisitor visitor(sink->get(), std::move(progress));
        status = client_->Fetch(request, visitor);
        if (status.ok()) status = visitor.Finish();
        if (status.ok()) status = (*sink)->Commit();
        if (status.ok()) summary = visitor.summary().SerializeAsString();
      }
      // Leaving the scope drops the sink, which removes the temporary file unless committed.
    }
    return {ToOutcome(status), py::bytes(summary)};
  }

 private:
  std::unique_ptr<CkptClient> client_;
};

}  // namespace
}  // namespace ckpt

PYBIND11_MODULE(_native, m) {
  m.doc() = "ckptd's native fetch path over the C++ client library (see ckptd/_native_fetch.py)";
  // Counts the fetches this module ran, so that tests can tell the native path was taken.
  m.attr("fetch_count") = 0;

  py::class_<ckpt::StopFlag>(m, "StopFlag")
      .def(py::init<>())
      .def("set", &ckpt::StopFlag::Set)
      .def("is_set", &ckpt::StopFlag::IsSet);

  py::class_<ckpt::NativeClient>(m, "Client")
      .def("fetch",
           [m](ckpt::NativeClient& self, const py::bytes& request, py::object on_summary,
               py::object on_begin, py::object on_end, const ckpt::StopFlag* stop) {
             m.attr("fetch_count") = m.attr("fetch_count").cast<int64_t>() + 1;
             return self.Fetch(request, std::move(on_summary), std::move(on_begin),
                               std::move(on_end), stop);
           },
           py::arg("request"), py::arg("on_summary"), py::arg("on_begin"), py::arg("on_end"),
           py::arg("stop") = nullptr)
      .def("fetch_to_file",
           [m](ckpt::NativeClient& self, const py::bytes& request, const std::string& path,
               py::object progress) {
             m.attr("fetch_count") = m.attr("fetch_count").cast<int64_t>() + 1;
             return self.FetchToFile(request, path, std::move(progress));
           },
           py::arg("request"), py::arg("path"), py::arg("progress") = py::none());

  // connect(address, token_file, tls_ca, tls_cert, tls_key, timeout_seconds,
  // stream_window_bytes) -> (Client or None, (code, message)). Empty strings for options not
  // given.
  m.def("connect",
        [](const std::string& address, const std::string& token_file, const std::string& tls_ca,
           const std::string& tls_cert, const std::string& tls_key, double timeout_seconds,
           int stream_window_bytes) {
          ckpt::ClientOptions options;
          options.token_file = token_file;
          options.tls_ca = tls_ca;
          options.tls_cert = tls_cert;
          options.tls_key = tls_key;
          options.unary_timeout = absl::Seconds(timeout_seconds);
          // As the grpcio path's channel: a fixed window bounds what the client buffers.
          options.stream_window_bytes = stream_window_bytes;
          absl::StatusOr<std::unique_ptr<ckpt::CkptClient>> client;
          {
            py::gil_scoped_release unlocked;
            client = ckpt::CkptClient::Connect(address, options);
          }
          if (!client.ok()) {
            return std::make_pair(py::object(py::none()), ckpt::ToOutcome(client.status()));
          }
          return std::make_pair(
              py::cast(std::make_unique<ckpt::NativeClient>(std::move(*client))),
              ckpt::ToOutcome(absl::OkStatus()));
        });
}
