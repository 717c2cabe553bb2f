// One conformance suite for every CheckpointStore (storage/checkpoint_store.h), plus tests only
// the segment store can pass (persistence, on-disk corruption, the directory lock).
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "storage/checkpoint_store.h"
#include "storage/internal/index_records.h"
#include "storage/internal/segment_directory.h"
#include "tests/testing/raw_store_db.h"

namespace ckpt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

#define STORE_TEST_CONCAT_INNER_(a, b) a##b
#define STORE_TEST_CONCAT_(a, b) STORE_TEST_CONCAT_INNER_(a, b)

#define ASSERT_OK(expr)                               \
  do {                                                \
    const ::absl::Status store_test_s_ = (expr);      \
    ASSERT_TRUE(store_test_s_.ok()) << store_test_s_; \
  } while (0)
#define EXPECT_OK(expr)                               \
  do {                                                \
    const ::absl::Status store_test_s_ = (expr);      \
    EXPECT_TRUE(store_test_s_.ok()) << store_test_s_; \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(STORE_TEST_CONCAT_(store_test_sor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  ASSERT_TRUE(tmp.ok()) << tmp.status();           \
  lhs = std::move(*tmp)

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

ChunkAddress Addr(uint64_t data_id, uint32_t tensor, uint32_t blob, uint32_t chunk) {
  return ChunkAddress{data_id, tensor, blob, chunk};
}

enum class StoreKind { kMemory, kSegment };

std::string KindName(StoreKind kind) { return kind == StoreKind::kMemory ? "Memory" : "Segment"; }
void PrintTo(StoreKind kind, std::ostream* os) { *os << KindName(kind); }

// Owns a temporary directory and the store under test; can close and reopen it.
class StoreFixture : public ::testing::Test {
 protected:
  explicit StoreFixture(StoreKind kind) : kind_(kind) {
    // Tests must not depend on this machine's free space; the reserve is tested explicitly.
    options_.min_free_disk_bytes = 0;
  }

  void SetUp() override {
    char tmpl[] = "/tmp/ckpt_store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << "mkdtemp: " << std::strerror(errno);
    root_ = tmpl;
    db_dir_ = root_ + "/db";
    ASSERT_NO_FATAL_FAILURE(Open());
  }

  void TearDown() override {
    store_.reset();
    if (root_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  bool persistent() const { return kind_ == StoreKind::kSegment; }

  absl::StatusOr<std::unique_ptr<CheckpointStore>> Make(const StoreOptions& options) {
    if (kind_ == StoreKind::kMemory) return NewMemoryStore(options);
    return OpenSegmentStore(db_dir_, options);
  }

  void Open() { ASSERT_OK_AND_ASSIGN(store_, Make(options_)); }

  // Closes the store and opens the same directory again (segment store only).
  void Reopen() {
    ASSERT_TRUE(persistent());
    store_.reset();
    ASSERT_NO_FATAL_FAILURE(Open());
  }

  // Begins a data id and writes `chunks` (address data ids are overwritten with the new id).
  uint64_t Upload(std::vector<std::pair<ChunkAddress, std::string>>* chunks) {
    absl::StatusOr<uint64_t> id = store_->BeginData();
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return 0;
    std::vector<ChunkWrite> writes;
    for (auto& [address, bytes] : *chunks) {
      address.data_id = *id;
      writes.push_back(ChunkWrite{address, bytes});
    }
    EXPECT_OK(store_->PutChunks(writes));
    return *id;
  }

  // Reads a chunk, verified and unverified, and checks its bytes.
  void ExpectChunk(const ChunkAddress& address, const std::string& bytes) {
    absl::StatusOr<std::unique_ptr<ChunkData>> data = store_->ReadChunk(address, Checksum(bytes));
    ASSERT_TRUE(data.ok()) << address.ToString() << ": " << data.status();
    EXPECT_TRUE((*data)->bytes() == bytes) << address.ToString() << ": " << (*data)->bytes().size()
                                           << " bytes read, " << bytes.size() << " expected";
    data = store_->ReadChunkUnverified(address);
    ASSERT_TRUE(data.ok()) << address.ToString() << ": " << data.status();
    EXPECT_TRUE((*data)->bytes() == bytes) << address.ToString() << " (unverified)";
  }

  void ExpectNoChunk(const ChunkAddress& address) {
    absl::StatusOr<std::unique_ptr<ChunkData>> data = store_->ReadChunk(address, 0);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound)
        << address.ToString() << ": " << data.status();
    data = store_->ReadChunkUnverified(address);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound)
        << address.ToString() << " (unverified): " << data.status();
  }

  const StoreKind kind_;
  StoreOptions options_;
  std::string root_;
  std::string db_dir_;
  std::unique_ptr<CheckpointStore> store_;
};

class StoreConformanceTest : public StoreFixture, public ::testing::WithParamInterface<StoreKind> {
 protected:
  StoreConformanceTest() : StoreFixture(GetParam()) {}
};

// --- Strategies ---------------------------------------------------------------------------------

TEST_P(StoreConformanceTest, StrategiesCrud) {
  const std::string record("rec\0ord", 7);  // records are bytes, NULs included
  ASSERT_OK(store_->PutStrategy("dp8", record, /*overwrite=*/false));
  ASSERT_OK_AND_ASSIGN(std::string got, store_->GetStrategy("dp8"));
  EXPECT_EQ(got, record);

  absl::Status exists = store_->PutStrategy("dp8", "other", /*overwrite=*/false);
  EXPECT_EQ(exists.code(), absl::StatusCode::kAlreadyExists) << exists;
  EXPECT_THAT(Msg(exists), HasSubstr("dp8"));
  ASSERT_OK_AND_ASSIGN(got, store_->GetStrategy("dp8"));
  EXPECT_EQ(got, record);

  ASSERT_OK(store_->PutStrategy("dp8", "", /*overwrite=*/true));
  ASSERT_OK_AND_ASSIGN(got, store_->GetStrategy("dp8"));
  EXPECT_EQ(got, "");

  absl::StatusOr<std::string> missing = store_->GetStrategy("tp4");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(Msg(missing.status()), HasSubstr("tp4"));

  ASSERT_OK(store_->PutStrategy("mp2", "b", false));
  ASSERT_OK(store_->PutStrategy("A", "c", false));
  ASSERT_OK(store_->PutStrategy("dp8.stage1", "d", false));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, store_->ListStrategies());
  EXPECT_THAT(names, ElementsAre("A", "dp8", "dp8.stage1", "mp2"));

  ASSERT_OK(store_->DeleteStrategy("dp8"));
  EXPECT_EQ(store_->GetStrategy("dp8").status().code(), absl::StatusCode::kNotFound);
  absl::Status again = store_->DeleteStrategy("dp8");
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_THAT(Msg(again), HasSubstr("dp8"));
  ASSERT_OK_AND_ASSIGN(names, store_->ListStrategies());
  EXPECT_THAT(names, ElementsAre("A", "dp8.stage1", "mp2"));
  // Strategies and checkpoints are separate namespaces.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> checkpoints, store_->ListCheckpoints());
  EXPECT_THAT(checkpoints, IsEmpty());
}

// --- Chunks -------------------------------------------------------------------------------------

TEST_P(StoreConformanceTest, BeginDataReturnsFreshIds) {
  std::set<uint64_t> ids;
  for (int i = 0; i < 50; ++i) {
    ASSERT_OK_AND_ASSIGN(uint64_t id, store_->BeginData());
    EXPECT_TRUE(ids.insert(id).second) << "data id " << id << " returned twice";
  }
}

TEST_P(StoreConformanceTest, ChunksRoundTrip) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks;
  chunks.emplace_back(Addr(0, 0, 0, 0), "");                       // empty
  chunks.emplace_back(Addr(0, 0, 0, 1), RandomBytes(1 << 20, 1));  // 1 MiB
  chunks.emplace_back(Addr(0, 0, 1, 0), RandomBytes(4095, 2));     // around the
  chunks.emplace_back(Addr(0, 0, 1, 1), RandomBytes(4096, 3));     // blob threshold
  for (uint32_t i = 0; i < 300; ++i) {
    chunks.emplace_back(Addr(0, 1 + i % 7, i % 3, i), RandomBytes(1 + (i * 37) % 700, 10 + i));
  }
  // Extreme indices stay distinct (keys are fixed-width big-endian).
  chunks.emplace_back(Addr(0, 0xffffffffu, 0xffffffffu, 0xffffffffu), "last");
  const uint64_t id = Upload(&chunks);

  int64_t bytes = 0;
  for (const auto& [address, data] : chunks) {
    ASSERT_EQ(address.data_id, id);
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, data));
    bytes += static_cast<int64_t>(data.size());
  }
  const StoreStats stats = store_->stats();
  EXPECT_EQ(stats.chunks_written, static_cast<int64_t>(chunks.size()));
  EXPECT_EQ(stats.chunk_bytes_written, bytes);
  // ExpectChunk reads each chunk twice: verified, then unverified. Both count.
  EXPECT_EQ(stats.chunks_read, 2 * static_cast<int64_t>(chunks.size()));
  EXPECT_EQ(stats.chunk_bytes_read, 2 * bytes);

  // Rewriting a chunk of a live upload replaces it (an upload retried after a stream reset).
  ASSERT_OK(store_->PutChunks({ChunkWrite{Addr(id, 0, 0, 0), "again"}}));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 0, 0, 0), "again"));
  EXPECT_OK(store_->PutChunks({}));
}

