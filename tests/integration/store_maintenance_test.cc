// The operator's maintenance paths against a real ckptd: `ckptd --verify` and `ckptd --salvage`
// on corrupted copies of a store (a flipped byte in a metadata table, in a chunk, a truncated
// segment file), and the online Backup (`ckptctl backup`) while uploads, deletes and a transform
// job run; every checkpoint served afterwards is compared byte for byte with what the intact
// store served.
#include <rocksdb/db.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/internal/index_records.h"
#include "storage/internal/segment_directory.h"
#include "tests/testing/server_process.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ServerProcess;
using testing::TempDir;

// Every tensor of checkpoint `id` fetched whole: name -> bytes.
absl::StatusOr<std::map<std::string, std::string>> Merged(CkptClient& client,
                                                          const std::string& id) {
  v1::FetchRequest request;
  request.set_checkpoint_id(id);
  request.set_merged(true);
  absl::StatusOr<std::vector<FetchedTensor>> got = client.FetchAll(request);
  if (!got.ok()) return got.status();
  std::map<std::string, std::string> out;
  for (FetchedTensor& t : *got) out[t.header.name()] = std::move(t.data);
  return out;
}

testing::SubprocessResult RunProgram(const std::vector<std::string>& args) {
  absl::StatusOr<testing::SubprocessResult> r = testing::RunSubprocess(args);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : testing::SubprocessResult{};
}

testing::SubprocessResult Ckptd(const std::string& flag, const std::string& data) {
  return RunProgram({CKPTD_PATH, flag, "--data", data, "--min-free-disk-mib", "0"});
}

// Flips one byte (XOR 0x5a) of `path` at `offset`.
void FlipByte(const fs::path& path, uint64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  const char byte = static_cast<char>(file.get());
  file.seekp(static_cast<std::streamoff>(offset));
  file.put(static_cast<char>(byte ^ 0x5a));
  ASSERT_TRUE(file.good()) << path;
}

// An offset inside the first data block of a small table file (it starts at offset 0 and holds
// at least the first record), so that a byte flipped there fails that block's checksum. (The
// table's later blocks vary in size: its properties hold a random session id.)
constexpr uint64_t kInFirstDataBlock = 32;

// The store's index opened read-only with every column family.
struct Index {
  explicit Index(const std::string& dir) {
    rocksdb::DBOptions options;
    std::vector<std::string> names;
    EXPECT_TRUE(rocksdb::DB::ListColumnFamilies(options, dir, &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const std::string& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
    const rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir, families, &handles, &db);
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < names.size() && s.ok(); ++i) by_name[names[i]] = handles[i];
  }
  ~Index() {
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    delete db;
  }
  // The data id of checkpoint `id` (its meta record's first 8 bytes).
  uint64_t DataId(const std::string& id) {
    std::string value;
    EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), by_name[segment_store_internal::kMetaFamily],
                        segment_store_internal::MetaKey('c', id), &value)
                    .ok());
    return value.size() >= 8 ? segment_store_internal::DecodeBigEndian(value.data(), 8) : 0;
  }
  // The first chunk location of data id `data_id`.
  segment_store_internal::ChunkLocation FirstChunk(uint64_t data_id) {
    std::unique_ptr<rocksdb::Iterator> it(
        db->NewIterator(rocksdb::ReadOptions(), by_name[segment_store_internal::kLocationsFamily]));
    it->Seek(segment_store_internal::BigEndian64(data_id));
    EXPECT_TRUE(it->Valid());
    return it->Valid() ? *segment_store_internal::FirstLocationOfRecord(it->key().ToString(),
                                                                        it->value().ToString())
                       : segment_store_internal::ChunkLocation{};
  }
  // The table file of column family `family` that holds meta/location key `key`.
  std::string TableHolding(const std::string& family, const std::string& key) {
    std::vector<rocksdb::LiveFileMetaData> files;
    db->GetLiveFilesMetaData(&files);
    for (const rocksdb::LiveFileMetaData& f : files) {
      // Compared on the key's length: `key` may be a prefix (a data id of chunk keys).
      if (f.column_family_name == family && f.smallestkey.substr(0, key.size()) <= key &&
          key <= f.largestkey.substr(0, key.size())) {
        return f.db_path + f.name;
      }
    }
    return "";
  }

  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::map<std::string, rocksdb::ColumnFamilyHandle*> by_name;
};

fs::path SegmentOf(const std::string& data, uint64_t data_id) {
  return fs::path(data) / segment_store_internal::kSegmentsDir /
         segment_internal::SegmentFileName(data_id);
}

