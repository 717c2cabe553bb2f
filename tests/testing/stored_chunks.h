// Damaging a stopped ckptd's store on purpose, for tests that check corruption is reported
// (DATA_LOSS, never a wrong byte): it reaches into the store's own layout (its locations column
// family and segment files), as an operator's disk would never do.
#ifndef CKPT_TESTS_TESTING_STORED_CHUNKS_H_
#define CKPT_TESTS_TESTING_STORED_CHUNKS_H_

#include <rocksdb/db.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "storage/internal/index_records.h"
#include "storage/internal/segment_directory.h"

namespace ckpt::testing {

// Flips one byte in the middle of the first stored chunk (in location-key order) of the store in
// `data_dir`. The server owning the store must be stopped. Returns an error naming what could
// not be opened, found or written.
inline absl::Status FlipByteOfFirstStoredChunk(const std::filesystem::path& data_dir) {
  rocksdb::DBOptions options;
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(options, data_dir.string(), &names).ok()) {
    return absl::FailedPreconditionError(absl::StrCat("no store in ", data_dir.string()));
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  if (rocksdb::Status s = rocksdb::DB::Open(options, data_dir.string(), families, &handles, &raw);
      !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("open ", data_dir.string(), ": ", s.ToString()));
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::ColumnFamilyHandle* locations = nullptr;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == segment_store_internal::kLocationsFamily) locations = handles[i];
  }
  std::string key, value;
  if (locations != nullptr) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), locations));
    it->SeekToFirst();
    if (it->Valid()) {
      key = it->key().ToString();
      value = it->value().ToString();
    }
  }
  for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
  db.reset();
  const auto location = segment_store_internal::FirstLocationOfRecord(key, value);
  if (key.size() < 8 || !location.has_value() || location->length == 0) {
    return absl::NotFoundError(absl::StrCat("no stored chunk in ", data_dir.string()));
  }
  uint64_t data_id = 0;
  for (int i = 0; i < 8; ++i) data_id = data_id << 8 | static_cast<unsigned char>(key[i]);
  const std::filesystem::path segment = data_dir / segment_store_internal::kSegmentsDir /
                                        segment_internal::SegmentFileName(data_id);
  std::fstream file(segment, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(location->offset + location->length / 2);
  file.seekg(at);
  const char byte = static_cast<char>(file.get());
  file.seekp(at);
  file.put(static_cast<char>(byte ^ 0x5a));
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat("could not rewrite ", segment.string()));
  return absl::OkStatus();
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_STORED_CHUNKS_H_