// ReadChunksUnverified gives, in order, what ReadChunkUnverified gives for each address, with
// missing chunks among the present ones: while the data is live, and once committed (the segment
// store then finds the locations of whole blobs, scanned on first use, under one lock).
TEST_P(StoreConformanceTest, ReadChunksUnverifiedIsReadChunkUnverifiedOfEach) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks;
  for (uint32_t i = 0; i < 200; ++i) {
    chunks.emplace_back(Addr(0, i % 5, i % 3, i), RandomBytes(1 + (i * 53) % 900, 20 + i));
  }
  const uint64_t id = Upload(&chunks);
  std::vector<ChunkAddress> addresses;
  for (const auto& [address, bytes] : chunks) addresses.push_back(address);
  // Missing: a tensor never written, a chunk past a written blob's, a data id never begun.
  const size_t present = addresses.size();
  addresses.insert(addresses.begin() + 7, Addr(id, 99, 0, 0));
  addresses.insert(addresses.begin() + 50, Addr(id, 1, 1, 9999));
  addresses.push_back(Addr(id + 1000, 0, 0, 0));
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    std::vector<absl::StatusOr<std::unique_ptr<ChunkData>>> many;
    store_->ReadChunksUnverified(addresses, &many);
    ASSERT_EQ(many.size(), addresses.size());
    size_t next = 0;
    for (size_t i = 0; i < addresses.size(); ++i) {
      absl::StatusOr<std::unique_ptr<ChunkData>> one = store_->ReadChunkUnverified(addresses[i]);
      ASSERT_EQ(many[i].status().code(), one.status().code()) << addresses[i].ToString();
      if (!one.ok()) {
        EXPECT_EQ(one.status().code(), absl::StatusCode::kNotFound) << addresses[i].ToString();
        continue;
      }
      ASSERT_LT(next, present);
      EXPECT_EQ(addresses[i], chunks[next].first);
      EXPECT_TRUE((*many[i])->bytes() == chunks[next].second) << addresses[i].ToString();
      ++next;
    }
    EXPECT_EQ(next, present);
  };
  check("live");
  ASSERT_OK(store_->CommitCheckpoint("many", "manifest", id));
  check("committed, locations not read yet");
  check("committed, locations cached");
}

TEST_P(StoreConformanceTest, ChunkDataStaysValidAfterLaterWrites) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {
      {Addr(0, 0, 0, 0), RandomBytes(100000, 4)}};
  const uint64_t id = Upload(&chunks);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkData> data,
                       store_->ReadChunk(chunks[0].first, Checksum(chunks[0].second)));
  for (uint32_t i = 1; i < 50; ++i) {
    ASSERT_OK(store_->PutChunks({ChunkWrite{Addr(id, 0, 0, i), RandomBytes(20000, i)}}));
  }
  EXPECT_TRUE(data->bytes() == chunks[0].second);
}

TEST_P(StoreConformanceTest, ReadChunkVerifiesChecksum) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {
      {Addr(0, 3, 1, 12), RandomBytes(5000, 5)}, {Addr(0, 3, 1, 13), "tiny"}};
  const uint64_t id = Upload(&chunks);
  for (const auto& [address, bytes] : chunks) {
    const uint64_t wrong = Checksum(bytes + "x");
    absl::StatusOr<std::unique_ptr<ChunkData>> data = store_->ReadChunk(address, wrong);
    ASSERT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << data.status();
    EXPECT_THAT(Msg(data.status()),
                HasSubstr("chunk " + address.ToString() + " failed its XXH3-64 checksum"));
  }
  absl::StatusOr<std::unique_ptr<ChunkData>> absent =
      store_->ReadChunk(Addr(id, 3, 1, 14), Checksum(""));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound) << absent.status();
  EXPECT_THAT(Msg(absent.status()), HasSubstr(Addr(id, 3, 1, 14).ToString()));
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id + 1, 3, 1, 12)));
}

// Fills a reservation's chunk `i` with `bytes` (its size), place by place.
void FillReserved(const ChunkReservation& r, size_t i, const std::string& bytes) {
  size_t done = 0;
  for (const std::span<char> place : r.places(i)) {
    ASSERT_LE(done + place.size(), bytes.size()) << "chunk " << i;
    std::memcpy(place.data(), bytes.data() + done, place.size());
    done += place.size();
  }
  ASSERT_EQ(done, bytes.size()) << "chunk " << i;
}

// Chunks written in place (ReserveChunks) read back as PutChunks' do once committed, and not
// before; a reservation dropped uncommitted records nothing; one whose data id is discarded
// meanwhile does not hold the discard up and fails its commit; chunks of several streams are
// reserved too.
TEST_P(StoreConformanceTest, ReservedChunksReadBackOnceCommitted) {
  ASSERT_OK_AND_ASSIGN(const uint64_t id, store_->BeginData());
  std::vector<ChunkSpace> spaces;
  std::vector<std::string> bytes;
  auto add = [&](ChunkAddress a, size_t n, uint32_t stream, bool sole) {
    spaces.push_back({a, static_cast<int64_t>(n), stream, sole});
    bytes.push_back(RandomBytes(n, 100 + bytes.size()));
  };
  add(Addr(id, 0, 0, 1), (1 << 20) + 3, 3, false);  // chunks of a slice in any order
  add(Addr(id, 0, 0, 0), 4096, 3, false);
  add(Addr(id, 0, 0, 2), 0, 3, false);
  add(Addr(id, 1, 0, 0), 700, 3, true);  // a sole chunk: its location goes to a pack
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkReservation> r, store_->ReserveChunks(spaces));
  ASSERT_EQ(r->size(), spaces.size());
  for (size_t i = 0; i < spaces.size(); ++i) ASSERT_NO_FATAL_FAILURE(FillReserved(*r, i, bytes[i]));
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(spaces[0].address));
  ASSERT_OK(r->Commit());
  r.reset();
  for (size_t i = 0; i < spaces.size(); ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(spaces[i].address, bytes[i]));
  }
  EXPECT_EQ(store_->stats().chunks_written, 4);

  // Dropped uncommitted: nothing recorded, the chunks around it intact.
  ASSERT_OK_AND_ASSIGN(r, store_->ReserveChunks({{Addr(id, 2, 0, 0), 100, 3, false}}));
  ASSERT_NO_FATAL_FAILURE(FillReserved(*r, 0, std::string(100, 'd')));
  r.reset();
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 2, 0, 0)));
  ASSERT_OK(store_->PutChunks({ChunkWrite{Addr(id, 3, 0, 0), "after", 3}}));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 3, 0, 0), "after"));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(spaces[0].address, bytes[0]));

  // Several streams in one call.
  ASSERT_OK_AND_ASSIGN(r, store_->ReserveChunks({{Addr(id, 4, 0, 0), 10, 1, false},
                                                 {Addr(id, 4, 0, 1), 20, 2, false}}));
  ASSERT_NO_FATAL_FAILURE(FillReserved(*r, 0, std::string(10, 'e')));
  ASSERT_NO_FATAL_FAILURE(FillReserved(*r, 1, std::string(20, 'f')));
  ASSERT_OK(r->Commit());
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 4, 0, 0), std::string(10, 'e')));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 4, 0, 1), std::string(20, 'f')));

  // The data id discarded while a reservation is open: the discard goes ahead, the commit fails.
  ASSERT_OK_AND_ASSIGN(const uint64_t doomed, store_->BeginData());
  ASSERT_OK_AND_ASSIGN(r, store_->ReserveChunks({{Addr(doomed, 0, 0, 0), 50, 0, false}}));
  ASSERT_NO_FATAL_FAILURE(FillReserved(*r, 0, std::string(50, 'g')));
  ASSERT_OK(store_->DiscardData(doomed));
  const absl::Status late = r->Commit();
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  r.reset();
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(doomed, 0, 0, 0)));

  // Not live: refused at once (segment store) or at the commit (the default's PutChunks).
  absl::StatusOr<std::unique_ptr<ChunkReservation>> never =
      store_->ReserveChunks({{Addr(987654, 0, 0, 0), 5, 0, false}});
  const absl::Status refused = never.ok() ? (*never)->Commit() : never.status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(Msg(refused), HasSubstr("987654"));
  const absl::StatusOr<std::unique_ptr<ChunkReservation>> negative =
      store_->ReserveChunks({{Addr(id, 5, 0, 0), -1, 0, false}});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument) << negative.status();
}