// A store with three checkpoints of the demo sample: "a" committed (and flushed to its own
// tables by a clean stop) before "b" and "c", so that damage to the first tables touches "a"
// only. `served_` holds what the intact store serves.
class SalvageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(RunProgram({CKPTCTL_PATH, "sample", dir_ / "demo"}).exit_code, 0);
    for (const std::vector<std::string>& phase :
         std::vector<std::vector<std::string>>{{"a"}, {"b", "c"}}) {
      auto server = ServerProcess::Start(CKPTD_PATH, dir_ / "data");
      ASSERT_TRUE(server.ok()) << server.status();
      auto client = CkptClient::Connect((*server)->address());
      ASSERT_TRUE(client.ok());
      ASSERT_TRUE((*client)->PutStrategyFile("src", dir_ / "demo/src_strategy.ckpt", true).ok());
      for (const std::string& id : phase) {
        auto up = (*client)->UploadDirectory(id, "src", dir_ / "demo/checkpoint");
        ASSERT_TRUE(up.ok() && up->committed) << up.status();
        auto merged = Merged(**client, id);
        ASSERT_TRUE(merged.ok()) << merged.status();
        served_[id] = *merged;
      }
      client->reset();
      ASSERT_EQ((*server)->Stop(), 0) << (*server)->Log();
    }
  }

  // A copy of the intact store to damage.
  std::string Copy(const std::string& name) {
    const std::string to = dir_ / name;
    fs::copy(dir_ / "data", to, fs::copy_options::recursive);
    return to;
  }

  // Salvages `data`, then checks that it verifies clean and that a ckptd on it serves every
  // checkpoint of `kept` exactly as before and none of `dropped`.
  void ExpectSalvaged(const std::string& data, const std::vector<std::string>& kept,
                      const std::vector<std::string>& dropped) {
    const testing::SubprocessResult salvage = Ckptd("--salvage", data);
    EXPECT_EQ(salvage.exit_code, 0) << salvage.stdout_text << salvage.stderr_text;
    for (const std::string& id : dropped) {
      // Dropped by the salvage, or lost with the index table that held its record.
      EXPECT_TRUE(salvage.stdout_text.find("dropped checkpoint " + id) != std::string::npos ||
                  salvage.stdout_text.find("table set aside as unreadable") != std::string::npos)
          << salvage.stdout_text;
    }
    const testing::SubprocessResult verify = Ckptd("--verify", data);
    EXPECT_EQ(verify.exit_code, 0) << verify.stdout_text << verify.stderr_text;
    auto server = ServerProcess::Start(CKPTD_PATH, data);
    ASSERT_TRUE(server.ok()) << server.status();
    auto client = CkptClient::Connect((*server)->address());
    ASSERT_TRUE(client.ok());
    for (const std::string& id : kept) {
      auto merged = Merged(**client, id);
      ASSERT_TRUE(merged.ok()) << id << ": " << merged.status();
      EXPECT_TRUE(*merged == served_[id]) << id << " is not served byte-identically";
    }
    for (const std::string& id : dropped) {
      EXPECT_EQ(Merged(**client, id).status().code(), absl::StatusCode::kNotFound) << id;
    }
    // The salvaged store takes new uploads (its data-id counter is above every id in use).
    auto up = (*client)->UploadDirectory("new", "src", dir_ / "demo/checkpoint");
    if (up.status().code() == absl::StatusCode::kNotFound) {
      // The strategy was lost with a metadata table: register it again.
      ASSERT_TRUE((*client)->PutStrategyFile("src", dir_ / "demo/src_strategy.ckpt", true).ok());
      up = (*client)->UploadDirectory("new", "src", dir_ / "demo/checkpoint");
    }
    ASSERT_TRUE(up.ok() && up->committed) << up.status();
    auto fresh = Merged(**client, "new");
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_TRUE(*fresh == served_["a"]);
    for (const std::string& id : kept) {
      auto again = Merged(**client, id);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_TRUE(*again == served_[id]) << id << " changed after a new upload";
    }
    client->reset();
    EXPECT_EQ((*server)->Stop(), 0);
  }

  TempDir dir_;
  std::map<std::string, std::map<std::string, std::string>> served_;
};

