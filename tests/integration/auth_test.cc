// Security of a real ckptd: TLS and mutual TLS with certificates made by
// deploy/make-test-pki.sh (the openssl CLI) at test time, bearer tokens, the role table applied to
// every method of the service descriptor, SIGHUP reloads with a stream open across them, secure
// defaults, per-principal limits, and the token file's parser.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "service/rpc/auth_policy.h"
#include "service/rpc/auth_tokens.h"
#include "service/rpc/server.h"
#include "tests/testing/server_process.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

using ::ckpt::testing::RunSubprocess;
using ::ckpt::testing::ServerProcess;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

// The checkpoint every test stores, and whose name a denied caller must never see.
constexpr char kSecret[] = "secret-ckpt";

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) {
  // Written beside and renamed into place, as an operator replacing a file should.
  std::ofstream(path + ".new", std::ios::binary) << text;
  std::filesystem::rename(path + ".new", path);
}

std::string Token(const std::string& pki, const std::string& role) {
  std::string t = ReadText(pki + "/" + role + ".token");
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

// A CA, server and client certificates and three tokens (admin, writer, reader), by the script
// the documentation tells operators to use.
void MakePki(const std::string& dir) {
  auto r = RunSubprocess({"/bin/bash", CKPT_PKI_SCRIPT, dir});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->stderr_text;
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& ca,
                                          const std::string& cert = "", const std::string& key = "",
                                          bool bdp_probe = true) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadText(ca);
  if (!cert.empty()) {
    ssl.pem_cert_chain = ReadText(cert);
    ssl.pem_private_key = ReadText(key);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  // Each channel its own connection, so that a reload is seen by the next channel made.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!bdp_probe) args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

struct RawResult {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
  std::string bytes;  // every response message, concatenated
  int messages = 0;
};

// Calls any method of the service with one serialized request, as a generic stream (the wire
// form of unary, client- and server-streaming calls alike), reading every response.
RawResult CallRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                  const std::string& request, const std::string& token) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  grpc::CompletionQueue cq;
  void* tag = nullptr;
  bool ok = false;
  auto call = stub.PrepareCall(&ctx, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  if (ok) {
    grpc::Slice slice(request);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  if (ok) {
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  }
  RawResult result;
  while (true) {
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(4));
    if (!cq.Next(&tag, &ok) || !ok) break;
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    for (const grpc::Slice& s : slices) {
      result.bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    ++result.messages;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  result.code = status.error_code();
  result.message = status.error_message();
  return result;
}

// A request of `method`'s input type with every top-level id field naming `id` (and `merged` set,
// so that a Fetch of a stored checkpoint is valid and streams tensor bytes).
std::string RequestFor(const google::protobuf::MethodDescriptor* method, const std::string& id) {
  const google::protobuf::Message* prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->input_type());
  std::unique_ptr<google::protobuf::Message> m(prototype->New());
  const google::protobuf::Reflection* r = m->GetReflection();
  for (int i = 0; i < method->input_type()->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = method->input_type()->field(i);
    if (f->is_repeated()) continue;
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
        (f->name() == "checkpoint_id" || f->name() == "name" || f->name() == "job_id")) {
      r->SetString(m.get(), f, id);
    }
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_BOOL && f->name() == "merged") {
      r->SetBool(m.get(), f, true);
    }
  }
  return m->SerializeAsString();
}

ClientOptions ClientTls(const std::string& pki, const std::string& role) {
  ClientOptions o;
  o.tls_ca = pki + "/ca.pem";
  if (!role.empty()) o.token_file = pki + "/" + role + ".token";
  return o;
}