TEST_P(StoreConformanceTest, PutChunksRequiresLiveData) {
  absl::Status never = store_->PutChunks({ChunkWrite{Addr(987654, 0, 0, 0), "x"}});
  EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition) << never;
  EXPECT_THAT(Msg(never), HasSubstr("987654"));

  std::vector<std::pair<ChunkAddress, std::string>> chunks = {{Addr(0, 0, 0, 0), "a"}};
  const uint64_t committed = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("ckpt", "manifest", committed));
  absl::Status after_commit = store_->PutChunks({ChunkWrite{Addr(committed, 0, 0, 1), "b"}});
  EXPECT_EQ(after_commit.code(), absl::StatusCode::kFailedPrecondition) << after_commit;
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(committed, 0, 0, 1)));

  ASSERT_OK_AND_ASSIGN(const uint64_t discarded, store_->BeginData());
  ASSERT_OK(store_->DiscardData(discarded));
  absl::Status after_discard = store_->PutChunks({ChunkWrite{Addr(discarded, 0, 0, 0), "c"}});
  EXPECT_EQ(after_discard.code(), absl::StatusCode::kFailedPrecondition) << after_discard;

  // A batch with one bad id writes nothing at all.
  ASSERT_OK_AND_ASSIGN(const uint64_t live, store_->BeginData());
  absl::Status mixed = store_->PutChunks(
      {ChunkWrite{Addr(live, 0, 0, 0), "d"}, ChunkWrite{Addr(discarded, 0, 0, 0), "e"}});
  EXPECT_EQ(mixed.code(), absl::StatusCode::kFailedPrecondition) << mixed;
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(live, 0, 0, 0)));
  EXPECT_EQ(store_->stats().chunks_written, 1);
}

TEST_P(StoreConformanceTest, DiscardDataRemovesOnlyItsChunks) {
  std::vector<std::pair<ChunkAddress, std::string>> before = {{Addr(0, 0, 0, 0), "before"},
                                                              {Addr(0, 9, 9, 9), "before-last"}};
  std::vector<std::pair<ChunkAddress, std::string>> victim = {
      {Addr(0, 0, 0, 0), "v0"},
      {Addr(0, 0, 0, 1), RandomBytes(9000, 6)},
      {Addr(0, 0xffffffffu, 0xffffffffu, 0xffffffffu), "v-last"}};
  std::vector<std::pair<ChunkAddress, std::string>> after = {{Addr(0, 0, 0, 0), "after"}};
  Upload(&before);
  const uint64_t id = Upload(&victim);
  Upload(&after);

  ASSERT_OK(store_->DiscardData(id));
  for (const auto& [address, bytes] : victim) ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(address));
  for (const auto& [address, bytes] : before) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  for (const auto& [address, bytes] : after) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));

  absl::Status again = store_->DiscardData(id);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  // A discarded id cannot be committed either.
  absl::Status commit = store_->CommitCheckpoint("late", "m", id);
  EXPECT_EQ(commit.code(), absl::StatusCode::kFailedPrecondition) << commit;
  EXPECT_EQ(store_->GetManifest("late").status().code(), absl::StatusCode::kNotFound);
}

// --- Checkpoints --------------------------------------------------------------------------------

TEST_P(StoreConformanceTest, CommitMakesManifestVisibleOnce) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {{Addr(0, 0, 0, 0), "bytes"}};
  const uint64_t id = Upload(&chunks);
  absl::StatusOr<std::string> before = store_->GetManifest("run1/step100");
  EXPECT_EQ(before.status().code(), absl::StatusCode::kNotFound) << before.status();
  EXPECT_THAT(Msg(before.status()), HasSubstr("run1/step100"));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ids, store_->ListCheckpoints());
  EXPECT_THAT(ids, IsEmpty());

  const std::string manifest("mani\0fest", 9);
  ASSERT_OK(store_->CommitCheckpoint("run1/step100", manifest, id));
  ASSERT_OK_AND_ASSIGN(std::string got, store_->GetManifest("run1/step100"));
  EXPECT_EQ(got, manifest);
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(chunks[0].first, "bytes"));

  // A second upload under the same checkpoint id loses and changes nothing; its data stays live.
  std::vector<std::pair<ChunkAddress, std::string>> second = {{Addr(0, 0, 0, 0), "second"}};
  const uint64_t id2 = Upload(&second);
  absl::Status dup = store_->CommitCheckpoint("run1/step100", "other manifest", id2);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;
  EXPECT_THAT(Msg(dup), HasSubstr("run1/step100"));
  ASSERT_OK_AND_ASSIGN(got, store_->GetManifest("run1/step100"));
  EXPECT_EQ(got, manifest);
  EXPECT_OK(store_->PutChunks({ChunkWrite{Addr(id2, 0, 0, 1), "still live"}}));
  EXPECT_OK(store_->DiscardData(id2));

  // The committed data id is no longer live: it cannot back a second checkpoint.
  absl::Status reuse = store_->CommitCheckpoint("run1/step200", manifest, id);
  EXPECT_EQ(reuse.code(), absl::StatusCode::kFailedPrecondition) << reuse;
  absl::Status unknown = store_->CommitCheckpoint("run1/step300", manifest, 555555);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kFailedPrecondition) << unknown;
  ASSERT_OK_AND_ASSIGN(ids, store_->ListCheckpoints());
  EXPECT_THAT(ids, ElementsAre("run1/step100"));
}

TEST_P(StoreConformanceTest, ConcurrentCommitsOfOneIdHaveOneWinner) {
  constexpr int kThreads = 6;
  std::vector<uint64_t> ids;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_OK_AND_ASSIGN(uint64_t id, store_->BeginData());
    ids.push_back(id);
  }
  std::vector<absl::Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      results[i] = store_->CommitCheckpoint("same", "manifest " + std::to_string(i), ids[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  int winner = -1;
  for (int i = 0; i < kThreads; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(winner, -1) << "commits " << winner << " and " << i << " both won";
      winner = i;
    } else {
      EXPECT_EQ(results[i].code(), absl::StatusCode::kAlreadyExists) << results[i];
    }
  }
  ASSERT_NE(winner, -1);
  ASSERT_OK_AND_ASSIGN(std::string got, store_->GetManifest("same"));
  EXPECT_EQ(got, "manifest " + std::to_string(winner));
}

TEST_P(StoreConformanceTest, ListCheckpointsIsSorted) {
  for (const char* name : {"b", "a/2", "a/10", "c", "A"}) {
    ASSERT_OK_AND_ASSIGN(uint64_t id, store_->BeginData());
    ASSERT_OK(store_->CommitCheckpoint(name, name, id));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ids, store_->ListCheckpoints());
  EXPECT_THAT(ids, ElementsAre("A", "a/10", "a/2", "b", "c"));
}

TEST_P(StoreConformanceTest, DeleteCheckpointRemovesManifestAndChunks) {
  std::vector<std::pair<ChunkAddress, std::string>> first = {
      {Addr(0, 0, 0, 0), "first0"}, {Addr(0, 5, 2, 7), RandomBytes(70000, 7)}};
  std::vector<std::pair<ChunkAddress, std::string>> second = {{Addr(0, 0, 0, 0), "second0"}};
  const uint64_t id1 = Upload(&first);
  ASSERT_OK(store_->CommitCheckpoint("one", "m1", id1));
  const uint64_t id2 = Upload(&second);
  ASSERT_OK(store_->CommitCheckpoint("two", "m2", id2));
  // Read once before the delete (so that any location the store keeps in memory is kept).
  for (const auto& [address, bytes] : first) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));

  ASSERT_OK(store_->DeleteCheckpoint("one"));
  EXPECT_EQ(store_->GetManifest("one").status().code(), absl::StatusCode::kNotFound);
  for (const auto& [address, bytes] : first) ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(address));
  for (const auto& [address, bytes] : second) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ids, store_->ListCheckpoints());
  EXPECT_THAT(ids, ElementsAre("two"));

  absl::Status again = store_->DeleteCheckpoint("one");
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_THAT(Msg(again), HasSubstr("one"));
  // The id is free again.
  ASSERT_OK_AND_ASSIGN(uint64_t id3, store_->BeginData());
  EXPECT_OK(store_->CommitCheckpoint("one", "m3", id3));
}

