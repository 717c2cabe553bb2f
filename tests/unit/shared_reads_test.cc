// Read-once fan-out (service/engine/shared_chunks.h) in process: many fetch streams of a
// destination whose ranks share slices (data-parallel replicas) read each stored chunk once,
// deliver exactly what a lone fetch delivers, all fail with DATA_LOSS when a shared chunk is
// damaged, and a stream that goes away mid-read never harms the others sharing its read.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ckptctl/sample.h"
#include "core/checksum.h"
#include "gtest/gtest.h"
#include "service/engine/manager.h"
#include "service/engine/shared_chunks.h"
#include "storage/checkpoint_store.h"
#include "tests/testing/forwarding_store.h"
#include "tests/testing/manager_uploads.h"
#include "tests/testing/server_process.h"

namespace ckpt {
namespace {

constexpr uint64_t kSeed = 11;
constexpr int kTp = 8;  // tensor-parallel groups
constexpr int kDp = 8;  // data-parallel replicas of each

using testing::OwnedChunk;

// Around a memory store: reads of one chosen chunk come back with a byte flipped, and reads of
// one chosen chunk can be held at a gate until released. Counts reads per chunk.
class FaultyStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;

  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++reads_[address.ToString()];
      order_.push_back(address);
      if (gate_ && *gate_ == address) {
        ++at_gate_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !gate_closed_; });
      }
    }
    auto data = base().ReadChunkUnverified(address);
    std::lock_guard<std::mutex> lock(mu_);
    if (!data.ok() || !corrupt_ || !(*corrupt_ == address)) return data;
    std::string bytes((*data)->bytes());
    bytes[bytes.size() / 2] ^= 0x40;
    return std::unique_ptr<ChunkData>(new OwnedChunk(std::move(bytes)));
  }

  void Corrupt(std::optional<ChunkAddress> address) {
    std::lock_guard<std::mutex> lock(mu_);
    corrupt_ = address;
  }
  // Holds reads of `address` until OpenGate.
  void CloseGate(const ChunkAddress& address) {
    std::lock_guard<std::mutex> lock(mu_);
    gate_ = address;
    gate_closed_ = true;
    at_gate_ = 0;
  }
  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_closed_ = false;
    cv_.notify_all();
  }
  // Waits until `n` reads are held at the gate.
  void AwaitAtGate(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return at_gate_ >= n; });
  }
  std::map<std::string, int> TakeReads() {
    std::lock_guard<std::mutex> lock(mu_);
    order_.clear();
    return std::exchange(reads_, {});
  }
  // The chunks read since TakeReads, in order.
  std::vector<ChunkAddress> ReadOrder() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ChunkAddress> corrupt_;
  std::optional<ChunkAddress> gate_;
  bool gate_closed_ = false;
  int at_gate_ = 0;
  std::map<std::string, int> reads_;
  std::vector<ChunkAddress> order_;
};

// The tensors: row-split 8 ways at the source; at the destination half split by columns, half by
// rows, across the 8 tensor-parallel groups, each group replicated 8 ways.
std::vector<SampleTensor> Tensors() {
  std::vector<SampleTensor> out;
  for (int i = 0; i < 6; ++i) {
    out.push_back({absl::StrCat(i % 2 ? "col." : "row.", i),
                   i % 3 == 2 ? DType::kFloat16 : DType::kFloat32,
                   {64, 128}});
  }
  return out;
}

Strategy MakeStrategy(std::vector<int64_t> dev_matrix, bool destination) {
  std::map<std::string, StrategyParam> params;
  for (const SampleTensor& t : Tensors()) {
    Layout l;
    l.dev_matrix = dev_matrix;
    const bool columns = destination && t.name.starts_with("col.");
    // Axis 0 is the rightmost device axis: the tensor-parallel one (dev_matrix [dp, tp]).
    l.tensor_map = columns ? std::vector<std::vector<int32_t>>{{}, {0}}
                           : std::vector<std::vector<int32_t>>{{0}, {}};
    params[t.name] = StrategyParam{l, std::nullopt};
  }
  return *Strategy::Create(std::move(params), 1);
}

// What a stream delivered: every message's bytes, parts and tile boxes, in order (a stream's
// exact output), or the status it ended with. `client_caught` is set when a part's checksum does
// not match its bytes (the client's DATA_LOSS).
struct StreamOutput {
  absl::Status status;
  bool client_caught = false;
  std::string messages;  // a canonical dump of every message
  int64_t data_bytes = 0;
  int batches = 0;  // FetchTensorBatch messages
};

class SharedReadsTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(int64_t{1} << 20); }

  void Restart(int64_t shared_cache_bytes, absl::Duration straggler_bound = absl::Seconds(30)) {
    manager_.reset();
    auto store = std::make_unique<FaultyStore>(NewMemoryStore());
    faulty_ = store.get();
    store_ = std::move(store);
    ManagerOptions options;
    // Every slice (2 or 4 KiB) exceeds the target, so that its rows are cut into column bands
    // of 64 bytes.
    options.upload.chunk_grid.target_chunk_bytes = 1024;
    options.upload.chunk_grid.min_column_bytes = 64;
    options.fetch.band_bytes = 4096;
    options.fetch.max_message_bytes = 4096;
    options.fetch.whole_chunk_message_bytes = 1024;
    options.fetch.min_part_bytes = 256;
    options.fetch.chunk_cache_bytes = 8192;
    options.shared_chunk_cache_bytes = shared_cache_bytes;
    options.replica_straggler_bound = straggler_bound;
    options.lone_ring_min_chunk_bytes = lone_ring_min_bytes_;
    manager_ = std::make_unique<CheckpointManager>(store_.get(), options);
    src_ = MakeStrategy({8}, false);
    dst_ = MakeStrategy({kDp, kTp}, true);
    for (const auto& [name, s] : {std::pair{"src", &src_}, std::pair{"dst", &dst_}}) {
      auto info = manager_->PutStrategy(name, SerializeStrategy(*s, StrategyFormat::kJson),
                                        v1::STRATEGY_FORMAT_JSON, false);
      ASSERT_TRUE(info.ok()) << info.status();
    }
    const absl::Status uploaded =
        testing::UploadSampleRanks(*manager_, "ck", "src", src_, Tensors(), kSeed);
    ASSERT_TRUE(uploaded.ok()) << uploaded;
    unique_bytes_ = 0;
    for (const SampleTensor& t : Tensors()) {
      unique_bytes_ += *ByteSizeOf(t.dtype, *NumElements(t.global_shape));
    }
    faulty_->TakeReads();
  }

  v1::FetchRequest Request(int64_t rank) const {
    v1::FetchRequest req;
    req.set_checkpoint_id("ck");
    req.set_destination_strategy("dst");
    req.set_rank(rank);
    req.set_accept_batches(batches_);
    return req;
  }

  // Waits, as the service's producer does without blocking a thread, until `stream` may produce
  // its next piece without running too far ahead of its group.
  static void AwaitPace(FetchStream& stream) {
    struct Wake {
      std::mutex mu;
      std::condition_variable cv;
      bool woken = false;
    };
    auto wake = std::make_shared<Wake>();
    if (stream.MayProceed([wake] {
          std::lock_guard<std::mutex> lock(wake->mu);
          wake->woken = true;
          wake->cv.notify_all();
        })) {
      return;
    }
    std::unique_lock<std::mutex> lock(wake->mu);
    wake->cv.wait(lock, [&] { return wake->woken; });
  }

  // Runs one stream as the service does (FetchReader::kClient), checking every part's checksum
  // as a client would. `stop_after`: give up (drop the stream, as a cancelled call does) after
  // that many messages. `on_message` runs after each message. `pace`: waits for the stream's
  // group before each piece (FetchStream::MayProceed), as the service does.
  StreamOutput Run(int64_t rank, std::optional<int> stop_after = std::nullopt,
                   const std::function<void(int)>& on_message = {}, bool pace = false) {
    auto stream = manager_->OpenFetch(Request(rank));
    if (!stream.ok()) {
      StreamOutput out;
      out.status = stream.status();
      return out;
    }
    return Drain(**stream, stop_after, on_message, pace);
  }

  // Run's loop, for a stream opened already.
  static StreamOutput Drain(FetchStream& stream, std::optional<int> stop_after = std::nullopt,
                            const std::function<void(int)>& on_message = {}, bool pace = false) {
    StreamOutput out;
    FetchPiece piece;
    for (int n = 0;; ++n) {
      if (stop_after && n == *stop_after) {
        out.status = absl::CancelledError("stopped");
        return out;
      }
      if (pace) AwaitPace(stream);
      auto more = stream.NextPiece(&piece, FetchReader::kClient);
      if (!more.ok()) {
        out.status = more.status();
        return out;
      }
      if (!*more) return out;
      out.batches += piece.message.has_batch();
      std::string data;
      for (const DataSegment& s : piece.segments) data += s.bytes;
      out.data_bytes += static_cast<int64_t>(data.size());
      size_t offset = 0;
      for (const ChecksumPart& p : piece.parts) {
        if (Checksum(std::string_view(data).substr(offset, p.bytes)) != p.checksum) {
          out.client_caught = true;
        }
        offset += static_cast<size_t>(p.bytes);
      }
      absl::StrAppend(&out.messages, piece.message.SerializeAsString(), piece.batch_headers, "|",
                      data, "|");
      for (const ChecksumPart& p : piece.parts) absl::StrAppend(&out.messages, p.bytes, ",");
      for (int64_t v : piece.tile_box) absl::StrAppend(&out.messages, v, ",");
      absl::StrAppend(&out.messages, piece.band_rows, "\n");
      if (on_message) on_message(n);
    }
  }

  // Every rank of the destination at once, one thread each. `pace`: as Run. `start_delay(r)`:
  // rank r starts that much later; `message_delay(r)`: and sleeps that long after each message
  // (a slower client).
  std::vector<StreamOutput> RunAllConcurrently(
      bool pace = false, const std::function<absl::Duration(int)>& start_delay = {},
      const std::function<absl::Duration(int)>& message_delay = {}) {
    std::vector<StreamOutput> out(kTp * kDp);
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    for (int r = 0; r < kTp * kDp; ++r) {
      threads.emplace_back([&, r] {
        ++ready;
        while (ready.load() < kTp * kDp) std::this_thread::yield();
        if (start_delay) absl::SleepFor(start_delay(r));
        const absl::Duration each = message_delay ? message_delay(r) : absl::ZeroDuration();
        out[r] = Run(
            r, std::nullopt, [each](int) { absl::SleepFor(each); }, pace);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // The first chunk a rank of tensor-parallel group `tp` reads (every replica of it reads it).
  ChunkAddress FirstChunkOf(int tp) {
    faulty_->TakeReads();
    manager_->shared_chunks()->Clear();
    EXPECT_TRUE(Run(tp).status.ok());
    const std::vector<ChunkAddress> order = faulty_->ReadOrder();
    faulty_->TakeReads();
    manager_->shared_chunks()->Clear();
    EXPECT_FALSE(order.empty());
    return order.empty() ? ChunkAddress{} : order.front();
  }

  std::unique_ptr<CheckpointStore> store_;
  FaultyStore* faulty_ = nullptr;
  std::unique_ptr<CheckpointManager> manager_;
  Strategy src_ = MakeStrategy({8}, false);
  Strategy dst_ = MakeStrategy({kDp, kTp}, true);
  int64_t unique_bytes_ = 0;
  // Streams read batches of small tensors (FetchRequest.accept_batches), whose chunks a stream
  // gets together (SharedChunks::GetMany).
  bool batches_ = false;
  // Every chunk of these small tensors (at most 1 KiB) goes to the lone ring, as a real
  // checkpoint's chunks of tens of KiB and more do.
  int64_t lone_ring_min_bytes_ = 0;
};

// 64 streams at once deliver exactly, message for message, what each rank's lone fetch delivers,
// and read each stored chunk about once.
TEST_F(SharedReadsTest, SixtyFourConcurrentFetchesMatchSingleFetchesAndReadOnce) {
  // Lone fetches, with nothing shared (a fresh manager for each would do too: the cache is
  // cleared between them).
  std::vector<StreamOutput> single(kTp * kDp);
  for (int r = 0; r < kTp * kDp; ++r) {
    manager_->shared_chunks()->Clear();
    single[r] = Run(r);
    ASSERT_TRUE(single[r].status.ok()) << r << ": " << single[r].status;
    ASSERT_FALSE(single[r].client_caught);
    if (r >= kTp) {
      EXPECT_EQ(single[r].messages, single[r % kTp].messages) << "replicas differ: rank " << r;
    }
  }
  manager_->shared_chunks()->Clear();
  const int64_t read_before = store_->stats().chunk_bytes_read;
  const SharedChunkStats before = manager_->shared_chunks()->stats();
  std::vector<StreamOutput> together = RunAllConcurrently();
  const int64_t read = store_->stats().chunk_bytes_read - read_before;
  const SharedChunkStats after = manager_->shared_chunks()->stats();
  int64_t delivered = 0;
  for (int r = 0; r < kTp * kDp; ++r) {
    ASSERT_TRUE(together[r].status.ok()) << r << ": " << together[r].status;
    EXPECT_FALSE(together[r].client_caught) << r;
    EXPECT_EQ(together[r].messages, single[r].messages) << "rank " << r;
    delivered += together[r].data_bytes;
  }
  EXPECT_EQ(delivered, kDp * unique_bytes_);
  EXPECT_LE(static_cast<double>(read), 1.1 * static_cast<double>(unique_bytes_))
      << read << " bytes read for " << unique_bytes_ << " unique bytes";
  EXPECT_EQ(after.store_bytes_read - before.store_bytes_read, read);
  // Most requests were served by another stream's read.
  EXPECT_GT(after.live_hits + after.cache_hits + after.joined_reads -
                (before.live_hits + before.cache_hits + before.joined_reads),
            after.store_reads - before.store_reads);
}

// Streams that ask for a chunk while another stream reads it wait for that one read; the stream
// that started it going away before the read completes changes nothing for the others.
TEST_F(SharedReadsTest, WaitersShareOneReadAndOutliveTheStreamThatStartedIt) {
  Restart(0);  // no LRU: only the read in flight and live chunks are shared
  std::vector<StreamOutput> single(kDp);
  for (int d = 0; d < kDp; ++d) single[d] = Run(d * kTp);
  const ChunkAddress first = FirstChunkOf(0);
  faulty_->CloseGate(first);
  // The first replica starts the read and gives up (drops its stream, as a cancelled call does)
  // as soon as its read returns: the summary, a header, and the data message that read it.
  StreamOutput starter;
  std::thread reader([&] { starter = Run(0, /*stop_after=*/3); });
  faulty_->AwaitAtGate(1);
  std::vector<StreamOutput> others(kDp);
  std::vector<std::thread> threads;
  for (int d = 1; d < kDp; ++d) threads.emplace_back([&, d] { others[d] = Run(d * kTp); });
  // Every other replica waits on that read rather than reading again.
  for (int i = 0; i < 2000 && manager_->shared_chunks()->stats().joined_reads < kDp - 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(manager_->shared_chunks()->stats().joined_reads, kDp - 1);
  faulty_->OpenGate();
  reader.join();
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(absl::IsCancelled(starter.status)) << starter.status;
  for (int d = 1; d < kDp; ++d) {
    ASSERT_TRUE(others[d].status.ok()) << d << ": " << others[d].status;
    EXPECT_FALSE(others[d].client_caught);
    EXPECT_EQ(others[d].messages, single[d].messages) << "replica " << d;
  }
  EXPECT_EQ(faulty_->TakeReads()[first.ToString()], 1) << "the gated chunk was read again";
}

// A damaged chunk that several streams share fails every one of them with DATA_LOSS (on the
// server, or by the client's check of a whole chunk sent with its stored checksum), and is never
// kept as good: with the damage gone, the next fetch reads it again and succeeds.
TEST_F(SharedReadsTest, DamagedSharedChunkIsDataLossOnEveryStreamThatNeedsIt) {
  const ChunkAddress bad = FirstChunkOf(3);
  std::vector<StreamOutput> single(kTp * kDp);
  for (int r = 0; r < kTp; ++r) single[r] = Run(r);
  manager_->shared_chunks()->Clear();
  faulty_->TakeReads();
  faulty_->Corrupt(bad);
  std::vector<StreamOutput> together = RunAllConcurrently();
  std::map<std::string, int> reads = faulty_->TakeReads();
  int failed = 0, on_server = 0;
  for (int r = 0; r < kTp * kDp; ++r) {
    const StreamOutput& o = together[r];
    if (r % kTp == 3) {
      // Rank 3's replicas need the chunk.
      const bool data_loss = absl::IsDataLoss(o.status) || o.client_caught;
      EXPECT_TRUE(data_loss) << "rank " << r << " " << o.status;
      failed += data_loss;
      if (absl::IsDataLoss(o.status)) {
        ++on_server;
        EXPECT_NE(o.status.message().find(bad.ToString()), std::string_view::npos) << o.status;
      }
    } else if (o.status.ok()) {
      EXPECT_FALSE(o.client_caught) << "rank " << r;
      EXPECT_EQ(o.messages, single[r % kTp].messages) << "rank " << r;
    } else {
      // A rank of another group that also reads the damaged chunk (rows and columns overlap).
      EXPECT_TRUE(absl::IsDataLoss(o.status)) << "rank " << r << " " << o.status;
    }
  }
  EXPECT_EQ(failed, kDp);
  EXPECT_GT(on_server, 0) << "the shared chunk was never verified on the server";
  EXPECT_GE(manager_->shared_chunks()->stats().corrupt_chunks, 1);
  // Not cached as good, nor as bad: once the store gives good bytes again, fetches succeed.
  faulty_->Corrupt(std::nullopt);
  for (int d = 0; d < kDp; ++d) {
    StreamOutput o = Run(d * kTp + 3);
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_FALSE(o.client_caught);
    EXPECT_EQ(o.messages, single[3].messages);
  }
  EXPECT_GE(faulty_->TakeReads()[bad.ToString()], 1) << "the damaged chunk was not read again";
}

// Streams reading batches get each batch's chunks at once (SharedChunks::GetMany): 64 of them
// still deliver what each lone fetch delivers, read each chunk about once, and all fail with
// DATA_LOSS where a shared chunk is damaged.
TEST_F(SharedReadsTest, BatchedStreamsMatchSingleFetchesReadOnceAndFailOnDamage) {
  batches_ = true;
  std::vector<StreamOutput> single(kTp);
  for (int r = 0; r < kTp; ++r) {
    manager_->shared_chunks()->Clear();
    single[r] = Run(r);
    ASSERT_TRUE(single[r].status.ok()) << r << ": " << single[r].status;
    ASSERT_FALSE(single[r].client_caught);
  }
  EXPECT_GT(single[0].batches, 0);
  manager_->shared_chunks()->Clear();
  const int64_t read_before = store_->stats().chunk_bytes_read;
  std::vector<StreamOutput> together = RunAllConcurrently();
  const int64_t read = store_->stats().chunk_bytes_read - read_before;
  for (int r = 0; r < kTp * kDp; ++r) {
    ASSERT_TRUE(together[r].status.ok()) << r << ": " << together[r].status;
    EXPECT_FALSE(together[r].client_caught) << r;
    EXPECT_EQ(together[r].messages, single[r % kTp].messages) << "rank " << r;
  }
  EXPECT_LE(static_cast<double>(read), 1.1 * static_cast<double>(unique_bytes_))
      << read << " bytes read for " << unique_bytes_ << " unique bytes";

  const ChunkAddress bad = FirstChunkOf(3);
  faulty_->Corrupt(bad);
  together = RunAllConcurrently();
  int failed = 0;
  for (int r = 0; r < kTp * kDp; ++r) {
    const StreamOutput& o = together[r];
    if (r % kTp == 3) {
      failed += absl::IsDataLoss(o.status) || o.client_caught;
    } else if (o.status.ok()) {
      EXPECT_FALSE(o.client_caught) << "rank " << r;
      EXPECT_EQ(o.messages, single[r % kTp].messages) << "rank " << r;
    } else {
      EXPECT_TRUE(absl::IsDataLoss(o.status)) << "rank " << r << " " << o.status;
    }
  }
  EXPECT_EQ(failed, kDp);
  faulty_->Corrupt(std::nullopt);
  StreamOutput again = Run(3);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.messages, single[3].messages);
}

// GetMany with one damaged chunk among many: each result is what Get gives. The first caller
// reads them all for itself (unverified, as Get returns a chunk nobody shares); a second caller
// shares them, verified: DATA_LOSS for the damaged one only, which is then forgotten, read once
// more (still damaged) and never kept; once the store gives good bytes it is served again.
TEST_F(SharedReadsTest, GetManyWithOneDamagedChunkAmongMany) {
  ASSERT_TRUE(Run(0).status.ok());
  std::vector<ChunkAddress> addresses = faulty_->ReadOrder();
  std::sort(addresses.begin(), addresses.end(), [](const ChunkAddress& a, const ChunkAddress& b) {
    return a.ToString() < b.ToString();
  });
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  ASSERT_GE(addresses.size(), 4u);
  std::vector<uint64_t> checksums;
  for (const ChunkAddress& a : addresses) {
    auto data = store_->ReadChunkUnverified(a);
    ASSERT_TRUE(data.ok()) << data.status();
    checksums.push_back(Checksum((*data)->bytes()));
  }
  const size_t bad = addresses.size() / 2;
  faulty_->TakeReads();
  faulty_->Corrupt(addresses[bad]);
  SharedChunks chunks(store_.get(), int64_t{1} << 20);
  std::unique_ptr<CohortMember> a = chunks.JoinCohort("c", "job", 2);
  std::unique_ptr<CohortMember> b = chunks.JoinCohort("c", "job", 2);
  auto requests = [&] {
    std::vector<SharedChunks::Request> out;
    for (size_t i = 0; i < addresses.size(); ++i) {
      SharedChunks::Request q;
      q.address = addresses[i];
      q.checksum = checksums[i];
      out.push_back(std::move(q));
    }
    return out;
  };
  std::vector<SharedChunks::Request> first = requests();
  chunks.GetMany(std::span<SharedChunks::Request>(first), a->cohort(), a.get());
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_TRUE(first[i].result.ok()) << i << ": " << first[i].result.status();
    EXPECT_EQ(Checksum((*first[i].result)->data->bytes()) == checksums[i], i != bad) << i;
  }
  std::vector<SharedChunks::Request> second = requests();
  chunks.GetMany(std::span<SharedChunks::Request>(second), b->cohort(), b.get());
  for (size_t i = 0; i < second.size(); ++i) {
    if (i == bad) {
      EXPECT_TRUE(absl::IsDataLoss(second[i].result.status())) << second[i].result.status();
      EXPECT_NE(second[i].result.status().message().find(addresses[bad].ToString()),
                std::string_view::npos);
      continue;
    }
    ASSERT_TRUE(second[i].result.ok()) << i << ": " << second[i].result.status();
    EXPECT_EQ(second[i].result->get(), first[i].result->get()) << "not shared: " << i;
    EXPECT_TRUE((*second[i].result)->verified()) << i;
  }
  std::map<std::string, int> reads = faulty_->TakeReads();
  for (size_t i = 0; i < addresses.size(); ++i) {
    EXPECT_EQ(reads[addresses[i].ToString()], i == bad ? 2 : 1) << i;
  }
  EXPECT_GE(chunks.stats().corrupt_chunks, 1);
  faulty_->Corrupt(std::nullopt);
  first.clear();  // the first caller's damaged copy goes too
  std::vector<SharedChunks::Request> third = requests();
  chunks.GetMany(std::span<SharedChunks::Request>(third), b->cohort(), b.get());
  for (size_t i = 0; i < third.size(); ++i) {
    ASSERT_TRUE(third[i].result.ok()) << i << ": " << third[i].result.status();
    EXPECT_EQ(Checksum((*third[i].result)->data->bytes()), checksums[i]) << i;
  }
  EXPECT_EQ(faulty_->TakeReads()[addresses[bad].ToString()], 1);
}

// The LRU stays within its budget and a deleted checkpoint's chunks leave it.
TEST_F(SharedReadsTest, CacheStaysWithinBudgetAndForgetsDeletedCheckpoints) {
  Restart(16 << 10);
  for (int r = 0; r < kTp; ++r) {
    ASSERT_TRUE(Run(r).status.ok());
    EXPECT_LE(manager_->shared_chunks()->stats().cached_bytes, 16 << 10);
  }
  EXPECT_GT(manager_->shared_chunks()->stats().cached_bytes, 0);
  ASSERT_TRUE(manager_->DeleteCheckpoint("ck").ok());
  EXPECT_EQ(manager_->shared_chunks()->stats().cached_bytes, 0);
}

// A chunk is wanted until every open member of its cohort (the streams of identical plans) has
// taken it; chunks nobody else is expected to take never displace the ones a cohort still needs.
TEST_F(SharedReadsTest, ChunksAreKeptForTheCohortBeforeSpareOnes) {
  // One rank's slices are 20 KiB (22 KiB of chunks): a budget for one rank's chunks.
  Restart(24 << 10);
  // Replicas 0 and 8 of rank 0 are open together (a cohort of 2); replica 0 runs first.
  auto lagging = manager_->OpenFetch(Request(kTp));
  ASSERT_TRUE(lagging.ok()) << lagging.status();
  int64_t before = store_->stats().chunk_bytes_read;
  StreamOutput first = Run(0);
  ASSERT_TRUE(first.status.ok()) << first.status;
  const int64_t rank_bytes = store_->stats().chunk_bytes_read - before;
  EXPECT_GE(rank_bytes, unique_bytes_ / kTp);
  EXPECT_LE(rank_bytes, 24 << 10);
  // A stream of another rank, alone in its cohort, reads as much again: its chunks are spare
  // and do not displace those replica 8 still needs.
  StreamOutput other = Run(1);
  ASSERT_TRUE(other.status.ok()) << other.status;
  // Replica 8 now finds every chunk kept for it.
  before = store_->stats().chunk_bytes_read;
  FetchPiece piece;
  while (true) {
    auto more = (*lagging)->NextPiece(&piece, FetchReader::kClient);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
  }
  EXPECT_EQ(store_->stats().chunk_bytes_read - before, 0) << "replica 8 read chunks again";
  // Both members have taken every chunk: rank 0's chunks became spare (kept within the budget).
  const SharedChunkStats stats = manager_->shared_chunks()->stats();
  EXPECT_GT(stats.released_taken, 0);
  EXPECT_LE(stats.cached_bytes, 24 << 10);
}

// A cold storm whose replicas start far apart and read at different speeds, with a shared
// cache of three quarters of the checkpoint (without pacing, the first replica of each rank reads
// all of it before the others start, and the replicas that follow read again what the cache
// could not keep): pacing keeps every stream of the job within the cache's
// reach of the slowest one, so each stored chunk is still read about once, and every stream gets
// exactly what it gets alone.
TEST_F(SharedReadsTest, PacingKeepsAColdStormOfDriftingReplicasToOneReadPerChunk) {
  std::vector<StreamOutput> single(kTp);
  for (int r = 0; r < kTp; ++r) {
    single[r] = Run(r);
    ASSERT_TRUE(single[r].status.ok()) << single[r].status;
  }
  Restart(unique_bytes_ * 3 / 4);
  const int64_t read_before = store_->stats().chunk_bytes_read;
  // Replica d of every rank starts d x 15 ms after the first, and the replicas read at four
  // different speeds.
  std::vector<StreamOutput> together = RunAllConcurrently(
      /*pace=*/true, [](int r) { return absl::Milliseconds(15) * (r / kTp); },
      [](int r) { return absl::Microseconds(100) * (r % 4); });
  const int64_t read = store_->stats().chunk_bytes_read - read_before;
  for (int r = 0; r < kTp * kDp; ++r) {
    ASSERT_TRUE(together[r].status.ok()) << r << ": " << together[r].status;
    EXPECT_FALSE(together[r].client_caught) << r;
    EXPECT_EQ(together[r].messages, single[r % kTp].messages) << "rank " << r;
  }
  const SharedChunkStats stats = manager_->shared_chunks()->stats();
  EXPECT_GT(stats.pace_waits, 0) << "no stream ever waited for its group";
  EXPECT_EQ(stats.left_behind, 0);
  EXPECT_EQ(stats.pacing_now, 0);
  EXPECT_LE(stats.cached_bytes, unique_bytes_ * 3 / 4);
  EXPECT_LE(static_cast<double>(read), 1.1 * static_cast<double>(unique_bytes_))
      << read << " bytes read for " << unique_bytes_ << " unique bytes; " << stats.pace_waits
      << " pace waits";
}

// A member of the group that stops making progress (its client stalls) holds the others back
// for the straggler bound at most: then it is left behind, the others finish, and it still
// completes correctly when it resumes, reading for itself what is no longer kept.
TEST_F(SharedReadsTest, AStalledMemberHoldsItsGroupBackOnlyForTheBound) {
  const StreamOutput lone = Run(0);
  ASSERT_TRUE(lone.status.ok()) << lone.status;
  const absl::Duration bound = absl::Milliseconds(400);
  Restart(8 << 10, bound);  // a window of 4 KiB: rank 0 (20 KiB) must wait for its replica
  auto straggler = manager_->OpenFetch(Request(kTp));  // rank 0's replica, never read yet
  ASSERT_TRUE(straggler.ok()) << straggler.status();
  const absl::Time start = absl::Now();
  const StreamOutput leader = Run(0, std::nullopt, {}, /*pace=*/true);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(leader.status.ok()) << leader.status;
  EXPECT_EQ(leader.messages, lone.messages);
  SharedChunkStats stats = manager_->shared_chunks()->stats();
  EXPECT_GE(stats.pace_waits, 1);
  EXPECT_EQ(stats.left_behind, 1);
  EXPECT_EQ(stats.pacing_now, 0);
  // It waited for the stalled member, then went on without it.
  EXPECT_GE(took, bound * 0.9);
  EXPECT_LT(took, bound + absl::Seconds(10));
  // The straggler resumes and completes, pacing being no concern of the one left behind.
  const StreamOutput late = Drain(**straggler, std::nullopt, {}, /*pace=*/true);
  ASSERT_TRUE(late.status.ok()) << late.status;
  EXPECT_EQ(late.messages, lone.messages);
}

// A member that is slow but moving is waited for (never left behind), and a member leaving the
// group (its call ended) frees the ones waiting for it at once.
TEST_F(SharedReadsTest, SlowButMovingMembersAreWaitedForAndLeavingFreesTheWaiters) {
  const StreamOutput lone = Run(0);
  ASSERT_TRUE(lone.status.ok()) << lone.status;
  Restart(8 << 10, absl::Seconds(30));
  StreamOutput slow, fast;
  auto slow_stream = manager_->OpenFetch(Request(kTp));  // both are open before either reads
  ASSERT_TRUE(slow_stream.ok()) << slow_stream.status();
  std::thread slow_thread([&] {
    slow = Drain(
        **slow_stream, std::nullopt, [](int) { absl::SleepFor(absl::Milliseconds(3)); }, true);
  });
  std::thread fast_thread([&] { fast = Run(0, std::nullopt, {}, true); });
  slow_thread.join();
  fast_thread.join();
  ASSERT_TRUE(slow.status.ok()) << slow.status;
  ASSERT_TRUE(fast.status.ok()) << fast.status;
  EXPECT_EQ(slow.messages, lone.messages);
  EXPECT_EQ(fast.messages, lone.messages);
  SharedChunkStats stats = manager_->shared_chunks()->stats();
  EXPECT_GE(stats.pace_waits, 1);
  EXPECT_EQ(stats.left_behind, 0);
  // Leaving: a replica opened and dropped while the leader waits for it.
  auto idle = manager_->OpenFetch(Request(kTp));
  ASSERT_TRUE(idle.ok());
  StreamOutput leader;
  std::thread leader_thread([&] { leader = Run(0, std::nullopt, {}, true); });
  for (int i = 0; i < 2000 && manager_->shared_chunks()->stats().pacing_now == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(manager_->shared_chunks()->stats().pacing_now, 1);
  idle->reset();  // the replica's call ends: the leader goes on, long before the 30 s bound
  leader_thread.join();
  ASSERT_TRUE(leader.status.ok()) << leader.status;
  EXPECT_EQ(leader.messages, lone.messages);
  EXPECT_EQ(manager_->shared_chunks()->stats().left_behind, 0);
}

// A stream that has produced everything leaves its group then, not when its call ends: a worker
// fetching a job's ranks one after another, each call still open while the next starts (the
// service ends a call once its last messages are out), is one lone stream after another, never a
// gathering job whose second stream waits for the rest.
TEST_F(SharedReadsTest, AFinishedStreamLeavesItsGroupBeforeItsCallEnds) {
  // A gathering job's streams may each go 8 KiB / (2 x 64) ahead: every rank (20 KiB) would wait.
  Restart(8 << 10);
  std::vector<std::unique_ptr<FetchStream>> produced;  // calls whose messages are not all out
  const absl::Time start = absl::Now();
  for (int r = 0; r < kTp; ++r) {
    auto stream = manager_->OpenFetch(Request(r));
    ASSERT_TRUE(stream.ok()) << stream.status();
    const StreamOutput out = Drain(**stream, std::nullopt, {}, /*pace=*/true);
    ASSERT_TRUE(out.status.ok()) << r << ": " << out.status;
    produced.push_back(*std::move(stream));
  }
  const SharedChunkStats stats = manager_->shared_chunks()->stats();
  EXPECT_EQ(stats.pace_waits, 0) << "a rank waited for the job to gather after "
                                 << absl::FormatDuration(absl::Now() - start);
  EXPECT_EQ(stats.pacing_now, 0);
}

// A stream alone in ckptd reads around the shared table, keeping what it read in the lone ring:
// a replica that starts after it has finished still finds every chunk (the ring goes to the
// table when a member of a cohort whose chunks it holds opens), a stream of another rank reads
// its own, and what is kept stays within the budget and leaves with its checkpoint.
TEST_F(SharedReadsTest, ALoneStreamReadsAroundTheTableAndAReplicaAfterItFindsItsChunks) {
  for (const bool batches : {false, true}) {
    SCOPED_TRACE(batches ? "batches" : "one tensor a message");
    batches_ = batches;
    Restart(int64_t{1} << 20);
    SharedChunkStats before = manager_->shared_chunks()->stats();
    int64_t read_before = store_->stats().chunk_bytes_read;
    const StreamOutput first = Run(0);
    ASSERT_TRUE(first.status.ok()) << first.status;
    SharedChunkStats after = manager_->shared_chunks()->stats();
    const int64_t rank_bytes = store_->stats().chunk_bytes_read - read_before;
    EXPECT_GT(rank_bytes, 0);
    EXPECT_EQ(after.lone_reads - before.lone_reads, after.store_reads - before.store_reads);
    EXPECT_EQ(after.store_bytes_read - before.store_bytes_read, rank_bytes);
    EXPECT_EQ(after.cached_bytes, rank_bytes);

    // Rank 0's replica, alone too, after the first has finished: every chunk is found.
    read_before = store_->stats().chunk_bytes_read;
    before = after;
    const StreamOutput replica = Run(kTp);
    ASSERT_TRUE(replica.status.ok()) << replica.status;
    EXPECT_EQ(replica.messages, first.messages);
    EXPECT_EQ(store_->stats().chunk_bytes_read - read_before, 0) << "the replica read again";
    after = manager_->shared_chunks()->stats();
    EXPECT_GT(after.cache_hits, before.cache_hits);

    // Another rank reads its own chunks; the cache stays within its budget and forgets a
    // deleted checkpoint, in the ring as in the table.
    read_before = store_->stats().chunk_bytes_read;
    ASSERT_TRUE(Run(1).status.ok());
    EXPECT_GT(store_->stats().chunk_bytes_read - read_before, 0);
    EXPECT_LE(manager_->shared_chunks()->stats().cached_bytes, int64_t{1} << 20);
    ASSERT_TRUE(manager_->DeleteCheckpoint("ck").ok());
    EXPECT_EQ(manager_->shared_chunks()->stats().cached_bytes, 0);
    EXPECT_EQ(manager_->shared_chunks()->stats().pinned_bytes, 0);
  }
}

// Chunks below ManagerOptions::lone_ring_min_chunk_bytes are read again rather than kept: a
// replica after a lone stream reads every chunk of those small tensors again, and gets what the
// first got.
TEST_F(SharedReadsTest, ALoneStreamKeepsNoChunkSmallerThanTheRingMinimum) {
  for (const bool batches : {false, true}) {
    SCOPED_TRACE(batches ? "batches" : "one tensor a message");
    batches_ = batches;
    lone_ring_min_bytes_ = 2048;  // every chunk here is at most 1 KiB
    Restart(int64_t{1} << 20);
    int64_t read_before = store_->stats().chunk_bytes_read;
    const StreamOutput first = Run(0);
    ASSERT_TRUE(first.status.ok()) << first.status;
    const int64_t rank_bytes = store_->stats().chunk_bytes_read - read_before;
    EXPECT_GT(rank_bytes, 0);
    const SharedChunkStats before = manager_->shared_chunks()->stats();
    EXPECT_GT(before.lone_reads, 0);
    EXPECT_EQ(before.cached_bytes, 0) << "the ring kept chunks below its minimum";

    read_before = store_->stats().chunk_bytes_read;
    const StreamOutput replica = Run(kTp);
    ASSERT_TRUE(replica.status.ok()) << replica.status;
    EXPECT_EQ(replica.messages, first.messages);
    EXPECT_EQ(store_->stats().chunk_bytes_read - read_before, rank_bytes);
    EXPECT_EQ(manager_->shared_chunks()->stats().cache_hits, before.cache_hits);
  }
}

// A stream of another plan that opens while a lone stream is part way through finds what the
// lone stream has read: the ring goes to the table when a second stream opens, whatever its
// cohort.
TEST_F(SharedReadsTest, AStreamOpeningBesideALoneOneFindsWhatItRead) {
  auto lone = manager_->OpenFetch(Request(0));
  ASSERT_TRUE(lone.ok()) << lone.status();
  FetchPiece piece;
  for (int n = 0; n < 4; ++n) {  // the summary, then tensors; the stream stays open
    auto more = (*lone)->NextPiece(&piece, FetchReader::kClient);
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_TRUE(*more);
  }
  const int64_t lone_read = store_->stats().chunk_bytes_read;
  ASSERT_GT(lone_read, 0);
  EXPECT_GT(manager_->shared_chunks()->stats().lone_reads, 0);
  // The whole checkpoint, as one merged fetch: a cohort of its own, needing every chunk.
  v1::FetchRequest merged = Request(0);
  merged.set_merged(true);
  auto whole = manager_->OpenFetch(merged);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const StreamOutput out = Drain(**whole);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.data_bytes, unique_bytes_);
  EXPECT_EQ(store_->stats().chunk_bytes_read - lone_read, unique_bytes_ - lone_read)
      << "the merged fetch read again what the lone stream had read";
}

// Chunks kept in the table while streams shared it (spare ones, left by a stream that had
// company) do not keep a later lone stream on the table for good: its reads go to the ring, the
// table's older chunks make room for them first, and once the table keeps nothing the lone
// stream reads around it.
TEST_F(SharedReadsTest, ChunksKeptFromSharedStreamsGiveWayToALoneStreamsRing) {
  // Rank 1's chunks alone fill most of the budget.
  Restart(24 << 10);
  auto other = manager_->OpenFetch(Request(kTp));  // open, so that rank 1 has company
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(Run(1).status.ok());
  other->reset();
  SharedChunkStats stats = manager_->shared_chunks()->stats();
  EXPECT_EQ(stats.lone_reads, 0);
  EXPECT_GT(stats.cached_bytes, 0) << "rank 1's chunks were not kept in the table";
  for (int r = 2; r < kTp; ++r) {
    const StreamOutput out = Run(r);
    ASSERT_TRUE(out.status.ok()) << r << ": " << out.status;
    EXPECT_LE(manager_->shared_chunks()->stats().cached_bytes, 24 << 10) << r;
  }
  stats = manager_->shared_chunks()->stats();
  EXPECT_GT(stats.lone_reads, 0) << "the lone streams never read around the table";
}

// Chunks the table kept while streams shared it stay there for a replica that comes later, as
// long as the table is used within the straggler bound; once nobody has taken one of them nor
// kept another for that bound, the next lone stream drops them all and reads around the table
// from its first chunk (a replica coming after that reads the store again, and gets the same).
TEST_F(SharedReadsTest, ALoneStreamDropsWhatTheTableKeptOnceUnusedForTheBound) {
  for (const absl::Duration bound : {absl::Seconds(30), absl::Milliseconds(20)}) {
    SCOPED_TRACE(absl::FormatDuration(bound));
    const bool idle = bound < absl::Seconds(1);
    Restart(int64_t{1} << 20, bound);
    auto other = manager_->OpenFetch(Request(kTp));  // open, so that rank 1 has company
    ASSERT_TRUE(other.ok()) << other.status();
    const StreamOutput first = Run(1);
    ASSERT_TRUE(first.status.ok()) << first.status;
    other->reset();
    SharedChunkStats before = manager_->shared_chunks()->stats();
    ASSERT_GT(before.cached_bytes, 0) << "rank 1's chunks were not kept in the table";
    ASSERT_EQ(before.lone_reads, 0);
    if (idle) absl::SleepFor(5 * bound);

    // A lone stream of another rank.
    ASSERT_TRUE(Run(2).status.ok());
    SharedChunkStats after = manager_->shared_chunks()->stats();
    if (idle) {
      EXPECT_GT(after.idle_dropped, 0);
      EXPECT_EQ(after.lone_reads - before.lone_reads, after.store_reads - before.store_reads)
          << "the lone stream read through the table after dropping what it kept";
    } else {
      EXPECT_EQ(after.idle_dropped, 0);
      EXPECT_EQ(after.lone_reads, 0) << "the lone stream read around a table that kept chunks";
    }

    // Rank 1's replica, alone: it finds rank 1's chunks unless they were dropped.
    const int64_t read_before = store_->stats().chunk_bytes_read;
    const StreamOutput replica = Run(1 + kTp);
    ASSERT_TRUE(replica.status.ok()) << replica.status;
    EXPECT_EQ(replica.messages, first.messages);
    if (idle) {
      EXPECT_GT(store_->stats().chunk_bytes_read - read_before, 0);
    } else {
      EXPECT_EQ(store_->stats().chunk_bytes_read - read_before, 0) << "the replica read again";
    }
    EXPECT_LE(manager_->shared_chunks()->stats().cached_bytes, int64_t{1} << 20);
  }
}

// Pacing at the scale of a large job, driven through the members directly: a member more than
// the window ahead of the slowest waits, however many members the group has; the slowest
// advancing frees exactly the waiters it brings within the window; a member joining behind
// everyone holds back those it is more than the window behind; its leaving frees them.
TEST(SharedChunksPacingTest, MembersOfALargeGroupWaitForTheSlowestAsItAdvancesJoinsAndLeaves) {
  std::unique_ptr<CheckpointStore> store = NewMemoryStore();
  constexpr int64_t kCache = 64 << 10;  // one cohort: a window of 32 KiB
  constexpr int kMembers = 512;
  SharedChunks chunks(store.get(), kCache, absl::Seconds(60));
  std::vector<std::unique_ptr<CohortMember>> members;
  for (int i = 0; i < kMembers; ++i) members.push_back(chunks.JoinCohort("c", "job", kMembers));
  ASSERT_EQ(chunks.pace_window(), kCache / 2);

  std::atomic<int> woken{0};
  auto wake = [&] { woken.fetch_add(1); };
  // Member i > 0 goes 16 KiB + i x 64 bytes ahead (up to about 48 KiB), member 0 stays at 0.
  auto ahead = [](int i) { return int64_t{16 << 10} + int64_t{i} * 64; };
  int waiting = 0;
  for (int i = 1; i < kMembers; ++i) {
    members[i]->Advanced(ahead(i));
    const bool go = members[i]->MayProceed(wake);
    EXPECT_EQ(go, ahead(i) <= kCache / 2) << i;
    waiting += go ? 0 : 1;
  }
  ASSERT_GT(waiting, 200);
  EXPECT_EQ(chunks.stats().pacing_now, waiting);
  EXPECT_EQ(woken.load(), 0);
  // The slowest moves 8 KiB: those now within 32 KiB of it go on (woken at once, on this
  // thread), the others still wait.
  members[0]->Advanced(8 << 10);
  int freed = 0;
  for (int i = 1; i < kMembers; ++i) {
    freed += (ahead(i) > kCache / 2 && ahead(i) - (8 << 10) <= kCache / 2) ? 1 : 0;
  }
  ASSERT_GT(freed, 0);
  EXPECT_EQ(woken.load(), freed);
  EXPECT_EQ(chunks.stats().pacing_now, waiting - freed);
  // The slowest catches up with the leader (the others stay within the window of both): every
  // waiter goes on.
  members[0]->Advanced(ahead(kMembers - 1) - (8 << 10));
  EXPECT_EQ(woken.load(), waiting);
  EXPECT_EQ(chunks.stats().pacing_now, 0);
  for (int i = 1; i < kMembers; ++i) EXPECT_TRUE(members[i]->MayProceed(wake)) << i;

  // Everyone moves on by a window; a member joining now starts at 0, more than the window behind
  // everyone.
  for (auto& m : members) m->Advanced(kCache / 2);
  std::unique_ptr<CohortMember> late = chunks.JoinCohort("c", "job", kMembers);
  // (Member 1 first: within the window of the slowest before the newcomer came, more than the
  // window ahead of the newcomer.)
  for (int i = 1; i <= kMembers; ++i) EXPECT_FALSE(members[i % kMembers]->MayProceed(wake)) << i;
  EXPECT_TRUE(late->MayProceed(wake));
  EXPECT_EQ(chunks.stats().pacing_now, kMembers);
  const int before = woken.load();
  late.reset();  // it leaves: everyone goes on
  EXPECT_EQ(woken.load(), before + kMembers);
  EXPECT_EQ(chunks.stats().pacing_now, 0);
  EXPECT_EQ(chunks.stats().left_behind, 0);
}

// The cache counts the segment store's mapped windows its chunks pin within its budget: a cache of
// small chunks spread over many windows keeps at most its budget of them mapped, so the store's
// map budget stays free for later reads, which are views rather than copies.
TEST(SharedChunksMemoryTest, CachedChunksDoNotPinMoreWindowsThanTheBudget) {
  testing::TempDir dir;
  StoreOptions options;
  options.min_free_disk_bytes = 0;
  options.mapped_bytes_budget = int64_t{32} << 20;  // two 16 MiB windows
  absl::StatusOr<std::unique_ptr<CheckpointStore>> opened = OpenSegmentStore(dir.path(), options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  CheckpointStore& store = **opened;
  // 64 MiB of 16 KiB chunks: four windows.
  constexpr int kChunk = 16 << 10;
  constexpr int kChunks = 4 * 1024;
  absl::StatusOr<uint64_t> id = store.BeginData();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::string> bytes(kChunks);
  std::vector<ChunkWrite> writes;
  for (int i = 0; i < kChunks; ++i) {
    bytes[i] = std::string(kChunk, static_cast<char>('a' + i % 26));
    std::memcpy(bytes[i].data(), &i, sizeof(i));
    writes.push_back(ChunkWrite{ChunkAddress{*id, 0, 0, static_cast<uint32_t>(i)}, bytes[i]});
  }
  ASSERT_TRUE(store.PutChunks(writes).ok());
  ASSERT_TRUE(store.CommitCheckpoint("ck", "m", *id).ok());

  // One chunk of every 1 MiB, each released before the next is read; the cache (one window's
  // worth) would keep all of them by their bytes alone.
  constexpr int64_t kCache = int64_t{16} << 20;
  SharedChunks chunks(&store, kCache);
  constexpr int kStride = (1 << 20) / kChunk;
  for (int i = 0; i < kChunks; i += kStride) {
    const ChunkAddress address{*id, 0, 0, static_cast<uint32_t>(i)};
    absl::StatusOr<std::shared_ptr<StreamChunk>> got = chunks.Get(address, Checksum(bytes[i]));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE((*got)->data->bytes() == bytes[i]) << i;
    EXPECT_LE(chunks.stats().pinned_bytes, kCache) << i;
  }
  const SharedChunkStats stats = chunks.stats();
  EXPECT_GT(stats.pinned_bytes, 0);
  EXPECT_GT(stats.cached_bytes, 0);
  EXPECT_GT(stats.evicted_for_pins, 0);
  EXPECT_EQ(store.stats().chunk_bytes_copied, 0) << "reads over the map budget were copies";
  EXPECT_LE(store.stats().mapped_bytes, options.mapped_bytes_budget);

  // The last chunk read is still kept: served from the cache, verified for its second taker.
  const int last = (kChunks - 1) / kStride * kStride;
  absl::StatusOr<std::shared_ptr<StreamChunk>> again =
      chunks.Get(ChunkAddress{*id, 0, 0, static_cast<uint32_t>(last)}, Checksum(bytes[last]));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->data->bytes() == bytes[last]);
  EXPECT_TRUE((*again)->verified());
  EXPECT_EQ(chunks.stats().cache_hits, 1);

  // Dropping the cache releases its pins.
  chunks.Clear();
  EXPECT_EQ(chunks.stats().pinned_bytes, 0);
  EXPECT_EQ(chunks.stats().cached_bytes, 0);

  // Chunks a cohort still wants are not evicted for their pins: the second member of a cohort
  // of two finds every chunk the first read, over more windows than the budget, and reads none.
  const int64_t reads_before = chunks.stats().store_reads;
  std::unique_ptr<CohortMember> a = chunks.JoinCohort("plan", "job", 2);
  std::unique_ptr<CohortMember> b = chunks.JoinCohort("plan", "job", 2);
  int wanted = 0;
  for (int i = kStride / 2; i < kChunks; i += kStride, ++wanted) {
    const ChunkAddress address{*id, 0, 0, static_cast<uint32_t>(i)};
    absl::StatusOr<std::shared_ptr<StreamChunk>> got =
        chunks.Get(address, Checksum(bytes[i]), a->cohort(), a.get());
    ASSERT_TRUE(got.ok()) << got.status();
  }
  EXPECT_GT(chunks.stats().pinned_bytes, kCache);
  for (int i = kStride / 2; i < kChunks; i += kStride) {
    const ChunkAddress address{*id, 0, 0, static_cast<uint32_t>(i)};
    absl::StatusOr<std::shared_ptr<StreamChunk>> got =
        chunks.Get(address, Checksum(bytes[i]), b->cohort(), b.get());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE((*got)->data->bytes() == bytes[i]) << i;
  }
  EXPECT_EQ(chunks.stats().store_reads - reads_before, wanted);
}

}  // namespace
}  // namespace ckpt