// Stores the demo checkpoint with every dimension x16 (slices span several messages, so a fetch
// that reads only its first message keeps the stream open) as kSecret, with strategies src and
// dst.
void StoreSecret(CkptClient& admin, const std::filesystem::path& dir) {
  std::vector<SampleTensor> tensors = DemoTensors();
  for (SampleTensor& t : tensors) {
    for (int64_t& d : t.global_shape) d *= 16;
  }
  ASSERT_TRUE(WriteShardedSample(DemoSourceStrategy(), tensors, dir / "big", {}).ok());
  ASSERT_TRUE(admin.PutStrategy("src", DemoSourceStrategy(), false).ok());
  ASSERT_TRUE(admin.PutStrategy("dst", DemoDestinationStrategy(), false).ok());
  UploadDirectoryOptions one_at_a_time;  // within --max-uploads-per-principal 1
  one_at_a_time.parallelism = 1;
  auto up = admin.UploadDirectory(kSecret, "src", dir / "big", one_at_a_time);
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(up->committed);
}

// A server with TLS and the PKI's tokens, and the secret checkpoint stored.
class TlsServerTest : public ::testing::Test {
 protected:
  void StartServer(const std::vector<std::string>& extra = {}) {
    MakePki(pki_);
    ASSERT_FALSE(HasFailure());
    std::vector<std::string> args = {"--tls-cert",    pki_ + "/server.pem",
                                     "--tls-key",     pki_ + "/server.key",
                                     "--auth-tokens", pki_ + "/tokens.txt"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = ServerProcess::Start(CKPTD_PATH, dir_ / "data", args);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto admin = CkptClient::Connect(server_->address(), ClientTls(pki_, "admin"));
    ASSERT_TRUE(admin.ok()) << admin.status();
    admin_ = std::move(*admin);
    StoreSecret(*admin_, dir_.path());
  }

  TempDir dir_;
  const std::string pki_ = dir_ / "pki";
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> admin_;
};

// The role table of the issue, written out independently of the server's: the test fails when
// the server's table (service/rpc/auth_policy.cc) or its enforcement disagrees, or when the
// service gains a method neither table knows.
const std::map<std::string, Role>& ExpectedRoles() {
  static const std::map<std::string, Role> roles = {
      {"PutStrategy", Role::kWriter},
      {"GetStrategy", Role::kReader},
      {"ListStrategies", Role::kReader},
      {"DeleteStrategy", Role::kAdmin},
      {"Upload", Role::kWriter},
      {"ListCheckpoints", Role::kReader},
      {"DescribeCheckpoint", Role::kReader},
      {"DeleteCheckpoint", Role::kAdmin},
      {"Fetch", Role::kReader},
      {"RankDependencies", Role::kReader},
      {"SubmitTransform", Role::kWriter},
      {"GetJob", Role::kReader},
      {"WatchJob", Role::kReader},
      {"CancelJob", Role::kWriter},
      {"ListJobs", Role::kReader},
      {"GetStats", Role::kAdmin},
      {"DeleteJob", Role::kWriter},
      {"Backup", Role::kAdmin},
  };
  return roles;
}

TEST_F(TlsServerTest, EveryMethodAnswersEveryCallerAsTheRoleTableSays) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ASSERT_TRUE(CheckPolicyCoversService().ok()) << CheckPolicyCoversService();
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "ckpt.v1.CheckpointService");
  ASSERT_NE(service, nullptr);
  auto channel = TlsChannel(server_->address(), pki_ + "/ca.pem");
  struct Caller {
    std::string name;
    std::string token;
    std::optional<Role> role;  // nullopt: not authenticated
  };
  const std::vector<Caller> callers = {
      {"nobody", "", std::nullopt},
      {"wrong-token", "not-a-token-of-this-server", std::nullopt},
      {"reader", Token(pki_, "reader"), Role::kReader},
      {"writer", Token(pki_, "writer"), Role::kWriter},
      {"admin", Token(pki_, "admin"), Role::kAdmin},
  };
  int calls = 0;
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* method = service->method(i);
    const std::string full = FullMethodName(method->name());
    SCOPED_TRACE(full);
    auto expected = ExpectedRoles().find(method->name());
    ASSERT_NE(expected, ExpectedRoles().end()) << "no expected role for " << full;
    const MethodPolicy* policy = FindMethodPolicy(full);
    ASSERT_NE(policy, nullptr) << full << " is missing from the server's role table";
    EXPECT_EQ(policy->min_role, expected->second);
    for (const Caller& caller : callers) {
      SCOPED_TRACE(caller.name);
      // An admin's deletes name another object, so that the secret stays for later methods.
      const bool destructive =
          caller.role == Role::kAdmin && method->name().rfind("Delete", 0) == 0;
      const RawResult r = CallRaw(
          channel, full, RequestFor(method, destructive ? "scratch" : kSecret), caller.token);
      ++calls;
      if (!caller.role) {
        EXPECT_EQ(r.code, grpc::StatusCode::UNAUTHENTICATED) << r.message;
      } else if (*caller.role < expected->second) {
        EXPECT_EQ(r.code, grpc::StatusCode::PERMISSION_DENIED) << r.message;
        EXPECT_THAT(r.message, HasSubstr(caller.name));
        EXPECT_THAT(r.message, HasSubstr("needs role " + std::string(RoleName(expected->second))));
      } else {
        EXPECT_NE(r.code, grpc::StatusCode::UNAUTHENTICATED) << r.message;
        EXPECT_NE(r.code, grpc::StatusCode::PERMISSION_DENIED) << r.message;
        if (method->name() == "Fetch") {
          EXPECT_EQ(r.code, grpc::StatusCode::OK) << r.message;
          EXPECT_GT(r.bytes.size(), size_t{1} << 20);  // the tensors, for an allowed reader
        }
      }
      if (!caller.role || *caller.role < expected->second) {
        // Nothing of the store reaches a denied caller.
        EXPECT_EQ(r.messages, 0);
        EXPECT_TRUE(r.bytes.empty());
        EXPECT_THAT(r.message, Not(HasSubstr(kSecret)));
      }
    }
  }
  EXPECT_EQ(calls, service->method_count() * static_cast<int>(callers.size()));
  EXPECT_EQ(service->method_count(), static_cast<int>(ExpectedRoles().size()));
  // Denials are audited.
  EXPECT_THAT(server_->Log(), HasSubstr("audit event=audit principal=reader role=reader "
                                        "method=DeleteCheckpoint"));
  EXPECT_THAT(server_->Log(), HasSubstr("outcome=UNAUTHENTICATED"));
  // Health stays open to probes without credentials.
  const RawResult health = CallRaw(channel, "/grpc.health.v1.Health/Check", "", "");
  EXPECT_EQ(health.code, grpc::StatusCode::OK) << health.message;
}

