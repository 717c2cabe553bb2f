#include "tests/bench/fetch_verify.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/ckpt_format.h"
#include "core/status_macros.h"
#include "storage/file_stream.h"
#include "tests/bench/bench_common.h"

namespace ckpt::bench {

absl::Status CheckingVisitor::OnTensor(const v1::FetchTensorHeader& header) {
  checker_.reset();
  // Tensors mostly arrive in the spec's order: the one after the last found is tried first.
  const BenchTensor* t = nullptr;
  if (next_ < spec_->tensors.size() && spec_->tensors[next_].name == header.name()) {
    t = &spec_->tensors[next_];
  } else {
    t = spec_->Find(header.name());
  }
  if (t == nullptr) {
    if (!header.verbatim()) {
      return absl::InternalError(absl::StrCat("unexpected tensor ", header.name()));
    }
    return absl::OkStatus();
  }
  const auto index = static_cast<size_t>(t - spec_->tensors.data());
  std::optional<Box>* kept = nullptr;
  if (expected_boxes_ != nullptr) {
    if (expected_boxes_->size() != spec_->tensors.size()) {
      expected_boxes_->assign(spec_->tensors.size(), std::nullopt);
    }
    kept = &(*expected_boxes_)[index];
  }
  // The box the rank should get: kept from an earlier fetch of the rank, else worked out (into
  // box_, and kept when the caller keeps boxes). The checker refers to it rather than copying it.
  const Box* expected = kept != nullptr && kept->has_value() ? &**kept : nullptr;
  if (expected == nullptr) {
    box_ = Box::Whole(t->shape());
    if (destination_ != nullptr) {
      const StrategyParam* p = destination_->Find(t->name);
      if (p == nullptr) return absl::InternalError(absl::StrCat("no layout for ", t->name));
      CKPT_ASSIGN_OR_RETURN(
          box_, p->layout.SliceBox(t->shape(), rank_ % destination_->devices_per_stage()));
    }
    if (kept != nullptr) *kept = box_;
    expected = kept != nullptr ? &**kept : &box_;
  }
  const Box& want = *expected;
  // Compared in place: this runs once per delivered tensor, tens of thousands per fetch.
  const bool box_ok =
      std::equal(header.box_lo().begin(), header.box_lo().end(), want.lo.begin(), want.lo.end()) &&
      std::equal(header.box_hi().begin(), header.box_hi().end(), want.hi.begin(), want.hi.end());
  if (!box_ok) {
    Box got;
    got.lo.assign(header.box_lo().begin(), header.box_lo().end());
    got.hi.assign(header.box_hi().begin(), header.box_hi().end());
    return absl::InternalError(absl::StrCat(t->name, " to rank ", rank_, ": delivered box ",
                                            got.ToString(), ", expected ", want.ToString()));
  }
  if (header.dtype() != DTypeName(t->dtype)) {
    return absl::InternalError(absl::StrCat(t->name, ": dtype ", header.dtype()));
  }
  if (seen_.size() != spec_->tensors.size()) seen_.assign(spec_->tensors.size(), 0);
  if (seen_[index]) return absl::InternalError(absl::StrCat(t->name, " delivered twice"));
  seen_[index] = 1;
  next_ = index + 1;
  checker_.emplace(t, expected);
  return absl::OkStatus();
}

absl::Status CheckingVisitor::Complete() const {
  for (size_t i = 0; i < spec_->tensors.size(); ++i) {
    const BenchTensor& t = spec_->tensors[i];
    if (!t.name.starts_with(include_prefix_)) continue;
    if (i >= seen_.size() || !seen_[i]) {
      return absl::InternalError(absl::StrCat(t.name, " was not delivered to rank ", rank_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> VerifyRankFile(const BenchSpec& spec, const Strategy& destination,
                                       int64_t rank, const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(auto source, FileByteSource::Open(path));
  CkptReader reader(source.get());
  CheckingVisitor visitor(&spec, &destination, rank, "");
  while (true) {
    CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> t, reader.NextTensor());
    if (!t) break;
    v1::FetchTensorHeader header;
    header.set_name(t->name);
    header.set_dtype(std::string(DTypeName(t->dtype)));
    header.set_verbatim(spec.Find(t->name) == nullptr);
    // A file records only the local shape: the box is the one the layout gives, if the shape
    // agrees.
    if (const BenchTensor* bt = spec.Find(t->name)) {
      CKPT_ASSIGN_OR_RETURN(Box box, destination.Find(bt->name)->layout.SliceBox(
                                         bt->shape(), rank % destination.devices_per_stage()));
      if (t->shape() != box.shape()) {
        return absl::InternalError(absl::StrCat(path, ": ", t->name, " has shape ",
                                                ShapeToString(t->shape()), ", expected ",
                                                ShapeToString(box.shape())));
      }
      for (size_t i = 0; i < box.rank(); ++i) {
        header.add_box_lo(box.lo[i]);
        header.add_box_hi(box.hi[i]);
      }
    }
    CKPT_RETURN_IF_ERROR(visitor.OnTensor(header));
    for (size_t off = 0; off < t->data.size(); off += kMessageBytes) {
      CKPT_RETURN_IF_ERROR(visitor.OnData(std::string_view(t->data).substr(off, kMessageBytes)));
    }
    CKPT_RETURN_IF_ERROR(visitor.OnTensorEnd());
  }
  CKPT_RETURN_IF_ERROR(visitor.Complete());
  return visitor.checked();
}

}  // namespace ckpt::bench
