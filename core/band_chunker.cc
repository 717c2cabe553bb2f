#include "core/band_chunker.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace ckpt {

BandChunker::BandChunker(ChunkGrid grid) : grid_(std::move(grid)) {
  const Shape& shape = grid_.shape();
  const int64_t per_band = grid_.chunks_per_band();
  bands_ = shape.empty() ? 1 : grid_.tiles_per_dim()[0];
  if (shape.size() >= 2 && per_band > 1) {
    // Band 0's chunks: lines = rows x middle elements; segment = chunk bytes / lines.
    int64_t lines = grid_.band_rows();
    for (size_t d = 1; d + 1 < shape.size(); ++d) lines *= shape[d];
    line_bytes_ = 0;
    for (int64_t k = 0; k < per_band; ++k) {
      segment_begin_.push_back(line_bytes_);
      segment_bytes_.push_back(grid_.ChunkBytes(k) / lines);
      line_bytes_ += segment_bytes_.back();
    }
  }
  // Band 0 is the largest (only the last band can be shorter).
  for (int64_t k = 0; k < per_band; ++k) {
    buffers_.push_back(std::make_unique_for_overwrite<char[]>(
        static_cast<size_t>(std::max<int64_t>(1, grid_.ChunkBytes(k)))));
  }
  chunk_bytes_.resize(static_cast<size_t>(per_band));
  Start(0);
}

void BandChunker::Start(int64_t band) {
  band_ = band;
  filled_ = 0;
  band_bytes_ = 0;
  for (int64_t k = 0; k < chunks_per_band(); ++k) {
    chunk_bytes_[k] = grid_.ChunkBytes(ChunkIndex(k));
    band_bytes_ += chunk_bytes_[k];
  }
}

size_t BandChunker::Add(std::string_view data) {
  const size_t take =
      std::min(data.size(), static_cast<size_t>(band_bytes_ - filled_));
  const char* from = data.data();
  size_t left = take;
  if (line_bytes_ == 0) {
    std::memcpy(buffers_[0].get() + filled_, from, left);
    filled_ += static_cast<int64_t>(left);
    return take;
  }
  while (left > 0) {
    const int64_t line = filled_ / line_bytes_;
    const int64_t at = filled_ % line_bytes_;
    size_t k = 0;
    while (at >= segment_begin_[k] + segment_bytes_[k]) ++k;
    const int64_t in_segment = at - segment_begin_[k];
    const size_t n = std::min(left, static_cast<size_t>(segment_bytes_[k] - in_segment));
    std::memcpy(buffers_[k].get() + line * segment_bytes_[k] + in_segment, from, n);
    from += n;
    left -= n;
    filled_ += static_cast<int64_t>(n);
  }
  return take;
}

std::string_view BandChunker::chunk(int64_t k) const {
  return std::string_view(buffers_[k].get(), static_cast<size_t>(chunk_bytes_[k]));
}

}  // namespace ckpt