TEST_F(TlsServerTest, WritersCancelOnlyTheirOwnJobsAndLimitsArePerPrincipal) {
  ASSERT_NO_FATAL_FAILURE(StartServer(
      {"--max-fetch-streams-per-principal", "1", "--max-uploads-per-principal", "1",
       "--max-queued-jobs-per-principal", "1", "--job-workers", "1", "--job-bandwidth-mib", "1"}));
  auto writer = CkptClient::Connect(server_->address(), ClientTls(pki_, "writer"));
  ASSERT_TRUE(writer.ok());
  auto reader = CkptClient::Connect(server_->address(), ClientTls(pki_, "reader"));
  ASSERT_TRUE(reader.ok());

  // Jobs: owner recorded; a second unfinished job of the writer is over its limit; another
  // principal's job cannot be cancelled by a writer, its own can.
  v1::SubmitTransformRequest job;
  job.set_checkpoint_id(kSecret);
  job.set_destination_strategy("dst");
  job.mutable_target()->set_new_checkpoint_id("copy1");
  auto first = (*writer)->SubmitTransform(job);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->job().owner(), "writer");
  job.mutable_target()->set_new_checkpoint_id("copy2");
  auto second = (*writer)->SubmitTransform(job);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("--max-queued-jobs-per-principal"));
  job.mutable_target()->set_new_checkpoint_id("copy3");
  auto admins = admin_->SubmitTransform(job);
  ASSERT_TRUE(admins.ok()) << admins.status();
  EXPECT_EQ(admins->job().owner(), "admin");
  auto not_mine = (*writer)->CancelJob(admins->job().id());
  EXPECT_EQ(not_mine.status().code(), absl::StatusCode::kPermissionDenied) << not_mine.status();
  EXPECT_THAT(not_mine.status().message(), HasSubstr("needs role admin"));
  auto mine = (*writer)->CancelJob(first->job().id());
  EXPECT_TRUE(mine.ok()) << mine.status();
  EXPECT_TRUE(admin_->CancelJob(admins->job().id()).ok());
  EXPECT_EQ((*reader)->CancelJob(admins->job().id()).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Removing a finished job's record follows the same rule as cancelling it.
  absl::Status remove_others = (*writer)->DeleteJob(admins->job().id());
  EXPECT_EQ(remove_others.code(), absl::StatusCode::kPermissionDenied) << remove_others;
  EXPECT_THAT(remove_others.message(), HasSubstr("needs role admin"));
  EXPECT_EQ((*reader)->DeleteJob(first->job().id()).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*writer)->DeleteJob(first->job().id()).ok());
  EXPECT_TRUE(admin_->DeleteJob(admins->job().id()).ok());

  // Fetch streams: the reader's one held stream blocks its second; the admin is not affected.
  auto held_channel = TlsChannel(server_->address(), pki_ + "/ca.pem", "", "", false);
  auto stub = v1::CheckpointService::NewStub(held_channel);
  grpc::ClientContext held;
  held.AddMetadata("authorization", "Bearer " + Token(pki_, "reader"));
  v1::FetchRequest merged;
  merged.set_checkpoint_id(kSecret);
  merged.set_merged(true);
  auto stream = stub->Fetch(&held, merged);
  v1::FetchResponse m;
  ASSERT_TRUE(stream->Read(&m));
  auto over = (*reader)->FetchAll(merged);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(over.status().message(), HasSubstr("--max-fetch-streams-per-principal"));
  EXPECT_TRUE(admin_->FetchAll(merged).ok());
  held.TryCancel();
  while (stream->Read(&m)) {
  }
  (void)stream->Finish();
  // The slot is given back when the stream ends.
  absl::Status again;
  for (int i = 0; i < 100; ++i) {
    again = (*reader)->FetchAll(merged).status();
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(again.ok()) << again;

  // Uploads: an open upload stream of the writer blocks its second. The held stream and the
  // probe travel on different channels, so the probe may reach the server first and take the
  // writer's one slot (the held stream is then the one refused): each round holds a fresh stream
  // and probes a checkpoint of its own, until a probe meets the held stream.
  absl::Status second_upload;
  for (int i = 0; i < 50; ++i) {
    grpc::ClientContext upload_ctx;
    upload_ctx.AddMetadata("authorization", "Bearer " + Token(pki_, "writer"));
    v1::UploadResponse upload_response;
    auto upload = stub->Upload(&upload_ctx, &upload_response);
    v1::UploadRequest header;
    header.mutable_header()->set_checkpoint_id("partial");
    header.mutable_header()->set_source_strategy("src");
    header.mutable_header()->set_rank(0);
    // Refused while the previous round's stream still held the slot: a new round.
    if (!upload->Write(header)) {
      (void)upload->Finish();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * i));
    second_upload =
        (*writer)
            ->UploadRank(absl::StrCat("probe", i), "src", 1, dir_ / "big/rank_1/sample-1_10.ckpt")
            .status();
    upload_ctx.TryCancel();
    (void)upload->Finish();
    if (second_upload.code() == absl::StatusCode::kResourceExhausted) break;
  }
  EXPECT_EQ(second_upload.code(), absl::StatusCode::kResourceExhausted) << second_upload;
  EXPECT_THAT(second_upload.message(), HasSubstr("--max-uploads-per-principal"));
  EXPECT_THAT(server_->Log(), HasSubstr("method=CancelJob"));
}

