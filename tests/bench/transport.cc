#include "tests/bench/transport.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include <google/protobuf/io/coded_stream.h>
#include <grpc/slice.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checksum.h"
#include "transport_service.grpc.pb.h"
#include "transport_service.pb.h"

namespace ckpt::bench {
namespace {

// One outstanding write at a time, as ckptd's Fetch reactor does. The method is registered raw
// so that, like ckptd's Fetch, a message read from a file goes out as a slice over the buffer it
// was read into; the transport limit's prepared message is serialised for every write, as a
// protobuf-typed reactor would.
class StreamWriter final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit StreamWriter(const grpc::ByteBuffer* request_bytes) {
    StreamRequest request;
    grpc::ByteBuffer request_copy(*request_bytes);  // Deserialize consumes its buffer
    if (!grpc::SerializationTraits<StreamRequest>::Deserialize(&request_copy, &request).ok() ||
        request.messages() < 0 || request.message_bytes() < 1) {
      Fail(grpc::StatusCode::INVALID_ARGUMENT, "bad StreamRequest");
      return;
    }
    left_ = request.messages();
    message_bytes_ = static_cast<size_t>(request.message_bytes());
    for (const std::string& path : request.source_files()) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        Fail(grpc::StatusCode::NOT_FOUND,
             absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
        return;
      }
      files_.push_back({fd, path});
    }
    if (files_.empty()) {
      std::string* data = prepared_.mutable_data();
      data->resize(message_bytes_);
      for (size_t i = 0; i < data->size(); ++i) (*data)[i] = static_cast<char>(i * 131 + 7);
      prepared_.add_part_bytes(message_bytes_);
      prepared_.add_part_checksums(0x0123456789abcdefull);
    }
    Next();
  }
  ~StreamWriter() override {
    for (const File& f : files_) ::close(f.fd);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  struct File {
    int fd;
    std::string path;
  };

  void Fail(grpc::StatusCode code, const std::string& message) {
    failed_ = true;
    Finish(grpc::Status(code, message));
  }

  // Reads the next message_bytes_ of the files into a fresh slice, continuing where the previous
  // message ended, and frames it as a StreamChunk of one part with its checksum (ckptd's).
  bool ReadMessage() {
    grpc_slice raw = grpc_slice_malloc(message_bytes_);
    grpc::Slice data(raw, grpc::Slice::STEAL_REF);
    char* out = reinterpret_cast<char*>(GRPC_SLICE_START_PTR(raw));
    size_t filled = 0;
    size_t empty_files = 0;
    while (filled < message_bytes_) {
      const File& f = files_[file_];
      const ssize_t n = ::pread(f.fd, out + filled, message_bytes_ - filled, offset_);
      if (n < 0) {
        Fail(grpc::StatusCode::DATA_LOSS,
             absl::StrCat("reading ", f.path, ": ", std::strerror(errno)));
        return false;
      }
      if (n == 0) {  // end of this file: the next one (or the first again)
        if (++empty_files > files_.size()) {
          Fail(grpc::StatusCode::FAILED_PRECONDITION, "the source files are empty");
          return false;
        }
        file_ = (file_ + 1) % files_.size();
        offset_ = 0;
        continue;
      }
      empty_files = 0;
      filled += static_cast<size_t>(n);
      offset_ += n;
    }
    const uint64_t checksum = Checksum(std::string_view(out, message_bytes_));
    // StreamChunk.data = 1 (length-delimited), StreamChunk.part_bytes = 2 (packed varints),
    // StreamChunk.part_checksums = 3 (packed fixed64): as ckptd's FetchData.
    using google::protobuf::io::CodedOutputStream;
    uint8_t head[1 + 10];
    head[0] = (1 << 3) | 2;
    const size_t head_size =
        CodedOutputStream::WriteVarint64ToArray(message_bytes_, head + 1) - head;
    uint8_t tail[2 * (1 + 10) + 10 + 8];
    uint8_t* tail_end = tail;
    *tail_end++ = (2 << 3) | 2;
    tail_end = CodedOutputStream::WriteVarint64ToArray(
        CodedOutputStream::VarintSize64(message_bytes_), tail_end);
    tail_end = CodedOutputStream::WriteVarint64ToArray(message_bytes_, tail_end);
    *tail_end++ = (3 << 3) | 2;
    tail_end = CodedOutputStream::WriteVarint64ToArray(8, tail_end);
    tail_end = CodedOutputStream::WriteLittleEndian64ToArray(checksum, tail_end);
    const auto tail_size = static_cast<size_t>(tail_end - tail);
    grpc::Slice slices[3] = {grpc::Slice(head, head_size), std::move(data),
                             grpc::Slice(tail, tail_size)};
    message_ = grpc::ByteBuffer(slices, 3);
    return true;
  }

  void Next() {
    if (failed_) return;
    if (left_-- > 0) {
      if (!files_.empty()) {
        if (!ReadMessage()) return;
      } else {
        bool own = false;
        message_.Clear();  // the serialiser writes into an empty buffer only
        if (!grpc::SerializationTraits<StreamChunk>::Serialize(prepared_, &message_, &own).ok()) {
          Fail(grpc::StatusCode::INTERNAL, "cannot serialise the prepared message");
          return;
        }
      }
      StartWrite(&message_);
    } else {
      Finish(grpc::Status::OK);
    }
  }

  StreamChunk prepared_;
  grpc::ByteBuffer message_;
  int64_t left_ = 0;
  size_t message_bytes_ = 0;
  std::vector<File> files_;
  size_t file_ = 0;
  off_t offset_ = 0;
  bool failed_ = false;
};

class TransportImpl final
    : public Transport::WithRawCallbackMethod_Stream<Transport::CallbackService> {
 public:
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Stream(grpc::CallbackServerContext*,
                                                     const grpc::ByteBuffer* request) override {
    return new StreamWriter(request);
  }
};

}  // namespace