// Reads of data ids not begun yet, and of blobs still being uploaded, find nothing or what is
// there so far; they must not hide the chunks written later (the segment store keeps the chunk
// locations of committed blobs in memory).
TEST_P(StoreConformanceTest, ReadsBeforeAndDuringAnUploadDoNotHideItsChunks) {
  ASSERT_OK_AND_ASSIGN(const uint64_t before, store_->BeginData());
  ASSERT_OK(store_->DiscardData(before));
  const uint64_t next = before + 1;  // ids are handed out in order (BeginDataReturnsFreshIds)
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(next, 0, 0, 0)));
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(next, 0, 0, 1)));
  ASSERT_OK_AND_ASSIGN(const uint64_t id, store_->BeginData());
  ASSERT_EQ(id, next);
  const std::string a = RandomBytes(3000, 61), b = RandomBytes(5000, 62), c = "c";
  ASSERT_OK(store_->PutChunks({{Addr(id, 0, 0, 0), a}}));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 0, 0, 0), a));
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 0, 0, 1)));
  ASSERT_OK(store_->PutChunks({{Addr(id, 0, 0, 1), b}, {Addr(id, 0, 0, 3), c}}));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 0, 0, 1), b));
  ASSERT_OK(store_->CommitCheckpoint("late", "m", id));
  for (int round = 0; round < 2; ++round) {
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 0, 0, 0), a));
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 0, 0, 1), b));
    ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 0, 0, 2)));  // a gap in the blob
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 0, 0, 3), c));
    ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 0, 0, 4)));
    ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 0, 1, 0)));  // another blob
  }
}

// A committed checkpoint of thousands of small blobs (more locations than one scan reads ahead in
// the segment store), some of several chunks, some with gaps, blobs and tensors skipped, next to
// another committed data id: every chunk read finds its own bytes whichever blob is read first,
// and chunks and blobs that were never written are not found.
TEST_P(StoreConformanceTest, ManySmallBlobsReadInAnyOrderFindEveryChunk) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks, other = {{Addr(0, 0, 0, 0), "other"}};
  std::vector<ChunkAddress> missing;
  for (uint32_t tensor = 0; tensor < 3; ++tensor) {
    if (tensor == 1) continue;  // a tensor without chunks
    for (uint32_t blob = 0; blob < 3000; ++blob) {
      if (blob % 7 == 3) {  // a blob without chunks
        missing.push_back(Addr(0, tensor, blob, 0));
        continue;
      }
      const uint32_t count = 1 + blob % 3;
      for (uint32_t chunk = 0; chunk < count + 1; ++chunk) {
        if (count > 1 && chunk == 1) {  // a gap inside the blob
          missing.push_back(Addr(0, tensor, blob, chunk));
          continue;
        }
        chunks.push_back(
            {Addr(0, tensor, blob, chunk), absl::StrCat("t", tensor, "b", blob, "c", chunk)});
      }
      missing.push_back(Addr(0, tensor, blob, count + 1));  // past its end
    }
  }
  missing.push_back(Addr(0, 1, 0, 0));
  const uint64_t id = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("many", "m", id));
  const uint64_t other_id = Upload(&other);
  ASSERT_OK(store_->CommitCheckpoint("other", "m", other_id));
  for (ChunkAddress& a : missing) a.data_id = id;
  // From the middle on, then from the start (blobs read ahead by then, and not), then backwards.
  std::vector<size_t> order(chunks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(order.size() / 2),
              order.end());
  for (size_t i : order) ASSERT_NO_FATAL_FAILURE(ExpectChunk(chunks[i].first, chunks[i].second));
  for (size_t i = chunks.size(); i-- > 0;) {
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(chunks[i].first, chunks[i].second));
  }
  for (const ChunkAddress& a : missing) ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(a));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(other[0].first, other[0].second));
}

// --- Garbage collection -------------------------------------------------------------------------

TEST_P(StoreConformanceTest, CollectGarbageKeepsLiveAndCommittedData) {
  std::vector<std::pair<ChunkAddress, std::string>> committed = {
      {Addr(0, 0, 0, 0), "c0"}, {Addr(0, 1, 0, 0), RandomBytes(10000, 8)}};
  std::vector<std::pair<ChunkAddress, std::string>> unfinished = {
      {Addr(0, 0, 0, 0), "u0"}, {Addr(0, 2, 0, 0), RandomBytes(10000, 9)}};
  std::vector<std::pair<ChunkAddress, std::string>> discarded = {{Addr(0, 0, 0, 0), "d0"}};
  const uint64_t committed_id = Upload(&committed);
  ASSERT_OK(store_->CommitCheckpoint("kept", "m", committed_id));
  const uint64_t unfinished_id = Upload(&unfinished);
  const uint64_t discarded_id = Upload(&discarded);
  ASSERT_OK(store_->DiscardData(discarded_id));

  // The unfinished upload is live: collection must not touch it.
  ASSERT_OK_AND_ASSIGN(int64_t collected, store_->CollectGarbage());
  EXPECT_EQ(collected, 0);
  for (const auto& [address, bytes] : committed)
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  for (const auto& [address, bytes] : unfinished)
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  EXPECT_OK(store_->PutChunks({ChunkWrite{Addr(unfinished_id, 3, 0, 0), "more"}}));

  if (!persistent()) return;
  // A restart ends every upload (as a crash would): the unfinished one is collected at open.
  ASSERT_NO_FATAL_FAILURE(Reopen());
  for (const auto& [address, bytes] : unfinished) ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(address));
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(unfinished_id, 3, 0, 0)));
  for (const auto& [address, bytes] : committed)
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  absl::Status stale = store_->PutChunks({ChunkWrite{Addr(unfinished_id, 0, 0, 0), "x"}});
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  ASSERT_OK_AND_ASSIGN(collected, store_->CollectGarbage());
  EXPECT_EQ(collected, 0);  // already done by the open
  ASSERT_OK_AND_ASSIGN(const uint64_t next, store_->BeginData());
  EXPECT_GT(next, std::max({committed_id, unfinished_id, discarded_id}));
}

// --- Free disk ----------------------------------------------------------------------------------

TEST_P(StoreConformanceTest, PutChunksRefusedBelowDiskReserve) {
  auto free_bytes = std::make_shared<std::atomic<int64_t>>(1 << 20);
  options_.min_free_disk_bytes = 1000;
  options_.free_disk_bytes = [free_bytes]() -> absl::StatusOr<int64_t> {
    return free_bytes->load();
  };
  store_.reset();
  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_OK_AND_ASSIGN(const uint64_t id, store_->BeginData());
  free_bytes->store(500);

  absl::Status full = store_->PutChunks({ChunkWrite{Addr(id, 0, 0, 0), "abc"}});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(Msg(full), HasSubstr("500 bytes free"));
  EXPECT_THAT(Msg(full), HasSubstr("reserve of 1000 bytes"));
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 0, 0, 0)));

  // The check counts the bytes about to be written: 1010 free leaves room for 10, not 11.
  free_bytes->store(1010);
  absl::Status would_fall_below =
      store_->PutChunks({ChunkWrite{Addr(id, 0, 0, 0), std::string(11, 'x')}});
  EXPECT_EQ(would_fall_below.code(), absl::StatusCode::kResourceExhausted) << would_fall_below;
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 0, 0, 0)));
  // Reserved chunks count the same way (refused at the reservation or at its commit).
  absl::StatusOr<std::unique_ptr<ChunkReservation>> reserved =
      store_->ReserveChunks({{Addr(id, 0, 0, 0), 11, 0, false}});
  const absl::Status reserved_full = reserved.ok() ? (*reserved)->Commit() : reserved.status();
  EXPECT_EQ(reserved_full.code(), absl::StatusCode::kResourceExhausted) << reserved_full;
  reserved = absl::UnknownError("dropped");
  ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(Addr(id, 0, 0, 0)));
  ASSERT_OK(store_->PutChunks({ChunkWrite{Addr(id, 0, 0, 0), std::string(10, 'x')}}));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(Addr(id, 0, 0, 0), std::string(10, 'x')));
  EXPECT_EQ(store_->stats().chunks_written, 1);

  // A failing measurement refuses the write rather than risking the disk.
  options_.free_disk_bytes = []() -> absl::StatusOr<int64_t> {
    return absl::UnavailableError("statfs failed");
  };
  store_.reset();
  ASSERT_NO_FATAL_FAILURE(Open());
  // The segment store measures before every write, the data id counter's included.
  absl::StatusOr<uint64_t> id2 = store_->BeginData();
  absl::Status broken =
      id2.ok() ? store_->PutChunks({ChunkWrite{Addr(*id2, 0, 0, 0), "abc"}}) : id2.status();
  EXPECT_FALSE(broken.ok());
  EXPECT_THAT(Msg(broken), HasSubstr("statfs failed"));
}