TEST(MutualTlsTest, OnlyCertificatesOfTheClientCaConnect) {
  TempDir dir;
  const std::string pki = dir / "pki";
  const std::string other = dir / "other";
  MakePki(pki);
  MakePki(other);
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto server = ServerProcess::Start(
      CKPTD_PATH, dir / "data",
      {"--tls-cert", pki + "/server.pem", "--tls-key", pki + "/server.key", "--tls-client-ca",
       pki + "/ca.pem", "--auth-tokens", pki + "/tokens.txt"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string list = "/ckpt.v1.CheckpointService/ListCheckpoints";
  const std::string del = "/ckpt.v1.CheckpointService/DeleteCheckpoint";
  // No certificate, even with a valid admin token: the handshake fails.
  auto no_cert =
      CallRaw(TlsChannel((*server)->address(), pki + "/ca.pem"), list, "", Token(pki, "admin"));
  EXPECT_EQ(no_cert.code, grpc::StatusCode::UNAVAILABLE) << no_cert.message;
  // A certificate of another CA.
  auto foreign = CallRaw(TlsChannel((*server)->address(), pki + "/ca.pem", other + "/client.pem",
                                    other + "/client.key"),
                         list, "", Token(pki, "admin"));
  EXPECT_EQ(foreign.code, grpc::StatusCode::UNAVAILABLE) << foreign.message;
  // The right CA: CN=operator is admin by its `operator admin cert` line; a token, when sent,
  // names the principal instead.
  auto good =
      TlsChannel((*server)->address(), pki + "/ca.pem", pki + "/client.pem", pki + "/client.key");
  EXPECT_EQ(CallRaw(good, list, "", "").code, grpc::StatusCode::OK);
  auto as_reader = CallRaw(good, del, "", Token(pki, "reader"));
  EXPECT_EQ(as_reader.code, grpc::StatusCode::PERMISSION_DENIED) << as_reader.message;
  EXPECT_THAT(as_reader.message, HasSubstr("principal reader"));
  // Through the client library as ckptctl uses it.
  ClientOptions options;
  options.tls_ca = pki + "/ca.pem";
  options.tls_cert = pki + "/client.pem";
  options.tls_key = pki + "/client.key";
  auto client = CkptClient::Connect((*server)->address(), options);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->ListCheckpoints().ok());
}

TEST_F(TlsServerTest, SighupReloadsCertificatesAndTokensWithAFetchStreamOpenAcrossIt) {
  // The server reads copies, which the test then replaces.
  const std::string live = dir_ / "live";
  std::filesystem::create_directories(live);
  MakePki(pki_);
  ASSERT_FALSE(HasFailure());
  for (const char* f : {"server.pem", "server.key", "tokens.txt"}) {
    std::filesystem::copy_file(pki_ + "/" + f, live + "/" + f);
  }
  auto server = ServerProcess::Start(CKPTD_PATH, dir_ / "data",
                                     {"--tls-cert", live + "/server.pem", "--tls-key",
                                      live + "/server.key", "--auth-tokens", live + "/tokens.txt"});
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  auto admin = CkptClient::Connect(server_->address(), ClientTls(pki_, "admin"));
  ASSERT_TRUE(admin.ok());
  ASSERT_NO_FATAL_FAILURE(StoreSecret(**admin, dir_.path()));
  v1::FetchRequest merged;
  merged.set_checkpoint_id(kSecret);
  merged.set_merged(true);
  auto whole = (*admin)->FetchAll(merged);
  ASSERT_TRUE(whole.ok());
  int64_t whole_bytes = 0;
  for (const FetchedTensor& t : *whole) whole_bytes += static_cast<int64_t>(t.data.size());

  // A reader's fetch, held after its first message.
  auto stub = v1::CheckpointService::NewStub(
      TlsChannel(server_->address(), pki_ + "/ca.pem", "", "", false));
  grpc::ClientContext held;
  held.AddMetadata("authorization", "Bearer " + Token(pki_, "reader"));
  auto stream = stub->Fetch(&held, merged);
  v1::FetchResponse m;
  ASSERT_TRUE(stream->Read(&m));

  // A new CA's server certificate; the reader's token removed, a new one added.
  const std::string next = dir_ / "next";
  MakePki(next);
  ASSERT_FALSE(HasFailure());
  const std::string new_token = "fresh-token-for-newbie";
  std::string tokens = ReadText(pki_ + "/tokens.txt");
  tokens = tokens.substr(0, tokens.find("reader reader")) +
           absl::StrCat("newbie reader ", DigestHex(Sha256(new_token)), "\n");
  WriteText(live + "/tokens.txt", tokens);
  WriteText(live + "/server.key", ReadText(next + "/server.key"));
  WriteText(live + "/server.pem", ReadText(next + "/server.pem"));
  ASSERT_EQ(kill(server_->pid(), SIGHUP), 0);

  const std::string list = "/ckpt.v1.CheckpointService/ListCheckpoints";
  RawResult fresh;
  for (int i = 0; i < 100; ++i) {  // the certificate watcher polls every second
    fresh = CallRaw(TlsChannel(server_->address(), next + "/ca.pem"), list, "", new_token);
    if (fresh.code == grpc::StatusCode::OK) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(fresh.code, grpc::StatusCode::OK) << fresh.message;
  EXPECT_EQ(
      CallRaw(TlsChannel(server_->address(), next + "/ca.pem"), list, "", Token(pki_, "reader"))
          .code,
      grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(
      CallRaw(TlsChannel(server_->address(), pki_ + "/ca.pem"), list, "", Token(pki_, "admin"))
          .code,
      grpc::StatusCode::UNAVAILABLE)
      << "a new connection trusting only the old CA must fail";

  // The held stream completes with every byte.
  int64_t bytes = 0;
  while (stream->Read(&m)) {
    if (m.has_data()) bytes += static_cast<int64_t>(m.data().data().size());
  }
  const grpc::Status done = stream->Finish();
  EXPECT_TRUE(done.ok()) << done.error_message();
  EXPECT_EQ(bytes, whole_bytes);

  // A malformed token file on SIGHUP keeps the table in force and says why.
  WriteText(live + "/tokens.txt", "admin admin not-a-hash\n");
  ASSERT_EQ(kill(server_->pid(), SIGHUP), 0);
  bool logged = false;
  for (int i = 0; i < 100 && !logged; ++i) {
    logged = server_->Log().find("outcome=kept_previous") != std::string::npos;
    if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(logged) << server_->Log();
  EXPECT_THAT(server_->Log(), HasSubstr("tokens.txt:1: the third field"));
  EXPECT_EQ(CallRaw(TlsChannel(server_->address(), next + "/ca.pem"), list, "", new_token).code,
            grpc::StatusCode::OK);
}

TEST(SecureDefaultsTest, RefusesToServeANetworkWithoutAuthentication) {
  TempDir dir;
  auto open = RunSubprocess({CKPTD_PATH, "--listen", "0.0.0.0:0", "--data", dir / "data"});
  ASSERT_TRUE(open.ok());
  EXPECT_NE(open->exit_code, 0);
  EXPECT_THAT(open->stderr_text,
              HasSubstr("refusing to listen on 0.0.0.0:0 without authentication"));
  EXPECT_THAT(open->stderr_text, HasSubstr("--insecure"));
  // Tokens without TLS would cross the network in clear text.
  MakePki(dir / "pki");
  auto clear = RunSubprocess({CKPTD_PATH, "--listen", "0.0.0.0:0", "--data", dir / "data",
                              "--auth-tokens", dir / "pki/tokens.txt"});
  ASSERT_TRUE(clear.ok());
  EXPECT_NE(clear->exit_code, 0);
  EXPECT_THAT(clear->stderr_text, HasSubstr("without TLS"));
  // A malformed token file: no start, the line named.
  std::ofstream(dir / "bad.txt") << "# principals\nalice admin\n";
  auto bad = RunSubprocess({CKPTD_PATH, "--listen", "127.0.0.1:0", "--data", dir / "data",
                            "--auth-tokens", dir / "bad.txt"});
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(bad->exit_code, 0);
  EXPECT_THAT(bad->stderr_text, HasSubstr("bad.txt:2: expected NAME ROLE SHA256HEX"));
}

TEST(SecureDefaultsTest, InsecureServesANetworkAfterOneWarningLine) {
  TempDir dir;
  testing::SubprocessOptions briefly;
  briefly.timeout = std::chrono::milliseconds(3000);
  auto r = RunSubprocess(
      {CKPTD_PATH, "--listen", "0.0.0.0:0", "--data", dir / "data", "--insecure"}, briefly);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out) << "ckptd should have kept serving: " << r->stderr_text;
  EXPECT_THAT(r->stderr_text,
              HasSubstr("ckptd: WARNING: --insecure: serving on 0.0.0.0:0 without authentication"));
  EXPECT_THAT(r->stdout_text, HasSubstr("event=insecure listen=0.0.0.0:0"));
}

TEST(SecureDefaultsTest, LoopbackAddressesAreRecognised) {
  for (const char* a : {"127.0.0.1:50051", "127.9.8.7:1", "localhost:50051", "[::1]:50051",
                        "unix:/run/ckptd.sock", "unix-abstract:ckptd"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.1:50051",
                        "ckptd.example:50051", "128.0.0.1:1", "127.0.0.1.5:1", "[::1:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(TokenTableTest, ParsesPrincipalsAndNamesTheBadLine) {
  // The same digest as `printf %s s3cret | sha256sum`.
  const std::string hash = "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0";
  EXPECT_EQ(DigestHex(Sha256("s3cret")), hash);
  auto table = TokenTable::Parse(
      absl::StrCat("# comment\n\n  alice writer ", hash, "  # trailing comment\nop admin cert\n"),
      "t.txt");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  ASSERT_NE(table->FindToken("s3cret"), nullptr);
  EXPECT_EQ(table->FindToken("s3cret")->name, "alice");
  EXPECT_EQ(table->FindToken("s3cret")->role, Role::kWriter);
  EXPECT_EQ(table->FindToken("s3cre"), nullptr);
  EXPECT_EQ(table->FindToken(""), nullptr);
  EXPECT_EQ(table->FindCert("alice"), nullptr);  // a token line is not a certificate line
  ASSERT_NE(table->FindCert("op"), nullptr);
  EXPECT_EQ(table->FindCert("op")->role, Role::kAdmin);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"alice writer\n", "t.txt:1: expected NAME ROLE SHA256HEX"},
      {absl::StrCat("\nalice root ", hash), "t.txt:2: unknown role \"root\""},
      {"alice reader ABC\n", "t.txt:1: the third field must be"},
      {absl::StrCat("alice reader ", std::string(64, 'A')), "64 lowercase hex digits"},
      {absl::StrCat("al/ice reader ", hash), "principal name \"al/ice\""},
      {absl::StrCat("a reader ", hash, "\nb writer ", hash), "t.txt:2: this token hash is"},
      {absl::StrCat("a reader ", hash, "\na writer cert"), "t.txt:2: principal a was given role"},
      {"# nothing\n", "no principal"},
  };
  for (const auto& [text, message] : bad) {
    auto t = TokenTable::Parse(text, "t.txt");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(t.status().message(), HasSubstr(message)) << text;
  }
  EXPECT_EQ(TokenTable::Load("/nonexistent/tokens.txt").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt
