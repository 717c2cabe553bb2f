// Tests' direct access to the RocksDB database of a closed segment store, for checking or
// rewriting its records behind the store's back (old formats, damaged records).
#ifndef CKPT_TESTS_TESTING_RAW_STORE_DB_H_
#define CKPT_TESTS_TESTING_RAW_STORE_DB_H_

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"

namespace ckpt::testing {

// Opens the RocksDB database of the closed store in `dir` directly, with every column family it
// has, calls `fn(db, names, handles)` and closes it. Failures are gtest failures.
template <typename Fn>
void WithRawDb(const std::string& dir, Fn fn) {
  rocksdb::DBOptions options;
  std::vector<std::string> names;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(options, dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(options, dir, families, &handles, &raw);
  ASSERT_TRUE(s.ok()) << s.ToString();
  fn(raw, names, handles);
  for (rocksdb::ColumnFamilyHandle* h : handles) {
    EXPECT_TRUE(raw->DestroyColumnFamilyHandle(h).ok());
  }
  EXPECT_TRUE(raw->Close().ok());
  delete raw;
}

// The handle of column family `name` among WithRawDb's `names` and `handles` (null when absent).
inline rocksdb::ColumnFamilyHandle* Family(const std::vector<std::string>& names,
                                           const std::vector<rocksdb::ColumnFamilyHandle*>& handles,
                                           const std::string& name) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return handles[i];
  }
  return nullptr;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_RAW_STORE_DB_H_
