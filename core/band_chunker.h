// Cuts one band of tile rows of a ChunkGrid into its chunks while the band's row-major bytes
// arrive, in pieces of any size. Pure; used by the upload path, which receives a slice as one
// row-major byte stream and stores it as chunks.
//
// Each byte is copied once, straight from the piece it arrived in to its place in its chunk. A
// row of the band (one index of dim 0 and of every middle dim) is a "line" of the last dim, and
// each chunk of the band holds one contiguous segment of every line (ChunkGrid cuts only dim 0
// and the last dim), so a piece is copied segment by segment. Every chunk's bytes arrive in order
// (line after line of its segment), so each chunk buffer is appended to: it grows with the bytes
// that arrived (at most twice them, and never past the chunk's size) rather than being allocated
// whole up front, so a declared shape alone costs no memory. Buffers keep their capacity from one
// band to the next and are not zero-filled. A band started in place (StartInPlace) has no
// buffers: each chunk's bytes go straight to memory the caller gives (a store's write blocks).
//
// Not thread-safe. Owns its buffers; the views chunk() returns stay valid until the next Start().
#ifndef CKPT_CORE_BAND_CHUNKER_H_
#define CKPT_CORE_BAND_CHUNKER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/chunk_grid.h"

namespace ckpt {

class BandChunker {
 public:
  explicit BandChunker(ChunkGrid grid);

  const ChunkGrid& grid() const { return grid_; }
  // Bands of tile rows in the grid (1 for a scalar).
  int64_t bands() const { return bands_; }

  // Begins band `band` (0 <= band < bands()): nothing of it has arrived yet.
  void Start(int64_t band);
  // Start(band), but chunk k's bytes go to places[k] (spans whose sizes add up to the chunk's
  // bytes, filled in order) instead of a buffer; chunk() is then empty. The places must stay
  // valid until the band is full or the next Start.
  void StartInPlace(int64_t band, std::span<const std::span<const std::span<char>>> places);
  bool in_place() const { return in_place_; }
  int64_t band() const { return band_; }
  // Bytes of the current band, and how many of them have arrived.
  int64_t band_bytes() const { return band_bytes_; }
  int64_t filled() const { return filled_; }
  bool full() const { return filled_ == band_bytes_; }

  // Copies the first min(data.size(), band_bytes() - filled()) bytes of `data` into the band's
  // chunks and returns that count.
  size_t Add(std::string_view data);

  // Chunks in one band (the grid's chunks_per_band), and the grid index of chunk `k` of the
  // current band.
  int64_t chunks_per_band() const { return static_cast<int64_t>(buffers_.size()); }
  int64_t ChunkIndex(int64_t k) const { return band_ * chunks_per_band() + k; }
  // Chunk `k` of the current band; complete once full(). Empty in place.
  std::string_view chunk(int64_t k) const;
  // Chunk k's bytes of the current band in place: its places (empty unless in_place()).
  std::span<const std::span<char>> places(int64_t k) const;

 private:
  ChunkGrid grid_;
  int64_t bands_ = 1;
  // Per chunk of a band: where its segment starts in a line, and its length (bytes).
  std::vector<int64_t> segment_begin_;
  std::vector<int64_t> segment_bytes_;
  int64_t line_bytes_ = 0;  // 0: the band is one chunk, copied as one contiguous run
  // Chunk k's bytes of the current band so far (appended in order; see Append).
  std::vector<std::string> buffers_;
  std::vector<int64_t> chunk_bytes_;  // of the current band
  // In place: chunk k's places, and where its next byte goes (place index, offset in it).
  bool in_place_ = false;
  std::vector<std::span<const std::span<char>>> places_;
  std::vector<std::pair<size_t, size_t>> cursor_;

  // Appends `n` bytes to chunk k: to its places in place, else to its buffer, growing its
  // capacity geometrically but never past the chunk's size.
  void Append(size_t k, const char* from, size_t n);
  int64_t band_ = 0;
  int64_t band_bytes_ = 0;
  int64_t filled_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_CORE_BAND_CHUNKER_H_
