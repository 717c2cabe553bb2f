// Checksums of stored chunks and of fetched data. Both are part of a format: a manifest records
// the algorithm of its chunks' checksums (records::CheckpointManifest.chunk_checksum), and a
// Fetch names the one its data messages' checksums use (FetchRequest.checksum). The numbers are
// those two fields' values: never change what one means.
#ifndef CKPT_CORE_CHECKSUM_H_
#define CKPT_CORE_CHECKSUM_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace ckpt {

enum class ChecksumAlgorithm : int {
  // XXH64, seed 0: the chunks of every checkpoint stored before XXH3 was (a manifest without
  // the field), and the data of a Fetch that does not name an algorithm.
  kXxh64 = 0,
  // XXH3 64-bit, seed 0, with the SIMD code the CPU supports chosen at run time: about twice
  // XXH64's speed. Chunks stored since, and the data of this version's client library.
  kXxh3 = 1,
};

// What new uploads record.
inline constexpr ChecksumAlgorithm kStoredChecksum = ChecksumAlgorithm::kXxh3;

// The algorithm numbered `number`; nullopt for numbers this version does not know.
std::optional<ChecksumAlgorithm> ChecksumAlgorithmFromNumber(int64_t number);
// "xxh64" or "xxh3", for messages.
const char* ChecksumAlgorithmName(ChecksumAlgorithm algorithm);

// The checksum of `bytes`.
uint64_t Checksum(ChecksumAlgorithm algorithm, std::string_view bytes);
// The same checksum of the concatenation of `parts`, without joining them.
uint64_t Checksum(ChecksumAlgorithm algorithm, const std::vector<std::string_view>& parts);

}  // namespace ckpt

#endif  // CKPT_CORE_CHECKSUM_H_
