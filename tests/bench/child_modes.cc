#include "tests/bench/child_modes.h"

#include <cstdio>
#include <iostream>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/malloc_tuning.h"
#include "tests/bench/baseline.h"
#include "tests/bench/bench_common.h"
#include "tests/bench/bench_data.h"
#include "tests/bench/child.h"
#include "tests/bench/fetch_verify.h"

namespace ckpt::bench {

int WorkerMain(const std::string& server, const std::string& strategy_name, int64_t rank,
               double size_gib) {
  // A worker stands for a user's program fetching its rank through the client library, which
  // opts in to the allocator policy the library documents for streaming (as ckptctl does).
  TuneMallocForStreaming();
  const BenchSpec spec = MakeSpec(SizeBytes(size_gib));
  auto destination = StrategyByName(spec, strategy_name);
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  auto client = CkptClient::Connect(server, options);
  if (!destination.ok() || !client.ok()) {
    std::printf("error %s\n",
                (!destination.ok() ? destination.status() : client.status()).ToString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  // One fetch of the rank per "go" line, until "quit".
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "quit") return 0;
    if (line != "go") {
      std::printf("error unknown command %s\n", line.c_str());
      return 1;
    }
    v1::FetchRequest request;
    request.set_checkpoint_id(kCheckpointId);
    request.set_destination_strategy(strategy_name);
    request.set_rank(rank);
    CheckingVisitor visitor(&spec, &*destination, rank, "");
    const auto start = Clock::now();
    const double cpu_start = SelfCpuSeconds();
    absl::Status status = (*client)->Fetch(request, visitor);
    const double seconds = Seconds(start);
    const double cpu = SelfCpuSeconds() - cpu_start;
    if (status.ok()) status = visitor.Complete();
    if (!status.ok()) {
      std::printf("error %s\n", status.ToString().c_str());
      return 1;
    }
    std::printf("ok %lld %.6f %lld %.6f\n", static_cast<long long>(visitor.bytes()), seconds,
                static_cast<long long>(visitor.checked()), cpu);
    std::fflush(stdout);
  }
  return 1;  // the harness went away without "quit"
}

int BaselineMain(const std::string& src_dir, const std::string& out_dir, double size_gib) {
  const BenchSpec spec = MakeSpec(SizeBytes(size_gib));
  const absl::Status status =
      NaiveTransform(spec, SourceStrategy(spec), ThreeRankStrategy(spec), src_dir, out_dir);
  if (!status.ok()) {
    std::fprintf(stderr, "baseline: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace ckpt::bench
