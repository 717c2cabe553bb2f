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
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "storage/internal/index_records.h"
#include "storage/internal/segment_directory.h"

namespace ckpt::testing {

// Flips one byte in the middle of the first stored chunk (the lowest address of the first data id)
// of the store in `data_dir`. The server owning the store must be stopped. Returns an error naming
// what could not be opened, found or written.
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
    return absl::FailedPreconditionError(
        absl::StrCat("open ", data_dir.string(), ": ", s.ToString()));
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::ColumnFamilyHandle* locations = nullptr;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == segment_store_internal::kLocationsFamily) locations = handles[i];
  }
  // The chunk of the lowest address of the first data id, whether its location is under its
  // chunk key or in a pack (index_records.h).
  std::string key;
  std::optional<std::tuple<uint32_t, uint32_t, uint32_t>> lowest;
  std::optional<segment_store_internal::ChunkLocation> location;
  auto consider = [&](uint32_t tensor, uint32_t blob, uint32_t chunk,
                      const segment_store_internal::ChunkLocation& at) {
    const auto address = std::make_tuple(tensor, blob, chunk);
    if (lowest && *lowest <= address) return;
    lowest = address;
    location = at;
  };
  if (locations != nullptr) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), locations));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const std::string k = it->key().ToString(), v = it->value().ToString();
      if (key.empty()) key = k;
      if (k.size() < 8 || k.compare(0, 8, key, 0, 8) != 0) break;
      if (segment_store_internal::IsPackKey(k)) {
        segment_store_internal::ForEachPackEntry(v,
                                                 [&](const segment_store_internal::PackEntry& e) {
                                                   consider(e.tensor, e.blob, e.chunk, e.location);
                                                 });
      } else if (k.size() == segment_store_internal::kChunkKeyBytes) {
        const auto at = segment_store_internal::DecodeLocation(v);
        if (at) {
          consider(static_cast<uint32_t>(segment_store_internal::DecodeBigEndian(k.data() + 8, 4)),
                   static_cast<uint32_t>(segment_store_internal::DecodeBigEndian(k.data() + 12, 4)),
                   static_cast<uint32_t>(segment_store_internal::DecodeBigEndian(k.data() + 16, 4)),
                   *at);
        }
      }
    }
  }
  for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
  db.reset();
  if (key.size() < 8 || !location.has_value() || location->length == 0) {
    return absl::NotFoundError(absl::StrCat("no stored chunk in ", data_dir.string()));
  }
  uint64_t data_id = 0;
  for (int i = 0; i < 8; ++i) data_id = data_id << 8 | static_cast<unsigned char>(key[i]);
  const std::filesystem::path segment =
      data_dir / segment_store_internal::kSegmentsDir / segment_internal::SegmentFileName(data_id);
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