TEST_F(SalvageTest, IntactStoreVerifiesClean) {
  const testing::SubprocessResult verify = Ckptd("--verify", dir_ / "data");
  EXPECT_EQ(verify.exit_code, 0) << verify.stdout_text << verify.stderr_text;
  EXPECT_THAT(verify.stdout_text, HasSubstr("verified 3 checkpoints"));
  EXPECT_THAT(verify.stdout_text, HasSubstr(": 0 damaged"));
  EXPECT_THAT(verify.stdout_text, Not(HasSubstr("damaged checkpoint")));
  // A store that does not exist is an error, not a new empty store.
  const testing::SubprocessResult missing = Ckptd("--verify", dir_ / "nothing");
  EXPECT_EQ(missing.exit_code, 2) << missing.stdout_text;
  EXPECT_FALSE(fs::exists(dir_ / "nothing"));
  // A store a running ckptd holds is not read behind its back.
  auto server = ServerProcess::Start(CKPTD_PATH, dir_ / "data");
  ASSERT_TRUE(server.ok()) << server.status();
  const testing::SubprocessResult busy = Ckptd("--verify", dir_ / "data");
  EXPECT_EQ(busy.exit_code, 2) << busy.stdout_text;
  EXPECT_THAT(busy.stderr_text, HasSubstr("in use by a running ckptd"));
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST_F(SalvageTest, FlippedChunkByteIsReportedAndItsCheckpointDropped) {
  const std::string data = Copy("flipped");
  uint64_t data_id = 0;
  segment_store_internal::ChunkLocation chunk;
  {
    Index index(data);
    data_id = index.DataId("b");
    chunk = index.FirstChunk(data_id);
  }
  ASSERT_GT(chunk.length, 0u);
  FlipByte(SegmentOf(data, data_id), chunk.offset + chunk.length / 2);
  const testing::SubprocessResult verify = Ckptd("--verify", data);
  EXPECT_EQ(verify.exit_code, 1) << verify.stdout_text << verify.stderr_text;
  EXPECT_THAT(verify.stdout_text, HasSubstr("damaged checkpoint b tensor "));
  EXPECT_THAT(verify.stdout_text, HasSubstr("checksum"));
  EXPECT_THAT(verify.stdout_text, Not(HasSubstr("damaged checkpoint a")));
  EXPECT_THAT(verify.stdout_text, Not(HasSubstr("damaged checkpoint c")));
  EXPECT_THAT(verify.stdout_text, HasSubstr(": 1 damaged"));
  ExpectSalvaged(data, {"a", "c"}, {"b"});
}

TEST_F(SalvageTest, TruncatedSegmentIsReportedAndItsCheckpointDropped) {
  const std::string data = Copy("truncated");
  uint64_t data_id = 0;
  {
    Index index(data);
    data_id = index.DataId("c");
  }
  const fs::path segment = SegmentOf(data, data_id);
  fs::resize_file(segment, fs::file_size(segment) / 3);
  const testing::SubprocessResult verify = Ckptd("--verify", data);
  EXPECT_EQ(verify.exit_code, 1) << verify.stdout_text << verify.stderr_text;
  EXPECT_THAT(verify.stdout_text, HasSubstr("damaged checkpoint c "));
  EXPECT_THAT(verify.stdout_text, Not(HasSubstr("damaged checkpoint a")));
  EXPECT_THAT(verify.stdout_text, Not(HasSubstr("damaged checkpoint b")));
  ExpectSalvaged(data, {"a", "b"}, {"c"});
}

// One flipped byte in the metadata table holding checkpoint "a"'s manifest (and the store's
// format record and strategies): its records cannot be read; --verify says so (exit 2) and
// points to the salvage, which sets the table aside and restores the store's own records, after
// which "b" and "c" are served as before.
TEST_F(SalvageTest, FlippedMetadataTableByteNoLongerStopsTheStore) {
  const std::string data = Copy("meta");
  std::string table;
  {
    Index index(data);
    table = index.TableHolding(segment_store_internal::kMetaFamily,
                               segment_store_internal::MetaKey('c', "a"));
  }
  ASSERT_FALSE(table.empty());
  ASSERT_TRUE(table.ends_with(".sst")) << table;
  FlipByte(table, kInFirstDataBlock);
  const testing::SubprocessResult verify = Ckptd("--verify", data);
  EXPECT_NE(verify.exit_code, 0) << verify.stdout_text << verify.stderr_text;
  EXPECT_THAT(verify.stdout_text + verify.stderr_text, HasSubstr("--salvage"));
  ExpectSalvaged(data, {"b", "c"}, {"a"});
}

// A flipped byte in the location table of "a": ckptd no longer starts; --verify lists "a" (its
// manifest survives, its chunk locations cannot be read), and the salvage sets the table aside
// and drops "a", whose chunks can no longer be found.
TEST_F(SalvageTest, FlippedLocationTableByteDropsOnlyItsCheckpoint) {
  const std::string data = Copy("locations");
  std::string table;
  {
    Index index(data);
    table = index.TableHolding(segment_store_internal::kLocationsFamily,
                               segment_store_internal::BigEndian64(index.DataId("a")));
  }
  ASSERT_FALSE(table.empty());
  FlipByte(table, kInFirstDataBlock);
  {
    // The collection of garbage at start-up scans every location: ckptd refuses to start.
    auto refused = ServerProcess::Start(CKPTD_PATH, data);
    EXPECT_FALSE(refused.ok()) << "a store with a damaged location table started";
  }
  const testing::SubprocessResult verify = Ckptd("--verify", data);
  EXPECT_EQ(verify.exit_code, 1) << verify.stdout_text << verify.stderr_text;
  EXPECT_THAT(verify.stdout_text, HasSubstr("damaged checkpoint a "));
  EXPECT_THAT(verify.stdout_text + verify.stderr_text, Not(HasSubstr("damaged checkpoint b")));
  ExpectSalvaged(data, {"b", "c"}, {"a"});
}

// --------------------------------------------------------------------------------- backup

class BackupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "exports");
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data",
                                  {"--export-root", dir_ / "exports", "--job-workers", "1"});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    ASSERT_EQ(RunProgram({CKPTCTL_PATH, "sample", dir_ / "demo"}).exit_code, 0);
    ASSERT_TRUE(client_->PutStrategy("src", DemoSourceStrategy(), false).ok());
    ASSERT_TRUE(client_->PutStrategy("dst", DemoDestinationStrategy(), false).ok());
  }

  testing::SubprocessResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {CKPTCTL_PATH, "--server", server_->address()});
    return RunProgram(args);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
};

