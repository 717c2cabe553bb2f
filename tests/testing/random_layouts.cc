#include "tests/testing/random_layouts.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

namespace ckpt::testing {

uint64_t PropertySeed(uint64_t default_seed) {
  if (const char* env = std::getenv("CKPT_SEED"); env && *env) {
    return std::strtoull(env, nullptr, 10);
  }
  return default_seed;
}

int64_t RandomDeviceCount(Rng& rng, int64_t max_devices) {
  static constexpr int64_t kChoices[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 5, 9, 18, 36};
  std::vector<int64_t> ok;
  for (int64_t c : kChoices) {
    if (c <= max_devices) ok.push_back(c);
  }
  return ok[rng() % ok.size()];
}

std::vector<int64_t> RandomDevMatrix(Rng& rng, int64_t devices) {
  const int axes = 1 + static_cast<int>(rng() % 4);
  std::vector<int64_t> dm;
  int64_t left = devices;
  for (int a = 0; a + 1 < axes; ++a) {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= left; ++d) {
      if (left % d == 0) divisors.push_back(d);
    }
    const int64_t d = divisors[rng() % divisors.size()];
    dm.push_back(d);
    left /= d;
  }
  dm.push_back(left);
  std::shuffle(dm.begin(), dm.end(), rng);
  return dm;
}

Layout RandomLayout(Rng& rng, int64_t devices, size_t tensor_rank, bool allow_opt_shard) {
  Layout layout;
  layout.dev_matrix = RandomDevMatrix(rng, devices);
  const int32_t n = static_cast<int32_t>(layout.dev_matrix.size());
  std::vector<int32_t> free_axes(n);
  std::iota(free_axes.begin(), free_axes.end(), 0);
  std::shuffle(free_axes.begin(), free_axes.end(), rng);
  layout.tensor_map.assign(tensor_rank, {});
  for (size_t i = 0; i < tensor_rank && !free_axes.empty(); ++i) {
    const uint64_t pick = rng() % 6;
    if (pick < 2) continue;  // unsplit
    size_t take = 1;
    if (pick == 5 && free_axes.size() >= 2) {
      take = 2;
      layout.nested_form = true;
    }
    for (size_t t = 0; t < take; ++t) {
      layout.tensor_map[i].push_back(free_axes.back());
      free_axes.pop_back();
    }
  }
  if (allow_opt_shard && tensor_rank > 0 && rng() % 3 == 0) {
    const int64_t group = layout.ReplicaGroupSize();
    std::vector<int64_t> sizes = {-1};
    for (int64_t k = 2; k <= group; ++k) {
      if (group % k == 0) sizes.push_back(k);
    }
    if (group > 1) {
      layout.opt_shard_size = sizes[rng() % sizes.size()];
      layout.opt_shard_step = 1;  // informational; non-zero means "sharded"
    }
  }
  return layout;
}

Shape RandomShapeFor(Rng& rng, const std::vector<const Layout*>& layouts, size_t tensor_rank) {
  Shape shape(tensor_rank, 1);
  for (size_t i = 0; i < tensor_rank; ++i) {
    int64_t l = 1;
    for (const Layout* layout : layouts) {
      const int64_t g = layout->Grid(tensor_rank)[i];
      l = std::lcm(l, g);
    }
    int64_t mult = 1 + static_cast<int64_t>(rng() % 3);
    while (l * mult > 96 && mult > 1) --mult;
    shape[i] = l * mult;
  }
  return shape;
}

Box BruteForceSliceBox(const Layout& layout, const Shape& global, int64_t local_rank) {
  const std::vector<int64_t>& dm = layout.dev_matrix;
  const size_t n = dm.size();
  auto coord_of = [&](int64_t r) {
    std::vector<int64_t> c(n);
    for (size_t a = n; a-- > 0;) {
      c[a] = r % dm[a];
      r /= dm[a];
    }
    return c;
  };
  const std::vector<int64_t> c = coord_of(local_rank);
  Box box;
  box.lo.resize(global.size());
  box.hi.resize(global.size());
  std::vector<bool> used(n, false);
  for (size_t i = 0; i < global.size(); ++i) {
    int64_t p = 1, b = 0;
    for (int32_t m : layout.tensor_map[i]) {
      p *= dm[n - 1 - m];
      b = b * dm[n - 1 - m] + c[n - 1 - m];
      used[n - 1 - m] = true;
    }
    box.lo[i] = b * global[i] / p;
    box.hi[i] = (b + 1) * global[i] / p;
  }
  if (layout.opt_shard_step != 0 && layout.opt_shard_size != 0 && !global.empty()) {
    // The replica group: every rank with the same coordinates on the used axes, ascending.
    int64_t devices = 1;
    for (int64_t d : dm) devices *= d;
    std::vector<int64_t> group;
    for (int64_t r = 0; r < devices; ++r) {
      const std::vector<int64_t> cr = coord_of(r);
      bool same = true;
      for (size_t a = 0; a < n; ++a) {
        if (used[a] && cr[a] != c[a]) same = false;
      }
      if (same) group.push_back(r);
    }
    std::sort(group.begin(), group.end());
    const int64_t k = layout.opt_shard_size == -1 ? static_cast<int64_t>(group.size())
                                                   : layout.opt_shard_size;
    const int64_t pos = std::find(group.begin(), group.end(), local_rank) - group.begin();
    const int64_t q = pos % k;
    const int64_t rows = (box.hi[0] - box.lo[0]) / k;
    box.lo[0] += q * rows;
    box.hi[0] = box.lo[0] + rows;
  }
  return box;
}

std::vector<uint32_t> Iota(int64_t elements, uint32_t salt) {
  std::vector<uint32_t> v(elements);
  for (int64_t i = 0; i < elements; ++i) v[i] = static_cast<uint32_t>(i) * 2654435761u + salt;
  return v;
}

std::vector<uint32_t> SliceOf(const std::vector<uint32_t>& global, const Shape& shape,
                              const Box& box) {
  std::vector<uint32_t> out;
  const size_t rank = shape.size();
  if (rank == 0) return {global[0]};
  std::vector<int64_t> idx = box.lo;
  if (box.empty()) return out;
  do {
    int64_t flat = 0;
    for (size_t i = 0; i < rank; ++i) flat = flat * shape[i] + idx[i];
    out.push_back(global[flat]);
  } while (NextIndex(idx, box.lo, box.hi));
  return out;
}

}  // namespace ckpt::testing