// --- Jobs ---------------------------------------------------------------------------------------

TEST_P(StoreConformanceTest, JobsPutGetListOverwrite) {
  absl::StatusOr<std::string> missing = store_->GetJob("job-1");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(Msg(missing.status()), HasSubstr("job-1"));
  ASSERT_OK_AND_ASSIGN(std::vector<JobRecord> jobs, store_->ListJobs());
  EXPECT_THAT(jobs, IsEmpty());

  ASSERT_OK(store_->PutJob("job-2", "queued"));
  ASSERT_OK(store_->PutJob("job-1", std::string("run\0ning", 8)));
  ASSERT_OK(store_->PutJob("job-2", "done"));
  ASSERT_OK_AND_ASSIGN(std::string got, store_->GetJob("job-2"));
  EXPECT_EQ(got, "done");
  ASSERT_OK_AND_ASSIGN(jobs, store_->ListJobs());
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].id, "job-1");
  EXPECT_EQ(jobs[0].record, std::string("run\0ning", 8));
  EXPECT_EQ(jobs[1].id, "job-2");
  EXPECT_EQ(jobs[1].record, "done");
}

TEST_P(StoreConformanceTest, JobsDeleteRemovesOneRecordAndIgnoresUnknownIds) {
  ASSERT_OK(store_->PutJob("job-1", "a"));
  ASSERT_OK(store_->PutJob("job-2", "b"));
  ASSERT_OK(store_->DeleteJob("job-1"));
  ASSERT_OK(store_->DeleteJob("never-there"));
  EXPECT_EQ(store_->GetJob("job-1").status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(std::vector<JobRecord> jobs, store_->ListJobs());
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].id, "job-2");
}

// --- Concurrency --------------------------------------------------------------------------------

TEST_P(StoreConformanceTest, ConcurrentUploadsAndReads) {
  constexpr int kThreads = 4;
  constexpr uint32_t kChunks = 60;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto fail = [&](const std::string& what, const absl::Status& s) {
        if (errors[t].empty()) errors[t] = what + ": " + s.ToString();
      };
      absl::StatusOr<uint64_t> id = store_->BeginData();
      if (!id.ok()) return fail("BeginData", id.status());
      std::vector<std::string> payloads;
      for (uint32_t c = 0; c < kChunks; ++c) {
        payloads.push_back(RandomBytes(100 + (c * 131) % 9000, t * 1000 + c));
      }
      for (uint32_t c = 0; c < kChunks; c += 6) {
        std::vector<ChunkWrite> batch;
        for (uint32_t k = c; k < c + 6; ++k) batch.push_back({Addr(*id, 0, k % 2, k), payloads[k]});
        absl::Status put = store_->PutChunks(batch);
        if (!put.ok()) return fail("PutChunks", put);
        // Read back what this thread wrote so far while the others keep writing.
        absl::StatusOr<std::unique_ptr<ChunkData>> data =
            store_->ReadChunk(Addr(*id, 0, c % 2, c), Checksum(payloads[c]));
        if (!data.ok()) return fail("ReadChunk", data.status());
      }
      // Every other thread throws its upload away; the rest commit.
      if (t % 2 == 1) {
        absl::Status discard = store_->DiscardData(*id);
        if (!discard.ok()) fail("DiscardData", discard);
        return;
      }
      absl::Status commit = store_->CommitCheckpoint("ckpt-" + std::to_string(t), "m", *id);
      if (!commit.ok()) return fail("CommitCheckpoint", commit);
      for (uint32_t k = 0; k < kChunks; ++k) {
        absl::StatusOr<std::unique_ptr<ChunkData>> data =
            store_->ReadChunk(Addr(*id, 0, k % 2, k), Checksum(payloads[k]));
        if (!data.ok()) return fail("ReadChunk after commit", data.status());
      }
    });
  }
  // Garbage collection concurrently with everything else must not remove live or committed data.
  std::string gc_error;
  threads.emplace_back([&] {
    for (int i = 0; i < 5; ++i) {
      absl::StatusOr<int64_t> collected = store_->CollectGarbage();
      if (!collected.ok()) gc_error = collected.status().ToString();
    }
  });
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(gc_error, IsEmpty());
  for (int t = 0; t < kThreads; ++t) EXPECT_THAT(errors[t], IsEmpty()) << "thread " << t;
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ids, store_->ListCheckpoints());
  EXPECT_THAT(ids, ElementsAre("ckpt-0", "ckpt-2"));
  EXPECT_EQ(store_->stats().chunks_written, kThreads * kChunks);
}

// The ranks of one upload write their chunks at once, each as a stream of its own (and one batch
// mixes two streams): every chunk reads back, while the others write and after the commit.
TEST_P(StoreConformanceTest, StreamsOfOneUploadReadBack) {
  ASSERT_OK_AND_ASSIGN(const uint64_t id, store_->BeginData());
  constexpr uint32_t kStreams = 4;
  constexpr uint32_t kChunks = 40;
  auto payload = [](uint32_t stream, uint32_t c) {
    return RandomBytes(1000 + (c * 7919 + stream * 104729) % 70000, stream * 1000 + c);
  };
  std::vector<std::string> errors(kStreams);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kStreams; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t c = 0; c < kChunks; c += 4) {
        std::vector<std::string> bytes;
        std::vector<ChunkWrite> batch;
        for (uint32_t k = c; k < c + 4; ++k) bytes.push_back(payload(t, k));
        for (uint32_t k = c; k < c + 4; ++k) {
          batch.push_back({Addr(id, t, 0, k), bytes[k - c], t});
        }
        if (t == 0 && c == 0) batch.back().stream = 7;  // a batch of two streams
        if (absl::Status put = store_->PutChunks(batch); !put.ok()) {
          errors[t] = put.ToString();
          return;
        }
        for (uint32_t k = 0; k < c + 4; ++k) {
          auto data = store_->ReadChunk(Addr(id, t, 0, k), Checksum(payload(t, k)));
          if (!data.ok()) {
            errors[t] = data.status().ToString();
            return;
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t t = 0; t < kStreams; ++t) EXPECT_THAT(errors[t], IsEmpty()) << "stream " << t;
  ASSERT_OK(store_->CommitCheckpoint("streams", "m", id));
  for (uint32_t t = 0; t < kStreams; ++t) {
    for (uint32_t k = 0; k < kChunks; ++k) {
      ASSERT_OK_AND_ASSIGN(auto data,
                           store_->ReadChunk(Addr(id, t, 0, k), Checksum(payload(t, k))));
      EXPECT_EQ(data->bytes(), payload(t, k)) << "stream " << t << " chunk " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreConformanceTest,
                         ::testing::Values(StoreKind::kMemory, StoreKind::kSegment),
                         [](const ::testing::TestParamInfo<StoreKind>& info) {
                           return KindName(info.param);
                         });

// --- Segment store only -------------------------------------------------------------------------

class SegmentStoreTest : public StoreFixture {
 protected:
  SegmentStoreTest() : StoreFixture(StoreKind::kSegment) {}
};

TEST_F(SegmentStoreTest, EverythingPersistsAcrossReopen) {
  ASSERT_OK(store_->PutStrategy("dp8", "strategy", false));
  ASSERT_OK(store_->PutJob("job-1", "running"));
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {
      {Addr(0, 0, 0, 0), RandomBytes(1 << 20, 11)},
      {Addr(0, 0, 0, 1), "small"},
      {Addr(0, 1, 0, 0), ""}};
  const uint64_t id = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("ckpt", "manifest", id));
  // Part before a Flush (in SST files), part only in the WAL.
  ASSERT_OK(store_->Flush());
  ASSERT_OK(store_->PutStrategy("tp2", "strategy2", false));
  ASSERT_OK(store_->PutJob("job-1", "done"));
  std::vector<std::pair<ChunkAddress, std::string>> more = {
      {Addr(0, 0, 0, 0), RandomBytes(300000, 12)}};
  const uint64_t id2 = Upload(&more);
  ASSERT_OK(store_->CommitCheckpoint("ckpt2", "manifest2", id2));

  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_EQ(store_->stats().chunks_written, 0);  // counters are per open
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> strategies, store_->ListStrategies());
  EXPECT_THAT(strategies, ElementsAre("dp8", "tp2"));
  ASSERT_OK_AND_ASSIGN(std::string got, store_->GetStrategy("tp2"));
  EXPECT_EQ(got, "strategy2");
  ASSERT_OK_AND_ASSIGN(got, store_->GetJob("job-1"));
  EXPECT_EQ(got, "done");
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ids, store_->ListCheckpoints());
  EXPECT_THAT(ids, ElementsAre("ckpt", "ckpt2"));
  ASSERT_OK_AND_ASSIGN(got, store_->GetManifest("ckpt2"));
  EXPECT_EQ(got, "manifest2");
  for (const auto& [address, bytes] : chunks) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  for (const auto& [address, bytes] : more) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));

  // Deleting after a reopen still finds the data id behind the manifest.
  ASSERT_OK(store_->DeleteCheckpoint("ckpt"));
  ASSERT_NO_FATAL_FAILURE(Reopen());
  for (const auto& [address, bytes] : chunks) ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(address));
  for (const auto& [address, bytes] : more) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  ASSERT_OK_AND_ASSIGN(const uint64_t next, store_->BeginData());
  EXPECT_GT(next, id2);
}