TEST_F(BackupTest, CopyOfALiveStoreServesEveryCheckpointCommittedBeforeIt) {
  // Committed before the backup: kept ones, and victims deleted while it runs.
  std::map<std::string, std::map<std::string, std::string>> before;
  for (const std::string id : {"base1", "base2", "victim1", "victim2", "victim3"}) {
    auto up = client_->UploadDirectory(id, "src", dir_ / "demo/checkpoint");
    ASSERT_TRUE(up.ok() && up->committed) << up.status();
    auto merged = Merged(*client_, id);
    ASSERT_TRUE(merged.ok()) << merged.status();
    before[id] = *merged;
  }
  // Load while the backup runs: uploads, deletes and a transform job.
  std::atomic<bool> stop{false};
  std::atomic<int> uploads{0};
  std::thread uploader([&] {
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok());
    for (int i = 0; !stop.load() || i < 2; ++i) {
      auto up = (*c)->UploadDirectory(absl::StrCat("live", i), "src", dir_ / "demo/checkpoint");
      EXPECT_TRUE(up.ok()) << up.status();
      ++uploads;
    }
  });
  std::thread deleter([&] {
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok());
    for (const std::string id : {"victim1", "victim2", "victim3"}) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_TRUE((*c)->DeleteCheckpoint(id).ok());
    }
  });
  v1::SubmitTransformRequest job;
  job.set_checkpoint_id("base1");
  job.set_destination_strategy("dst");
  job.mutable_target()->set_new_checkpoint_id("resharded");
  auto submitted = client_->SubmitTransform(job);
  ASSERT_TRUE(submitted.ok()) << submitted.status();

  const std::string target = dir_ / "exports/backup1";
  const testing::SubprocessResult backup = Ctl({"backup", target});
  stop = true;
  uploader.join();
  deleter.join();
  ASSERT_EQ(backup.exit_code, 0) << backup.stdout_text << backup.stderr_text;
  EXPECT_THAT(backup.stdout_text, HasSubstr("backed up "));
  EXPECT_THAT(backup.stdout_text, HasSubstr(target));
  // --json: one object, exact numbers.
  const testing::SubprocessResult again = Ctl({"backup", dir_ / "exports/backup2", "--json"});
  ASSERT_EQ(again.exit_code, 0) << again.stdout_text << again.stderr_text;
  const nlohmann::json j = nlohmann::json::parse(again.stdout_text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << again.stdout_text;
  EXPECT_EQ(j["target_dir"], dir_ / "exports/backup2");
  EXPECT_GE(j["checkpoints"].get<int64_t>(), 1);
  EXPECT_TRUE(j["segment_bytes"].is_number_integer());
  EXPECT_GE(uploads.load(), 2);
  auto done = client_->WatchJob(submitted->job().id());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason();
  // No temporary directory is left beside the backup.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_ / "exports")) ++entries;
  EXPECT_EQ(entries, 2);  // backup1 and backup2

  // What the live server serves now, for every checkpoint it still has.
  auto live_list = client_->ListCheckpoints();
  ASSERT_TRUE(live_list.ok());
  std::map<std::string, std::map<std::string, std::string>> live;
  for (const v1::CheckpointInfo& info : *live_list) {
    auto merged = Merged(*client_, info.id());
    ASSERT_TRUE(merged.ok()) << merged.status();
    live[info.id()] = *merged;
  }

  // A fresh ckptd on the copy (the original keeps running).
  auto copy = ServerProcess::Start(CKPTD_PATH, target);
  ASSERT_TRUE(copy.ok()) << copy.status();
  auto reader = CkptClient::Connect((*copy)->address());
  ASSERT_TRUE(reader.ok());
  for (const std::string id : {"base1", "base2"}) {
    auto merged = Merged(**reader, id);
    ASSERT_TRUE(merged.ok()) << id << ": " << merged.status();
    EXPECT_TRUE(*merged == before[id]) << id;
  }
  // Every checkpoint in the copy is complete: one committed during the backup, or a victim
  // deleted after the copy of the index, is served exactly as the original served it.
  auto listed = (*reader)->ListCheckpoints();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const v1::CheckpointInfo& info : *listed) {
    const std::string& id = info.id();
    auto merged = Merged(**reader, id);
    ASSERT_TRUE(merged.ok()) << id << ": " << merged.status();
    if (before.contains(id)) {
      EXPECT_TRUE(*merged == before[id]) << id;
    } else if (live.contains(id)) {
      EXPECT_TRUE(*merged == live[id]) << id;
    } else {
      ADD_FAILURE() << "the copy holds " << id << ", which the store never served";
    }
  }
  // The copy is a store of its own: it takes uploads and verifies clean once stopped.
  auto up = (*reader)->UploadDirectory("after", "src", dir_ / "demo/checkpoint");
  ASSERT_TRUE(up.ok() && up->committed) << up.status();
  reader->reset();
  ASSERT_EQ((*copy)->Stop(), 0);
  const testing::SubprocessResult verify = Ckptd("--verify", target);
  EXPECT_EQ(verify.exit_code, 0) << verify.stdout_text << verify.stderr_text;
  // The original still serves its checkpoints (nothing of it was moved or changed).
  for (const std::string id : {"base1", "base2"}) {
    auto merged = Merged(*client_, id);
    ASSERT_TRUE(merged.ok()) << merged.status();
    EXPECT_TRUE(*merged == before[id]);
  }
}