int RunTransportServer(const std::string& port_file) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  TransportImpl service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "transport server: cannot listen\n");
    return 1;
  }
  {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

absl::StatusOr<TransportResult> MeasureTransport(const std::string& address, int64_t messages,
                                                 int64_t message_bytes,
                                                 const std::vector<std::string>& source_files) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);  // as ClientOptions::max_receive_message_bytes
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return absl::UnavailableError(absl::StrCat("transport server at ", address, " unreachable"));
  }
  auto stub = Transport::NewStub(channel);
  auto run = [&](int64_t n) -> absl::StatusOr<TransportResult> {
    grpc::ClientContext context;
    StreamRequest request;
    request.set_messages(n);
    request.set_message_bytes(message_bytes);
    for (const std::string& f : source_files) request.add_source_files(f);
    const auto start = std::chrono::steady_clock::now();
    auto reader = stub->Stream(&context, request);
    StreamChunk chunk;
    TransportResult result;
    absl::Status verified;
    while (reader->Read(&chunk)) {
      if (!source_files.empty() && verified.ok() &&
          (chunk.part_bytes_size() != 1 || chunk.part_bytes(0) != chunk.data().size() ||
           chunk.part_checksums_size() != 1 ||
           Checksum(chunk.data()) != chunk.part_checksums(0))) {
        verified = absl::DataLossError(absl::StrFormat(
            "transport message at byte %d failed its checksum", result.bytes));
        context.TryCancel();
      }
      result.bytes += static_cast<int64_t>(chunk.data().size());
    }
    const grpc::Status status = reader->Finish();
    if (!verified.ok()) return verified;
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("transport stream: ", status.error_message()));
    }
    if (result.bytes != n * message_bytes) {
      return absl::InternalError(absl::StrCat("transport stream delivered ", result.bytes,
                                              " bytes, expected ", n * message_bytes));
    }
    return result;
  };
  // Warm-up: connection windows grow (BDP probing) during the first MiBs of a stream.
  if (auto warm = run(std::min<int64_t>(messages, 32)); !warm.ok()) return warm.status();
  return run(messages);
}

}  // namespace ckpt::bench
