// Random layouts and strategies for property tests, plus an independent brute-force slicer that
// follows MindSpore's slicing rules literally (_get_tensor_slice_index and the optimizer shard)
// to cross-check core/layout.
#ifndef CKPT_TESTS_TESTING_RANDOM_LAYOUTS_H_
#define CKPT_TESTS_TESTING_RANDOM_LAYOUTS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/box.h"
#include "core/layout.h"
#include "core/strategy.h"

namespace ckpt::testing {

using Rng = std::mt19937_64;

// Seed for a property test: CKPT_SEED from the environment if set, else a fixed default. The
// test prints it so that a failure can be reproduced.
uint64_t PropertySeed(uint64_t default_seed);

// A random device count <= max_devices with several small factors.
int64_t RandomDeviceCount(Rng& rng, int64_t max_devices);
// A random factorisation of `devices` into 1..4 axes.
std::vector<int64_t> RandomDevMatrix(Rng& rng, int64_t devices);
// A random layout over `devices` devices for a tensor of `tensor_rank` dims: each dim unsplit,
// split by one axis, or (sometimes) by several (nested form); optionally an optimizer shard.
Layout RandomLayout(Rng& rng, int64_t devices, size_t tensor_rank, bool allow_opt_shard);
// A random global shape divisible by the grids of all `layouts` (small: dims <= ~64).
Shape RandomShapeFor(Rng& rng, const std::vector<const Layout*>& layouts, size_t tensor_rank);

// Independent slice computation: enumerates the replica group of the rank explicitly, sorts it,
// and applies MindSpore's slicing rules step by step.
Box BruteForceSliceBox(const Layout& layout, const Shape& global, int64_t local_rank);

// Fills a global tensor of `elements` 4-byte elements with distinct values (index + salt).
std::vector<uint32_t> Iota(int64_t elements, uint32_t salt);
// Extracts the row-major contents of `box` from a row-major global array (element-wise).
std::vector<uint32_t> SliceOf(const std::vector<uint32_t>& global, const Shape& shape,
                              const Box& box);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_RANDOM_LAYOUTS_H_
