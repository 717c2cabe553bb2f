// Checks what a fetch (or a written rank file) delivers: the boxes the destination layout gives
// the rank, every expected tensor exactly once, and sampled bytes of every tensor against the
// generator of tests/bench/bench_data.h.
#ifndef CKPT_TESTS_BENCH_FETCH_VERIFY_H_
#define CKPT_TESTS_BENCH_FETCH_VERIFY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "core/strategy.h"
#include "tests/bench/bench_data.h"

namespace ckpt::bench {

// Receives one destination rank's Fetch, counts its bytes and checks sampled bytes of every
// tensor against the generator; the delivered boxes must be the ones the destination layout
// gives the rank. Does not own `spec` or `destination`. Not thread-safe.
class CheckingVisitor final : public TensorVisitor {
 public:
  // `destination` null: merged (every tensor whole). `include_prefix`: only tensors whose names
  // start with it are expected (empty: all).
  // `expected_boxes` (optional, not owned): the boxes the layout gives the rank by spec tensor
  // index, filled as tensors come; a caller fetching the same rank again passes the same vector
  // so that they are worked out once.
  CheckingVisitor(const BenchSpec* spec, const Strategy* destination, int64_t rank,
                  std::string include_prefix,
                  std::vector<std::optional<Box>>* expected_boxes = nullptr)
      : spec_(spec),
        destination_(destination),
        rank_(rank),
        include_prefix_(std::move(include_prefix)),
        expected_boxes_(expected_boxes) {}

  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }

  // INTERNAL for a tensor the spec does not have (unless verbatim), a wrong box or dtype, or a
  // tensor delivered twice.
  absl::Status OnTensor(const v1::FetchTensorHeader& header) override;

  absl::Status OnData(std::string_view data) override {
    bytes_ += static_cast<int64_t>(data.size());
    if (checker_) return checker_->Feed(data);
    return absl::OkStatus();
  }

  absl::Status OnTensorEnd() override {
    if (checker_) checked_ += checker_->bytes_checked();
    checker_.reset();
    return absl::OkStatus();
  }

  // After the fetch: every expected tensor arrived.
  absl::Status Complete() const;

  int64_t bytes() const { return bytes_; }
  int64_t checked() const { return checked_; }

 private:
  const BenchSpec* spec_;
  const Strategy* destination_;
  int64_t rank_;
  std::string include_prefix_;
  std::vector<std::optional<Box>>* expected_boxes_;
  std::optional<SliceChecker> checker_;
  Box box_;  // the current tensor's expected box when expected_boxes_ does not keep it
  // seen_[i]: spec_->tensors[i] was delivered (sized on the first tensor).
  std::vector<uint8_t> seen_;
  size_t next_ = 0;  // the index after the last tensor found
  int64_t bytes_ = 0;
  int64_t checked_ = 0;
};

// Checks a written .ckpt of destination rank `rank` (sampled bytes, every tensor present, each
// with the local shape the layout gives); returns the bytes checked.
absl::StatusOr<int64_t> VerifyRankFile(const BenchSpec& spec, const Strategy& destination,
                                       int64_t rank, const std::string& path);

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_FETCH_VERIFY_H_
