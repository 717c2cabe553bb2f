#include "storage/internal/segment_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "storage/posix_io.h"

namespace ckpt::segment_internal {
namespace {

// Windows registered since the last sweep of expired entries from the window index.
constexpr int64_t kSweepEvery = 1024;

// Bytes of units [first, last] (of `unit` bytes each) of a window of `length` bytes, the last
// clipped to the window's end.
int64_t UnitsBytes(int64_t length, int64_t unit, int64_t first, int64_t last) {
  return std::min(length, (last + 1) * unit) - first * unit;
}

// `status` with `what: ` in front (unchanged when `what` is empty).
absl::Status Prefixed(std::string_view what, const absl::Status& status) {
  if (what.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(Sv(what), ": ", status.message()));
}

// The unit windows are populated and charged in: a write block (the folio size a window maps
// with one page-table entry) where a window holds a whole number of them, at most 64 (one bit
// each in Window::populated); else the window.
int64_t PopulateUnit(const SegmentOptions& o) {
  const int64_t b = o.write_block_bytes;
  const int64_t w = o.window_bytes;
  return b < w && w % b == 0 && w / b <= 64 ? b : w;
}

// A view of a window (or of nothing, for an empty chunk) that keeps the window mapped. Its pin is
// the window: while it is held, every unit of the window that any reader populated stays mapped,
// up to the window's length.
class MappedChunk final : public ChunkData {
 public:
  MappedChunk() = default;
  MappedChunk(std::shared_ptr<const void> window, int64_t window_length, std::string_view bytes)
      : window_(std::move(window)), window_length_(window_length), bytes_(bytes) {}
  std::string_view bytes() const override { return bytes_; }
  Pin pin() const override { return {window_.get(), window_ ? window_length_ : 0}; }

 private:
  std::shared_ptr<const void> window_;
  int64_t window_length_ = 0;
  std::string_view bytes_;
};

}  // namespace

struct SegmentWindow {
  void* addr = nullptr;
  size_t length = 0;
  int64_t start = 0;  // file offset of addr
  uint64_t data_id = 0;

  // Units (SegmentReader::unit_bytes_) whose pages were mapped (MADV_POPULATE_READ): bit i is
  // [i * unit, (i + 1) * unit) of the window. Set under populate_mu; read without it.
  std::atomic<uint64_t> populated{0};
  std::mutex populate_mu;
  // Bytes charged to the budget for its populated units (added to under populate_mu; read by
  // MakeRoomLocked only once no chunk holds the window).
  std::atomic<int64_t> charged{0};
  // SegmentReader::window_bytes_, shared: a chunk read may outlive the reader it came from.
  std::shared_ptr<std::atomic<int64_t>> budget;

  // Bytes of units [first, last] of the window, the last clipped to its length.
  int64_t UnitBytes(int64_t unit, int64_t first, int64_t last) const {
    return UnitsBytes(static_cast<int64_t>(length), unit, first, last);
  }