TEST_F(BackupTest, TargetsAreConfinedAndNeverReplaced) {
  ASSERT_TRUE(client_->UploadDirectory("one", "src", dir_ / "demo/checkpoint").ok());
  // Climbing out, outside the root, existing, missing parent.
  EXPECT_EQ(client_->Backup("../b").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client_->Backup(dir_ / "elsewhere").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere"));
  fs::create_directories(dir_ / "exports/taken");
  auto taken = client_->Backup(dir_ / "exports/taken");
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists) << taken.status();
  EXPECT_TRUE(fs::is_empty(dir_ / "exports/taken"));
  EXPECT_EQ(client_->Backup(dir_ / "exports/no/such/parent").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A symlink planted as the parent that leads outside is not followed.
  fs::create_directory_symlink(dir_.path(), dir_ / "exports/link");
  EXPECT_EQ(client_->Backup(dir_ / "exports/link/b").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(dir_ / "b"));
  auto ok = client_->Backup(dir_ / "exports/good");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->checkpoints(), 1);
  EXPECT_EQ(ok->segment_files(), 1);
  // A relative path is relative to the root, as for transform jobs.
  auto relative = client_->Backup("relative");
  ASSERT_TRUE(relative.ok()) << relative.status();
  EXPECT_TRUE(fs::is_directory(dir_ / "exports/relative"));
  EXPECT_EQ(ok->linked_files(), 1);
  EXPECT_GT(ok->segment_bytes(), 0);
  EXPECT_EQ(client_->Backup(dir_ / "exports/good").status().code(),
            absl::StatusCode::kAlreadyExists);

  // Without --export-root the call names the flag.
  client_.reset();
  ASSERT_EQ(server_->Stop(), 0);
  auto plain = ServerProcess::Start(CKPTD_PATH, dir_ / "data");
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto c = CkptClient::Connect((*plain)->address());
  ASSERT_TRUE(c.ok());
  auto refused = (*c)->Backup(dir_ / "exports/other");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--export-root"));
  server_ = std::move(*plain);
}

}  // namespace
}  // namespace ckpt
