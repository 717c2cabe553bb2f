// Helpers of the segment store's implementation files (storage/segment_store*.cc): reading
// RocksDB statuses, slices of string_views, and the store's logger. Private to the store; the only
// place besides those files that includes RocksDB headers.
#ifndef CKPT_STORAGE_INTERNAL_SEGMENT_STORE_SUPPORT_H_
#define CKPT_STORAGE_INTERNAL_SEGMENT_STORE_SUPPORT_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/status.h"
#include "spdlog/logger.h"

namespace ckpt::segment_store_internal {

// The one function that reads a rocksdb::Status: a full disk is RESOURCE_EXHAUSTED, corruption
// DATA_LOSS, a missing key NOT_FOUND, anything else INTERNAL. `doing` says what was being done
// ("reading chunk data 7 tensor 0 blob 0 chunk 3") and prefixes the message.
absl::Status FromRocks(const rocksdb::Status& status, std::string_view doing);

inline rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

// The "storage" logger: the one the service registered, else a clone of the default logger.
std::shared_ptr<spdlog::logger> StoreLog();

// RocksDB's info log, sent to StoreLog() (as `event=rocksdb msg="..."`; RocksDB's informational
// lines at debug level) instead of a LOG file in the store directory: a LOG file is written
// all the time (statistics dumps, compactions), and once a write of it fails on a full disk,
// Debian's RocksDB aborts the process when it closes the file.
std::shared_ptr<rocksdb::Logger> NewRocksDbLogger();

// The RocksDB options every opening of a store's index uses (segment_store.cc): the open itself,
// a backup's read-only look at its copy, and repair.
rocksdb::DBOptions DbOptions();
// The column families of index_records.h in handle order: default, meta, jobs, chunk_locations.
std::vector<rocksdb::ColumnFamilyDescriptor> ColumnFamilies(
    const std::shared_ptr<rocksdb::Cache>& block_cache);

}  // namespace ckpt::segment_store_internal

#endif  // CKPT_STORAGE_INTERNAL_SEGMENT_STORE_SUPPORT_H_