  ~SegmentWindow() {
    if (addr != nullptr) ::munmap(addr, length);
    if (budget != nullptr) budget->fetch_sub(charged.load(), std::memory_order_relaxed);
  }
};

SegmentReader::SegmentReader(SegmentDirectory* directory)
    : directory_(directory), options_(directory->options()), unit_bytes_(PopulateUnit(options_)) {}

SegmentReader::~SegmentReader() = default;

absl::StatusOr<std::shared_ptr<SegmentFile>> SegmentReader::GetFile(uint64_t data_id) {
  return directory_->FindOrOpen(
      data_id, [&](const std::string& path) -> absl::StatusOr<std::shared_ptr<SegmentFile>> {
        auto file = std::make_shared<SegmentFile>();
        file->path = path;
        file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (file->fd < 0) {
          if (errno == ENOENT) {
            return absl::DataLossError(
                absl::StrCat("segment file ", path, " of data id ", data_id, " is missing"));
          }
          return ErrnoToStatus(errno, "open", path);
        }
        struct stat st;
        if (::fstat(file->fd, &st) != 0) return ErrnoToStatus(errno, "stat", path);
        file->size.store(st.st_size);
        return file;
      });
}

absl::StatusOr<std::unique_ptr<ChunkData>> SegmentReader::Read(uint64_t data_id, uint64_t offset,
                                                               uint64_t length,
                                                               std::string_view what) {
  ReadCursor cursor;
  return Read(data_id, offset, length, what, cursor);
}

absl::StatusOr<std::unique_ptr<ChunkData>> SegmentReader::Read(uint64_t data_id, uint64_t offset,
                                                               uint64_t length,
                                                               std::string_view what,
                                                               ReadCursor& cursor) {
  if (length == 0) return std::make_unique<MappedChunk>();
  if (cursor.file_ == nullptr || cursor.data_id_ != data_id) {
    absl::StatusOr<std::shared_ptr<SegmentFile>> opened = GetFile(data_id);
    if (!opened.ok()) return Prefixed(what, opened.status());
    cursor.data_id_ = data_id;
    cursor.file_ = *std::move(opened);
    cursor.windows_ = {};
    cursor.next_ = 0;
  }
  SegmentFile& file = *cursor.file_;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (offset > kMax || length > kMax - offset) {
    return Prefixed(
        what, absl::DataLossError(absl::StrCat("location ", offset, "+", length,
                                               " is past any file (damaged location record)")));
  }
  const auto begin = static_cast<int64_t>(offset);
  const auto end = static_cast<int64_t>(offset + length);
  if (file.MayHoldUnwritten()) {
    absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> copy = file.ReadUnwritten(begin, end);
    if (!copy.ok()) return Prefixed(what, copy.status());
    if (copy->has_value()) {
      bytes_copied_.fetch_add(end - begin, std::memory_order_relaxed);
      return std::move(**copy);
    }
  }
  if (end > file.size.load(std::memory_order_relaxed)) {
    struct stat st;
    if (::fstat(file.fd, &st) != 0) return Prefixed(what, ErrnoToStatus(errno, "stat", file.path));
    file.NoteSize(st.st_size);
    if (end > st.st_size) {
      return Prefixed(what, absl::DataLossError(absl::StrCat(
                                "segment file ", file.path, " has ", st.st_size,
                                " bytes, the chunk is at [", begin, ", ", end, ") (truncated?)")));
    }
  }
  const int64_t w = options_.window_bytes;
  const int64_t window_start = begin / w * w;
  std::shared_ptr<Window> window;
  if ((end - 1) / w == begin / w) {
    ReadCursor::Slot* slot = nullptr;
    for (ReadCursor::Slot& s : cursor.windows_) {
      if (s.window != nullptr && s.window->start == window_start &&
          s.window->start + static_cast<int64_t>(s.window->length) >= end) {
        slot = &s;  // a window a recent chunk came from (GetWindow's checks hold)
        break;
      }
    }
    if (slot == nullptr) {
      CKPT_ASSIGN_OR_RETURN(window, GetWindow(data_id, file, window_start, begin, end, what));
      slot = &cursor.windows_[cursor.next_];
      cursor.next_ = (cursor.next_ + 1) % cursor.windows_.size();
      *slot = {window, 0};
    } else {
      window = slot->window;
    }
    // Units once populated stay populated while the window lives: the bits seen populated
    // before need no look at the window's own (which other threads' chunks share).
    const uint64_t want = window != nullptr ? UnitMask(*window, begin, end) : 0;
    if ((slot->populated & want) != want) {
      CKPT_ASSIGN_OR_RETURN(const bool populated, Populate(*window, begin, end, file.path, what));
      if (!populated) {
        window = nullptr;  // the budget's room went to another reader meanwhile
      } else {
        slot->populated = window->populated.load(std::memory_order_acquire);
      }
    }
  }
  // Over the windows' budget (or larger than a window): a copy, held as long as the chunk is.
  if (window == nullptr) return ReadCopy(file, begin, end, what);
  const char* data = static_cast<const char*>(window->addr) + (begin - window->start);
  const auto window_length = static_cast<int64_t>(window->length);
  return std::make_unique<MappedChunk>(std::move(window), window_length,
                                       std::string_view(data, static_cast<size_t>(length)));
}

uint64_t SegmentReader::UnitMask(const Window& window, int64_t begin, int64_t end) const {
  const int64_t first = (begin - window.start) / unit_bytes_;
  const int64_t count = (end - 1 - window.start) / unit_bytes_ - first + 1;
  return (count >= 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1) << first;
}

absl::StatusOr<std::unique_ptr<ChunkData>> SegmentReader::ReadCopy(const SegmentFile& file,
                                                                   int64_t begin, int64_t end,
                                                                   std::string_view what) {
  auto copy = std::make_unique<CopiedChunk>(static_cast<size_t>(end - begin));
  const absl::Status read = ReadChunkBytes(file, copy->data(), end - begin, begin, begin, end);
  if (!read.ok()) return Prefixed(what, read);
  bytes_copied_.fetch_add(end - begin, std::memory_order_relaxed);
  return copy;
}

absl::StatusOr<std::shared_ptr<SegmentReader::Window>> SegmentReader::GetWindow(
    uint64_t data_id, const SegmentFile& file, int64_t start, int64_t begin, int64_t end,
    std::string_view what) {
  const std::pair<uint64_t, int64_t> key{data_id, start / options_.window_bytes};
  // Recent windows no chunk holds, given up to make room: unmapped once the lock is released
  // (declared first, so destroyed last).
  std::vector<std::shared_ptr<Window>> evicted;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(key);
  if (it != windows_.end()) {
    std::shared_ptr<Window> window = it->second.lock();
    // A window mapped while the file was shorter may not reach `end` (a live upload's file).
    if (window != nullptr && window->start + static_cast<int64_t>(window->length) >= end) {
      KeepRecent(window);
      return window;
    }
  }
  const int64_t length =
      std::min(options_.window_bytes, file.size.load(std::memory_order_relaxed) - start);
  // Mapping costs nothing until pages are populated (Populate charges them), but a window that
  // could not populate the units of the chunk it is mapped for would be mapped for nothing.
  const int64_t u = unit_bytes_;
  const int64_t units = UnitsBytes(length, u, (begin - start) / u, (end - 1 - start) / u);
  if (!MakeRoomLocked(units, &evicted)) return nullptr;
  void* addr = ::mmap(nullptr, static_cast<size_t>(length), PROT_READ, MAP_SHARED, file.fd, start);
  if (addr == MAP_FAILED) return Prefixed(what, ErrnoToStatus(errno, "map", file.path));
  // Pages not in the page cache come in as 2 MiB folios, mapped whole (advice: errors ignored).
  ::madvise(addr, static_cast<size_t>(length), MADV_HUGEPAGE);
  auto window = std::make_shared<Window>();
  window->addr = addr;
  window->length = static_cast<size_t>(length);
  window->start = start;
  window->data_id = data_id;
  window->budget = window_bytes_;
  windows_[key] = window;
  KeepRecent(window);
  if (++windows_since_sweep_ >= kSweepEvery) {
    windows_since_sweep_ = 0;
    std::erase_if(windows_, [](const auto& entry) { return entry.second.expired(); });
  }
  return window;
}

bool SegmentReader::MakeRoomLocked(int64_t bytes, std::vector<std::shared_ptr<Window>>* evicted) {
  const int64_t over =
      window_bytes_->load(std::memory_order_relaxed) + bytes - options_.window_budget_bytes;
  if (over <= 0) return true;
  // The least recently used of the windows kept only for reuse make room (their pages still
  // count until they are unmapped, right after): a chunk is copied only when the pages of
  // windows that chunks hold fill the budget.
  // (A window's count only grows under mu_: a count of 1, recent_'s own, cannot change here;
  // and with no chunk of it held, nothing populates it.)
  std::vector<size_t> idle;  // indexes into recent_, least recently used first
  int64_t freed = 0;
  for (size_t k = recent_.size(); k-- > 0 && freed < over;) {
    if (recent_[k].use_count() != 1) continue;
    idle.push_back(k);
    freed += recent_[k]->charged.load(std::memory_order_relaxed);
  }
  if (freed < over) return false;
  for (size_t k : idle) {  // descending: erasing one leaves the others' indexes valid
    evicted->push_back(std::move(recent_[k]));
    recent_.erase(recent_.begin() + static_cast<std::ptrdiff_t>(k));
  }
  return true;
}

absl::StatusOr<bool> SegmentReader::Populate(Window& window, int64_t begin, int64_t end,
                                             const std::string& path, std::string_view what) {
  const int64_t u = unit_bytes_;
  const int64_t first = (begin - window.start) / u;
  const int64_t last = (end - 1 - window.start) / u;
  const uint64_t want = UnitMask(window, begin, end);
  if ((window.populated.load(std::memory_order_acquire) & want) == want) return true;
  std::lock_guard<std::mutex> lock(window.populate_mu);
  const uint64_t missing = want & ~window.populated.load(std::memory_order_relaxed);
  if (missing == 0) return true;  // populated meanwhile
  // The missing units, as runs of consecutive ones: charged together, populated run by run.
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t bytes = 0;
  for (int64_t i = first; i <= last;) {
    if ((missing >> i & 1) == 0) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j + 1 <= last && (missing >> (j + 1) & 1) != 0) ++j;
    runs.push_back({i, j});
    bytes += window.UnitBytes(u, i, j);
    i = j + 1;
  }
  {
    std::vector<std::shared_ptr<Window>> evicted;  // unmapped once mu_ is released
    std::lock_guard<std::mutex> budget_lock(mu_);
    if (!MakeRoomLocked(bytes, &evicted)) return false;
    window_bytes_->fetch_add(bytes, std::memory_order_relaxed);
  }
  // Charged even if populating fails below (an I/O error): released when the window is unmapped.
  window.charged.fetch_add(bytes, std::memory_order_relaxed);
  for (const auto& [i, j] : runs) {
    // Map the units' pages now, in one call, rather than page fault by page fault wherever
    // their bytes are first touched (a failure here is an I/O error, where a fault would be
    // SIGBUS; EINVAL: a kernel without MADV_POPULATE_READ, the pages then fault in).
    if (::madvise(static_cast<char*>(window.addr) + i * u,
                  static_cast<size_t>(window.UnitBytes(u, i, j)), MADV_POPULATE_READ) != 0 &&
        errno != EINVAL) {
      // EFAULT: a page could not be brought in without allocating, e.g. a hole of the file
      // (the unused rest of an extent) on a full tmpfs, or a huge page under memory pressure.
      // The chunk is then read as a copy (pread needs no page of the file's own); the window
      // gives its charge back so that retries do not use up the budget.
      const int error = errno;
      if (error == EFAULT || error == ENOMEM || error == EAGAIN) {
        window.charged.fetch_sub(bytes, std::memory_order_relaxed);
        window_bytes_->fetch_sub(bytes, std::memory_order_relaxed);
        return false;
      }
      return Prefixed(what, ErrnoToStatus(error, "read (populate)", path));
    }
  }
  window.populated.fetch_or(missing, std::memory_order_release);
  return true;
}

void SegmentReader::KeepRecent(const std::shared_ptr<Window>& window) {
  auto it = std::find(recent_.begin(), recent_.end(), window);
  if (it != recent_.end()) {
    std::rotate(recent_.begin(), it, it + 1);  // to the front
    return;
  }
  recent_.insert(recent_.begin(), window);
  if (recent_.size() > options_.recent_windows) recent_.pop_back();
}

void SegmentReader::Forget(uint64_t data_id) {
  std::vector<std::shared_ptr<Window>> dropped;  // unmapped once mu_ is released
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = recent_.begin(); it != recent_.end();) {
    if ((*it)->data_id != data_id) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(*it));
    it = recent_.erase(it);
  }
  auto it = windows_.lower_bound({data_id, 0});
  while (it != windows_.end() && it->first.first == data_id) it = windows_.erase(it);
}

int64_t SegmentReader::mapped_windows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::count_if(windows_.begin(), windows_.end(),
                       [](const auto& entry) { return !entry.second.expired(); });
}

}  // namespace ckpt::segment_internal
