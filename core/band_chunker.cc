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
  // Empty: a buffer grows as its chunk's bytes arrive (Append).
  buffers_.resize(static_cast<size_t>(per_band));
  chunk_bytes_.resize(static_cast<size_t>(per_band));
  Start(0);
}

void BandChunker::Start(int64_t band) {
  band_ = band;
  filled_ = 0;
  band_bytes_ = 0;
  in_place_ = false;
  for (int64_t k = 0; k < chunks_per_band(); ++k) {
    chunk_bytes_[k] = grid_.ChunkBytes(ChunkIndex(k));
    band_bytes_ += chunk_bytes_[k];
    buffers_[k].clear();  // keeps the capacity for the next band
  }
}

void BandChunker::StartInPlace(int64_t band,
                               std::span<const std::span<const std::span<char>>> places) {
  Start(band);
  in_place_ = true;
  places_.assign(places.begin(), places.end());
  cursor_.assign(places_.size(), {0, 0});
}

void BandChunker::Append(size_t k, const char* from, size_t n) {
  if (in_place_) {
    auto& [place, offset] = cursor_[k];
    const std::span<const std::span<char>> to = places_[k];
    while (n > 0) {
      const std::span<char> p = to[place];
      const size_t take = std::min(n, p.size() - offset);
      std::memcpy(p.data() + offset, from, take);
      from += take;
      n -= take;
      offset += take;
      if (offset == p.size()) {
        ++place;
        offset = 0;
      }
    }
    return;
  }
  std::string& buffer = buffers_[k];
  const size_t needed = buffer.size() + n;
  if (needed > buffer.capacity()) {
    const size_t chunk = static_cast<size_t>(chunk_bytes_[k]);
    buffer.reserve(std::max(needed, std::min(chunk, 2 * buffer.capacity())));
  }
  buffer.append(from, n);
}

size_t BandChunker::Add(std::string_view data) {
  const size_t take = std::min(data.size(), static_cast<size_t>(band_bytes_ - filled_));
  const char* from = data.data();
  size_t left = take;
  if (line_bytes_ == 0) {
    Append(0, from, left);
    filled_ += static_cast<int64_t>(left);
    return take;
  }
  while (left > 0) {
    const int64_t at = filled_ % line_bytes_;
    size_t k = 0;
    while (at >= segment_begin_[k] + segment_bytes_[k]) ++k;
    const int64_t in_segment = at - segment_begin_[k];
    const size_t n = std::min(left, static_cast<size_t>(segment_bytes_[k] - in_segment));
    // Chunk k holds its segment of every line in line order, so this is its next byte.
    Append(k, from, n);
    from += n;
    left -= n;
    filled_ += static_cast<int64_t>(n);
  }
  return take;
}

std::string_view BandChunker::chunk(int64_t k) const { return std::string_view(buffers_[k]); }

std::span<const std::span<char>> BandChunker::places(int64_t k) const {
  if (!in_place_) return {};
  return places_[static_cast<size_t>(k)];
}

}  // namespace ckpt