// Bytes of the store's segment files (chunk bytes) under the store directory `dir`.
int64_t SegmentFileBytes(const std::string& dir) {
  int64_t bytes = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(dir + "/" + segment_store_internal::kSegmentsDir)) {
    if (entry.path().extension() == ".seg") bytes += static_cast<int64_t>(entry.file_size());
  }
  return bytes;
}

std::string SegmentPath(const std::string& dir, uint64_t data_id) {
  return dir + "/" + segment_store_internal::kSegmentsDir + "/" +
         segment_internal::SegmentFileName(data_id);
}

TEST_F(SegmentStoreTest, DeletedCheckpointsGiveTheirSegmentFilesBack) {
  constexpr int kChunks = 6;
  constexpr int kChunkBytes = 1 << 20;
  std::vector<std::pair<ChunkAddress, std::string>> kept, dropped;
  for (int c = 0; c < kChunks; ++c) {
    kept.push_back({Addr(0, 0, 0, c), RandomBytes(kChunkBytes, 100 + c)});
    dropped.push_back({Addr(0, 0, 0, c), RandomBytes(kChunkBytes, 200 + c)});
  }
  const uint64_t kept_id = Upload(&kept);
  ASSERT_OK(store_->CommitCheckpoint("kept", "m1", kept_id));
  const uint64_t dropped_id = Upload(&dropped);
  ASSERT_OK(store_->CommitCheckpoint("dropped", "m2", dropped_id));
  const int64_t before = SegmentFileBytes(db_dir_);
  EXPECT_GE(before, 2 * kChunks * kChunkBytes);

  ASSERT_OK(store_->DeleteCheckpoint("dropped"));
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(db_dir_, dropped_id)));
  EXPECT_TRUE(std::filesystem::exists(SegmentPath(db_dir_, kept_id)));
  ASSERT_OK_AND_ASSIGN(const int64_t collected, store_->CollectGarbage());
  EXPECT_EQ(collected, 0);  // nothing uncommitted
  const int64_t after = SegmentFileBytes(db_dir_);
  EXPECT_LE(after, before - kChunks * kChunkBytes) << "segment bytes " << before << " -> " << after;
  for (const auto& [address, bytes] : kept) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  for (const auto& [address, bytes] : dropped) ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(address));
}

// A backup holds exactly the committed checkpoints, opens as a store of its own, and a segment
// file whose checkpoint is deleted while the backup runs stays until the backup ends. The delete
// runs inside the backup, from the free-space measurement it makes once it has pinned the files.
TEST_F(SegmentStoreTest, BackupCopiesCommittedDataAndDefersRemovalsUntilItEnds) {
  bool armed = false;
  bool victim_file_stayed = false;
  uint64_t victim_id = 0;
  options_.free_disk_bytes = [&]() -> absl::StatusOr<int64_t> {
    if (armed) {
      armed = false;
      EXPECT_OK(store_->DeleteCheckpoint("victim"));
      victim_file_stayed = std::filesystem::exists(SegmentPath(db_dir_, victim_id));
    }
    return int64_t{1} << 40;
  };
  ASSERT_NO_FATAL_FAILURE(Reopen());
  std::vector<std::pair<ChunkAddress, std::string>> kept, victim, pending;
  for (int c = 0; c < 3; ++c) {
    kept.push_back({Addr(0, 0, 0, c), RandomBytes(100000, 300 + c)});
    victim.push_back({Addr(0, 1, 0, c), RandomBytes(100000, 400 + c)});
    pending.push_back({Addr(0, 0, 1, c), RandomBytes(100000, 500 + c)});
  }
  const uint64_t kept_id = Upload(&kept);
  ASSERT_OK(store_->CommitCheckpoint("kept", "manifest of kept", kept_id));
  victim_id = Upload(&victim);
  ASSERT_OK(store_->CommitCheckpoint("victim", "manifest of victim", victim_id));
  Upload(&pending);  // never committed

  armed = true;
  const std::string target = root_ + "/backup";
  ASSERT_OK_AND_ASSIGN(const BackupStats stats, store_->Backup(target));
  EXPECT_TRUE(victim_file_stayed) << "a segment file was removed while a backup ran";
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(db_dir_, victim_id)))
      << "the deferred removal did not happen when the backup ended";
  EXPECT_EQ(stats.checkpoints, 1);
  EXPECT_EQ(stats.segment_files, 1);
  EXPECT_EQ(stats.linked_files, 1);
  EXPECT_EQ(stats.copied_files, 0);
  EXPECT_GE(stats.segment_bytes, 300000);
  EXPECT_EQ(store_->Backup(target).status().code(), absl::StatusCode::kAlreadyExists);

  // The copy, opened on its own while the original stays open.
  StoreOptions copy_options;
  copy_options.min_free_disk_bytes = 0;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointStore> copy,
                       OpenSegmentStore(target, copy_options));
  ASSERT_OK_AND_ASSIGN(const std::vector<std::string> ids, copy->ListCheckpoints());
  EXPECT_EQ(ids, std::vector<std::string>{"kept"});
  ASSERT_OK_AND_ASSIGN(const std::string manifest, copy->GetManifest("kept"));
  EXPECT_EQ(manifest, "manifest of kept");
  for (const auto& [address, bytes] : kept) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkData> data,
                         copy->ReadChunk(address, Checksum(bytes)));
    EXPECT_TRUE(data->bytes() == bytes) << address.ToString();
  }
  for (const auto& [address, bytes] : pending) {
    EXPECT_EQ(copy->ReadChunkUnverified(address).status().code(), absl::StatusCode::kNotFound);
  }
  // New data ids in the copy do not collide with its files.
  ASSERT_OK_AND_ASSIGN(const uint64_t fresh, copy->BeginData());
  EXPECT_GT(fresh, victim_id);
  EXPECT_EQ(NewMemoryStore()->Backup(root_ + "/memory").status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST_F(SegmentStoreTest, DataIdsNeverRepeatAcrossRestarts) {
  std::set<uint64_t> seen;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 3; ++i) {  // begun, never used: still never handed out again
      ASSERT_OK_AND_ASSIGN(uint64_t id, store_->BeginData());
      EXPECT_TRUE(seen.insert(id).second) << "data id " << id << " reused";
      EXPECT_EQ(id, *seen.rbegin());
    }
    ASSERT_NO_FATAL_FAILURE(Reopen());
  }
}

// The write-ahead logs (NNNNNN.log) in the store directory `dir`.
std::vector<std::string> LogFiles(const std::string& dir) {
  std::vector<std::string> logs;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".log") logs.push_back(entry.path().filename().string());
  }
  std::sort(logs.begin(), logs.end());
  return logs;
}

TEST_F(SegmentStoreTest, RestartsWithoutWritesDoNotGatherEmptyLogs) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {
      {Addr(0, 0, 0, 0), RandomBytes(4096, 21)}};
  const uint64_t id = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("ckpt", "manifest", id));
  ASSERT_OK(store_->PutStrategy("dp8", "strategy", false));  // in the log only
  for (int round = 0; round < 4; ++round) {
    ASSERT_NO_FATAL_FAILURE(Reopen());
    // Each open writes to a new log. The previous one goes: RocksDB retires the first reopen's
    // (it held records, flushed at recovery), the store deletes the later, empty ones.
    EXPECT_THAT(LogFiles(db_dir_), SizeIs(1)) << "after reopen " << round + 1;
  }
  ASSERT_OK_AND_ASSIGN(std::string got, store_->GetStrategy("dp8"));
  EXPECT_EQ(got, "strategy");
  ASSERT_OK_AND_ASSIGN(got, store_->GetManifest("ckpt"));
  EXPECT_EQ(got, "manifest");
  for (const auto& [address, bytes] : chunks) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  // Written after the last reopen, flushed (RocksDB then retires the logs it still counted,
  // some already deleted), and more in the current log, which the next open recovers.
  ASSERT_OK(store_->PutStrategy("tp2", "strategy2", false));
  ASSERT_OK(store_->Flush());
  ASSERT_OK(store_->PutStrategy("tp3", "strategy3", false));
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_THAT(LogFiles(db_dir_), SizeIs(1));
  ASSERT_OK_AND_ASSIGN(got, store_->GetStrategy("tp3"));
  EXPECT_EQ(got, "strategy3");
  ASSERT_OK_AND_ASSIGN(got, store_->GetStrategy("tp2"));
  EXPECT_EQ(got, "strategy2");
}

