#include "tests/bench/baseline.h"

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ckpt_format.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "storage/file_stream.h"

namespace ckpt::bench {

absl::Status NaiveTransform(const BenchSpec& spec, const Strategy& source,
                            const Strategy& destination, const std::string& src_dir,
                            const std::string& out_dir) {
  // 1. Load every source rank file fully (MindSpore: load_checkpoint of every needed rank into
  //    param_total_dict[name][rank]).
  std::map<std::string, std::vector<CkptTensor>> by_name;  // name -> one tensor per source rank
  std::vector<std::string> order;
  for (int64_t r = 0; r < source.world_size(); ++r) {
    const std::string path = absl::StrCat(src_dir, "/rank_", r, "/", kRankFileName);
    std::vector<CkptTensor> tensors;
    {
      CKPT_ASSIGN_OR_RETURN(std::string file, ReadWholeFile(path, int64_t{1} << 40));
      CKPT_ASSIGN_OR_RETURN(tensors, DecodeCkpt(file));
    }
    for (CkptTensor& t : tensors) {
      auto& slot = by_name[t.name];
      if (slot.empty() && r == 0) order.push_back(t.name);
      slot.push_back(std::move(t));
    }
  }

  // 2. One output file per destination rank.
  std::vector<std::unique_ptr<AtomicFileSink>> sinks;
  std::vector<std::unique_ptr<CkptWriter>> writers;
  for (int64_t d = 0; d < destination.world_size(); ++d) {
    const std::string dir = absl::StrCat(out_dir, "/rank_", d);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
    CKPT_ASSIGN_OR_RETURN(auto sink,
                          AtomicFileSink::Create(absl::StrCat(dir, "/checkpoint_", d, ".ckpt")));
    writers.push_back(std::make_unique<CkptWriter>(sink.get()));
    sinks.push_back(std::move(sink));
  }

  // 3. Per parameter: merge the whole tensor from every rank's slice, cut each destination slice.
  for (const std::string& name : order) {
    std::vector<CkptTensor>& slices = by_name[name];
    const BenchTensor* t = spec.Find(name);
    if (t == nullptr) {  // verbatim value: copied unchanged from rank 0
      for (auto& w : writers) {
        CKPT_RETURN_IF_ERROR(w->WriteTensor(name, slices[0].dtype, slices[0].dims, slices[0].data));
      }
      continue;
    }
    const Box whole_box = Box::Whole(t->shape());
    std::string whole(static_cast<size_t>(t->bytes()), '\0');
    const Layout& src_layout = source.Find(name)->layout;
    for (int64_t r = 0; r < static_cast<int64_t>(slices.size()); ++r) {
      CKPT_ASSIGN_OR_RETURN(Box box, src_layout.SliceBox(t->shape(), r));
      CKPT_RETURN_IF_ERROR(CopyBoxRegion(t->dtype, slices[r].data.data(), box, whole.data(),
                                         whole_box, box));
    }
    const Layout& dst_layout = destination.Find(name)->layout;
    for (int64_t d = 0; d < destination.world_size(); ++d) {
      CKPT_ASSIGN_OR_RETURN(Box box, dst_layout.SliceBox(t->shape(), d));
      CKPT_ASSIGN_OR_RETURN(int64_t elements, box.Volume());
      std::string slice(static_cast<size_t>(elements * t->element_bytes), '\0');
      CKPT_RETURN_IF_ERROR(
          CopyBoxRegion(t->dtype, whole.data(), whole_box, slice.data(), box, box));
      CKPT_RETURN_IF_ERROR(writers[d]->WriteTensor(name, t->dtype, box.shape(), slice));
    }
  }
  for (size_t d = 0; d < writers.size(); ++d) {
    CKPT_RETURN_IF_ERROR(writers[d]->Finish());
    CKPT_RETURN_IF_ERROR(sinks[d]->Commit());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::bench
