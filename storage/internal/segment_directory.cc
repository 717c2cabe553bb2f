#include "storage/internal/segment_directory.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/posix_io.h"

namespace ckpt::segment_internal {
namespace {

constexpr std::string_view kSuffix = ".seg";
constexpr size_t kHexDigits = 16;

}  // namespace

int64_t PageBytes() {
  static const int64_t page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
  return page;
}

std::string SegmentFileName(uint64_t data_id) {
  return absl::StrFormat("%016x%s", data_id, kSuffix);
}

SegmentFile::~SegmentFile() {
  if (fd >= 0) ::close(fd);
}

absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> SegmentFile::ReadUnwritten(int64_t,
                                                                                     int64_t) {
  return std::nullopt;
}

absl::Status ReadChunkBytes(const SegmentFile& file, char* out, int64_t n, int64_t at,
                            int64_t begin, int64_t end) {
  const absl::Status read = PreadFully(file.fd, out, static_cast<size_t>(n), at, file.path);
  if (!absl::IsDataLoss(read)) return read;
  return absl::DataLossError(absl::StrCat("segment file ", file.path, " ends inside the chunk at [",
                                          begin, ", ", end, ") (truncated?): ", read.message()));
}

absl::StatusOr<std::unique_ptr<SegmentDirectory>> SegmentDirectory::Open(std::string dir,
                                                                         SegmentOptions options) {
  if (options.window_bytes <= 0 || options.window_bytes % PageBytes() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("segment window of ", options.window_bytes,
                                                   " bytes is not a multiple of the page size (",
                                                   PageBytes(), ")"));
  }
  if (options.write_block_bytes <= 0 || options.write_block_bytes % PageBytes() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment write block of ", options.write_block_bytes,
                     " bytes is not a multiple of the page size (", PageBytes(), ")"));
  }
  // Extents (the larger of the two) then hold whole blocks and whole windows.
  if (options.window_bytes % options.write_block_bytes != 0 &&
      options.write_block_bytes % options.window_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment window of ", options.window_bytes, " bytes and write block of ",
                     options.write_block_bytes, " bytes: one must be a multiple of the other"));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "create directory", dir);
  return std::unique_ptr<SegmentDirectory>(new SegmentDirectory(std::move(dir), options));
}

std::string SegmentDirectory::PathOf(uint64_t data_id) const {
  return absl::StrCat(dir_, "/", SegmentFileName(data_id));
}

std::shared_ptr<SegmentFile> SegmentDirectory::Find(uint64_t data_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(data_id);
  return it == files_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<SegmentFile>> SegmentDirectory::FindOrOpen(uint64_t data_id,
                                                                          Opener open) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(data_id);
  if (it != files_.end()) return it->second;
  absl::StatusOr<std::shared_ptr<SegmentFile>> file = open(PathOf(data_id));
  if (file.ok()) files_.emplace(data_id, *file);
  return file;
}

absl::Status SegmentDirectory::Remove(uint64_t data_id) {
  const std::string path = PathOf(data_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    files_.erase(data_id);
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "delete", path);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> SegmentDirectory::List() const {
  std::vector<uint64_t> ids;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != kHexDigits + kSuffix.size() || !name.ends_with(kSuffix)) continue;
    uint64_t id = 0;
    bool hex = true;
    for (size_t k = 0; k < kHexDigits && hex; ++k) {
      const char c = name[k];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      hex = digit >= 0;
      id = id << 4 | static_cast<uint64_t>(digit < 0 ? 0 : digit);
    }
    if (hex) ids.push_back(id);
  }
  if (ec) return ErrnoToStatus(ec.value(), "list", dir_);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace ckpt::segment_internal