TEST_F(SegmentStoreTest, CorruptedChunkBytesAreDataLoss) {
  const std::string original = RandomBytes(8192, 13);
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {{Addr(0, 2, 0, 5), original}};
  const uint64_t id = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("ckpt", "m", id));
  store_.reset();

  {  // Flip one bit of the stored bytes behind the store's back (the only chunk: offset 0).
    const std::string path = SegmentPath(db_dir_, id);
    ASSERT_EQ(std::filesystem::file_size(path), original.size());
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(4000);
    file.put(static_cast<char>(original[4000] ^ 0x10));
    ASSERT_TRUE(file.good());
  }

  ASSERT_NO_FATAL_FAILURE(Open());
  absl::StatusOr<std::unique_ptr<ChunkData>> data =
      store_->ReadChunk(chunks[0].first, Checksum(original));
  ASSERT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(Msg(data.status()),
              HasSubstr("chunk " + chunks[0].first.ToString() + " failed its XXH3-64 checksum"));
  // Unverified, the stored bytes come back as they are: their reader must verify them.
  data = store_->ReadChunkUnverified(chunks[0].first);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->bytes().size(), original.size());
  EXPECT_NE((*data)->bytes(), original);
  EXPECT_TRUE(absl::IsDataLoss(VerifyChunk(chunks[0].first, (*data)->bytes(), Checksum(original))));
  EXPECT_TRUE(VerifyChunk(chunks[0].first, original, Checksum(original)).ok());
}

TEST_F(SegmentStoreTest, DamagedSegmentFilesAreDataLossNamingTheFile) {
  const std::string bytes = RandomBytes(10000, 31);
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {{Addr(0, 0, 0, 0), bytes},
                                                              {Addr(0, 0, 0, 1), bytes}};
  const uint64_t id = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("ckpt", "m", id));
  store_.reset();
  const std::string path = SegmentPath(db_dir_, id);
  std::filesystem::resize_file(path, 15000);  // the second chunk loses its tail

  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(chunks[0].first, bytes));  // the first is intact
  absl::StatusOr<std::unique_ptr<ChunkData>> data = store_->ReadChunkUnverified(chunks[1].first);
  ASSERT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(Msg(data.status()), HasSubstr("chunk " + chunks[1].first.ToString()));
  EXPECT_THAT(Msg(data.status()), HasSubstr(path));
  EXPECT_THAT(Msg(data.status()), HasSubstr("truncated"));
  store_.reset();

  std::filesystem::remove(path);
  ASSERT_NO_FATAL_FAILURE(Open());
  data = store_->ReadChunk(chunks[0].first, Checksum(bytes));
  ASSERT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << data.status();
  EXPECT_THAT(Msg(data.status()), HasSubstr(path));
  EXPECT_THAT(Msg(data.status()), HasSubstr("missing"));
  // The manifest is untouched: the damage is reported, nothing is deleted.
  ASSERT_OK_AND_ASSIGN(std::string manifest, store_->GetManifest("ckpt"));
  EXPECT_EQ(manifest, "m");
}

TEST_F(SegmentStoreTest, SegmentFilesOfUploadsThatNeverCommittedAreCollectedAtOpen) {
  std::vector<std::pair<ChunkAddress, std::string>> kept = {
      {Addr(0, 0, 0, 0), RandomBytes(5000, 41)}};
  const uint64_t kept_id = Upload(&kept);
  ASSERT_OK(store_->CommitCheckpoint("kept", "m", kept_id));
  std::vector<std::pair<ChunkAddress, std::string>> crashed = {
      {Addr(0, 0, 0, 0), RandomBytes(5000, 42)}, {Addr(0, 3, 1, 7), RandomBytes(70000, 43)}};
  const uint64_t crashed_id = Upload(&crashed);  // never committed: the process "stops" here
  ASSERT_TRUE(std::filesystem::exists(SegmentPath(db_dir_, crashed_id)));
  // A stray segment file of an id that was never handed out (e.g. copied in by hand).
  std::ofstream(SegmentPath(db_dir_, 999)) << "stray";

  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(db_dir_, crashed_id)));
  EXPECT_FALSE(std::filesystem::exists(SegmentPath(db_dir_, 999)));
  EXPECT_TRUE(std::filesystem::exists(SegmentPath(db_dir_, kept_id)));
  for (const auto& [address, bytes] : crashed) ASSERT_NO_FATAL_FAILURE(ExpectNoChunk(address));
  for (const auto& [address, bytes] : kept) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
}

using testing::Family;
using testing::WithRawDb;

// A database with a column family of chunk bytes (a layout this version does not read) is refused
// at open with FAILED_PRECONDITION naming the family and the directory, and left as it is.
TEST_F(SegmentStoreTest, StoresWithAChunkBytesColumnFamilyAreRefused) {
  ASSERT_OK(store_->PutStrategy("s", "strategy", false));
  store_.reset();
  WithRawDb(db_dir_, [&](rocksdb::DB* db, const std::vector<std::string>&,
                         const std::vector<rocksdb::ColumnFamilyHandle*>&) {
    rocksdb::ColumnFamilyHandle* chunks = nullptr;
    ASSERT_TRUE(db->CreateColumnFamily(rocksdb::ColumnFamilyOptions(),
                                       segment_store_internal::kChunkBytesFamily, &chunks)
                    .ok());
    EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), chunks,
                        segment_store_internal::ChunkKey(Addr(1, 0, 0, 0)), "bytes")
                    .ok());
    EXPECT_TRUE(db->DestroyColumnFamilyHandle(chunks).ok());
  });
  absl::StatusOr<std::unique_ptr<CheckpointStore>> refused = OpenSegmentStore(db_dir_, options_);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(Msg(refused.status()), AllOf(HasSubstr("cannot open RocksDB store in " + db_dir_),
                                           HasSubstr("has a \"chunks\" column family"),
                                           HasSubstr("keeps chunk bytes in segment files")));
  // Nothing was changed: the family is still there, with its record.
  WithRawDb(db_dir_, [&](rocksdb::DB* db, const std::vector<std::string>& names,
                         const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    rocksdb::ColumnFamilyHandle* chunks =
        Family(names, handles, segment_store_internal::kChunkBytesFamily);
    ASSERT_NE(chunks, nullptr);
    std::string value;
    EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), chunks,
                        segment_store_internal::ChunkKey(Addr(1, 0, 0, 0)), &value)
                    .ok());
  });
}

// A new store records its format version; a store recording a version this one does not read, or
// holding records without one, is refused at open with FAILED_PRECONDITION naming the problem; a
// store of an older readable version opens and is recorded as the current one.
TEST_F(SegmentStoreTest, OpenChecksTheStoreFormatVersion) {
  ASSERT_OK(store_->PutStrategy("s", "strategy", false));
  store_.reset();
  const std::string key = "v";
  auto set_version = [&](std::optional<uint64_t> version) {
    WithRawDb(db_dir_, [&](rocksdb::DB* db, const std::vector<std::string>& names,
                           const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
      rocksdb::ColumnFamilyHandle* meta =
          Family(names, handles, segment_store_internal::kMetaFamily);
      ASSERT_NE(meta, nullptr);
      if (!version) {
        EXPECT_TRUE(db->Delete(rocksdb::WriteOptions(), meta, key).ok());
        return;
      }
      std::string value;
      for (int shift = 56; shift >= 0; shift -= 8) {
        value.push_back(static_cast<char>((*version >> shift) & 0xff));
      }
      EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), meta, key, value).ok());
    });
  };
  // The version the store records is 2.
  auto expect_format_2 = [&] {
    WithRawDb(db_dir_, [&](rocksdb::DB* db, const std::vector<std::string>& names,
                           const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
      std::string value;
      ASSERT_TRUE(db->Get(rocksdb::ReadOptions(),
                          Family(names, handles, segment_store_internal::kMetaFamily), key, &value)
                      .ok());
      EXPECT_EQ(value, std::string("\0\0\0\0\0\0\0\2", 8));
    });
  };
  expect_format_2();
  EXPECT_EQ(segment_store_internal::kStoreFormatVersion, 2u);

  for (uint64_t unreadable : {uint64_t{3}, uint64_t{0}}) {
    set_version(unreadable);
    absl::StatusOr<std::unique_ptr<CheckpointStore>> refused = OpenSegmentStore(db_dir_, options_);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_THAT(Msg(refused.status()),
                AllOf(HasSubstr("cannot open RocksDB store in " + db_dir_),
                      HasSubstr(absl::StrCat("it is in store format ", unreadable,
                                             "; this version of ckptd reads formats 1 to 2"))));
  }
  absl::StatusOr<std::unique_ptr<CheckpointStore>> refused;

  set_version(std::nullopt);
  refused = OpenSegmentStore(db_dir_, options_);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(Msg(refused.status()), HasSubstr("it holds records but no store format version"));

  set_version(1);
  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_OK_AND_ASSIGN(std::string got, store_->GetStrategy("s"));
  EXPECT_EQ(got, "strategy");
  store_.reset();
  expect_format_2();
}

