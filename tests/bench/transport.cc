#include "tests/bench/transport.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "transport_service.grpc.pb.h"
#include "transport_service.pb.h"

namespace ckpt::bench {
namespace {

// One outstanding write at a time, as ckptd's Fetch reactor does; the message is built once.
class StreamWriter final : public grpc::ServerWriteReactor<StreamChunk> {
 public:
  StreamWriter(int64_t messages, int64_t message_bytes) : left_(messages) {
    std::string* data = chunk_.mutable_data();
    data->resize(static_cast<size_t>(message_bytes));
    for (size_t i = 0; i < data->size(); ++i) (*data)[i] = static_cast<char>(i * 131 + 7);
    chunk_.set_xxh64(0x0123456789abcdefull);
    Next();
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
  void Next() {
    if (left_-- > 0) {
      StartWrite(&chunk_);
    } else {
      Finish(grpc::Status::OK);
    }
  }
  StreamChunk chunk_;
  int64_t left_;
};

class TransportImpl final : public Transport::CallbackService {
 public:
  grpc::ServerWriteReactor<StreamChunk>* Stream(grpc::CallbackServerContext*,
                                                const StreamRequest* request) override {
    return new StreamWriter(request->messages(), request->message_bytes());
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
                                                 int64_t message_bytes) {
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
    const auto start = std::chrono::steady_clock::now();
    auto reader = stub->Stream(&context, request);
    StreamChunk chunk;
    TransportResult result;
    while (reader->Read(&chunk)) result.bytes += static_cast<int64_t>(chunk.data().size());
    const grpc::Status status = reader->Finish();
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
