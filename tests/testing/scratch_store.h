// A segment store in a temporary directory of its own, for tests that open, close, reopen and
// look inside it: the directory (and everything the store wrote) is removed after the test.
#ifndef CKPT_TESTS_TESTING_SCRATCH_STORE_H_
#define CKPT_TESTS_TESTING_SCRATCH_STORE_H_

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_store.h"

namespace ckpt::testing {

class ScratchStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.min_free_disk_bytes = 0;
    char tmpl[] = "/tmp/ckpt_scratch_store.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    root_ = tmpl;
    dir_ = root_ + "/db";
    Open();
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  // Opens (or reopens, once store_ is reset) the store in dir_ with options_.
  void Open() {
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenSegmentStore(dir_, options_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  StoreOptions options_;
  std::string root_;  // the temporary directory
  std::string dir_;   // the store's directory in it
  std::unique_ptr<CheckpointStore> store_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_SCRATCH_STORE_H_