// Chunks are views of mapped segment files while the map budget allows, copies beyond it: the
// bytes are the same either way, and the stats say which.
TEST_F(SegmentStoreTest, ChunksBeyondTheMapBudgetAreReadAsCopies) {
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {
      {Addr(0, 0, 0, 0), RandomBytes(70000, 61)}, {Addr(0, 0, 0, 1), RandomBytes(5000, 62)}};
  const uint64_t id = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("ckpt", "m", id));
  int64_t total = 0;
  for (const auto& [address, bytes] : chunks) total += static_cast<int64_t>(bytes.size());
  {
    std::vector<std::unique_ptr<ChunkData>> held;
    for (const auto& [address, bytes] : chunks) {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkData> data,
                           store_->ReadChunk(address, Checksum(bytes)));
      EXPECT_EQ(data->bytes(), bytes);
      held.push_back(std::move(data));
    }
    EXPECT_EQ(store_->stats().chunk_bytes_copied, 0);
    EXPECT_GE(store_->stats().mapped_bytes, total);
  }

  options_.mapped_bytes_budget = 0;
  ASSERT_NO_FATAL_FAILURE(Reopen());
  for (const auto& [address, bytes] : chunks) ASSERT_NO_FATAL_FAILURE(ExpectChunk(address, bytes));
  EXPECT_GE(store_->stats().chunk_bytes_copied, total);
  EXPECT_EQ(store_->stats().chunk_bytes_copied, store_->stats().chunk_bytes_read);
  EXPECT_EQ(store_->stats().mapped_bytes, 0);

  options_.mapped_bytes_budget = -1;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> bad = OpenSegmentStore(db_dir_ + "2", options_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST_F(SegmentStoreTest, SecondOpenOfSameDirectoryFailsNamingIt) {
  absl::StatusOr<std::unique_ptr<CheckpointStore>> second = OpenSegmentStore(db_dir_, options_);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(Msg(second.status()), HasSubstr("cannot open RocksDB store in " + db_dir_));
  EXPECT_THAT(Msg(second.status()), HasSubstr("LOCK"));
  // The first store is unaffected.
  EXPECT_OK(store_->PutJob("j", "r"));
}

TEST_F(SegmentStoreTest, OpenCreatesMissingDirectories) {
  const std::string nested = root_ + "/a/b/c";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointStore> store, OpenSegmentStore(nested, options_));
  EXPECT_OK(store->PutStrategy("s", "r", false));
  EXPECT_TRUE(std::filesystem::exists(nested + "/CURRENT"));
}

TEST_F(SegmentStoreTest, OpenOnAFileFailsNamingIt) {
  const std::string file = root_ + "/not_a_dir";
  std::ofstream(file) << "x";
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenSegmentStore(file, options_);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(Msg(store.status()), HasSubstr(file));
}

TEST_F(SegmentStoreTest, MeasuresFreeDiskWhenNotInjected) {
  options_.min_free_disk_bytes = int64_t{1} << 60;  // more than any test machine has
  ASSERT_NO_FATAL_FAILURE(Reopen());                // read-only: the disk is below the reserve
  absl::Status full = store_->BeginData().status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(Msg(full), HasSubstr(db_dir_));
  EXPECT_THAT(Msg(full), HasSubstr(std::to_string(options_.min_free_disk_bytes)));
  EXPECT_THAT(Msg(full), HasSubstr("read-only"));

  options_.min_free_disk_bytes = 0;
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ASSERT_OK_AND_ASSIGN(const uint64_t id2, store_->BeginData());
  EXPECT_OK(store_->PutChunks({ChunkWrite{Addr(id2, 0, 0, 0), "abc"}}));
}

// Below the free-space reserve every write path is refused with RESOURCE_EXHAUSTED naming the
// reserve, reads keep working, and a store opened below it is read-only until reopened with room.
TEST_F(SegmentStoreTest, EveryWriteRefusedBelowTheReserveAndOpenIsReadOnly) {
  auto free_bytes = std::make_shared<std::atomic<int64_t>>(int64_t{1} << 30);
  options_.min_free_disk_bytes = 1 << 20;
  options_.free_disk_bytes = [free_bytes]() -> absl::StatusOr<int64_t> {
    return free_bytes->load();
  };
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ASSERT_OK(store_->PutStrategy("s", "strategy", false));
  ASSERT_OK(store_->PutStrategy("s2", "strategy2", false));
  ASSERT_OK(store_->PutJob("j", "job"));
  std::vector<std::pair<ChunkAddress, std::string>> chunks = {
      {Addr(0, 0, 0, 0), RandomBytes(100000, 3)}};
  const uint64_t id = Upload(&chunks);
  ASSERT_OK(store_->CommitCheckpoint("c", "manifest", id));
  std::vector<std::pair<ChunkAddress, std::string>> pending = {{Addr(0, 0, 0, 0), "pending"}};
  const uint64_t pending_id = Upload(&pending);

  auto expect_refused = [](const absl::Status& s, std::string_view what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << what << ": " << s;
    EXPECT_THAT(Msg(s), HasSubstr("--min-free-disk-mib")) << what;
  };
  // `live`: the pending upload is still live (in the first store only).
  auto expect_all_refused = [&](bool live) {
    expect_refused(store_->PutStrategy("s3", "x", false), "PutStrategy");
    expect_refused(store_->DeleteStrategy("s2"), "DeleteStrategy");
    expect_refused(store_->BeginData().status(), "BeginData");
    if (live) {
      expect_refused(store_->PutChunks({ChunkWrite{Addr(pending_id, 0, 0, 1), "x"}}), "PutChunks");
      expect_refused(store_->CommitCheckpoint("c2", "m", pending_id), "CommitCheckpoint");
    }
    expect_refused(store_->DeleteCheckpoint("c"), "DeleteCheckpoint");
    expect_refused(store_->PutJob("j", "job2"), "PutJob");
    expect_refused(store_->CollectGarbage().status(), "CollectGarbage");
    expect_refused(store_->Flush(), "Flush");
    // Reads still work.
    ASSERT_NO_FATAL_FAILURE(ExpectChunk(chunks[0].first, chunks[0].second));
    ASSERT_OK_AND_ASSIGN(std::string manifest, store_->GetManifest("c"));
    EXPECT_EQ(manifest, "manifest");
    ASSERT_OK_AND_ASSIGN(std::string job, store_->GetJob("j"));
    EXPECT_EQ(job, "job");
    ASSERT_OK_AND_ASSIGN(std::vector<std::string> strategies, store_->ListStrategies());
    EXPECT_THAT(strategies, ElementsAre("s", "s2"));
  };
  free_bytes->store(1000);
  expect_all_refused(true);
  // With room again, writes work on the open store (the pending upload commits).
  free_bytes->store(int64_t{1} << 30);
  ASSERT_OK(store_->CommitCheckpoint("c2", "m", pending_id));

  // Opened below the reserve: read-only, whatever the space later.
  free_bytes->store(1000);
  ASSERT_NO_FATAL_FAILURE(Reopen());
  expect_all_refused(false);
  free_bytes->store(int64_t{1} << 30);
  absl::Status read_only = store_->PutStrategy("s3", "x", false);
  EXPECT_EQ(read_only.code(), absl::StatusCode::kResourceExhausted) << read_only;
  EXPECT_THAT(Msg(read_only), HasSubstr("read-only"));
  // Reopened with room: writable again.
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ASSERT_OK(store_->PutStrategy("s3", "x", false));
  ASSERT_OK(store_->DeleteCheckpoint("c"));
  ASSERT_OK(store_->Flush());

  // A new store cannot be created on a full disk.
  free_bytes->store(1000);
  absl::StatusOr<std::unique_ptr<CheckpointStore>> fresh =
      OpenSegmentStore(root_ + "/new", options_);
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kResourceExhausted) << fresh.status();
}

}  // namespace
}  // namespace ckpt
