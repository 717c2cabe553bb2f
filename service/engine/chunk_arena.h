// Memory for the StreamChunks of one store call (SharedChunks' lone path): one allocation for a
// run of chunks instead of one each, given back when the last object placed in it is destroyed,
// on whichever thread that happens (and kept for the next arena, up to a bound).
//
// A lone stream reads thousands of small chunks a second, each a StreamChunk of a few hundred
// bytes: above the allocator's fast bins, so each would take malloc's general path to allocate
// and, when the lone ring lets go of it later, to free. From an arena, placing one is a pointer
// bump and letting it go an atomic decrement.
//
// Thread-safe: Take is for the one thread filling the arena; Release (through ArenaAllocator's
// deallocate) may run on any thread.
#ifndef CKPT_SERVICE_ENGINE_CHUNK_ARENA_H_
#define CKPT_SERVICE_ENGINE_CHUNK_ARENA_H_

#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace ckpt {

class ChunkArena {
 public:
  // An arena of `bytes`, with one reference held by the caller (who Releases it once it has
  // taken what it needs).
  static ChunkArena* Make(size_t bytes) {
    void* memory = Spare().Take(bytes);
    if (memory == nullptr) memory = ::operator new (kHeader + bytes, std::align_val_t{kAlign});
    return new (memory) ChunkArena(bytes);
  }
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;

  // `bytes` of the arena (aligned for any object), holding a reference until Released; null
  // when the arena has no room left. Only the filling thread calls it.
  void* Take(size_t bytes) {
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded > capacity_ - used_) return nullptr;
    void* p = base() + used_;
    used_ += rounded;
    Hold();
    return p;
  }
  // One more reference: held by what Take places, and by an object its allocator placed on the
  // heap (no room left), whose deallocation looks at the arena (Owns) before it Releases it.
  void Hold() { refs_.fetch_add(1, std::memory_order_relaxed); }
  // Frees what ArenaAllocator took from the heap when the arena was full (out of line: the
  // compiler cannot tell that a pointer into an arena never comes here).
  [[gnu::noinline]] static void FreeOnHeap(void* p) { ::operator delete(p); }
  // Whether `p` was taken from this arena.
  bool Owns(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= base() && c < base() + capacity_;
  }
  // Drops one reference: the arena is freed with the last.
  void Release() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      const size_t capacity = capacity_;
      this->~ChunkArena();
      if (!Spare().Keep(this, capacity)) ::operator delete (this, std::align_val_t{kAlign});
    }
  }

 private:
  static constexpr size_t kAlign = alignof(std::max_align_t);
  explicit ChunkArena(size_t capacity) : capacity_(capacity) {}
  ~ChunkArena() = default;
  char* base() { return reinterpret_cast<char*>(this) + kHeader; }
  const char* base() const { return reinterpret_cast<const char*>(this) + kHeader; }

  // Freed arenas kept for Make to hand out again, up to kSpares of them process-wide (4.4 MiB of
  // the lone path's arenas): an arena is a large allocation, which glibc serves by first merging
  // every small block freed since the last one, and a lone stream places thousands of chunks a
  // second. Its ring lets go of chunks a mapped window's worth at a time (thousands of small
  // chunks when it moves on to a new window), so the list holds that many arenas.
  class SpareList {
   public:
    // The memory of a kept arena of `capacity` bytes, or null.
    void* Take(size_t capacity) {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = spares_.size(); i-- > 0;) {
        if (spares_[i].second == capacity) {
          void* memory = spares_[i].first;
          spares_[i] = spares_.back();
          spares_.pop_back();
          return memory;
        }
      }
      return nullptr;
    }
    // Keeps `memory`, an arena of `capacity` bytes; false when enough are kept already.
    bool Keep(void* memory, size_t capacity) {
      std::lock_guard<std::mutex> lock(mu_);
      if (spares_.size() >= kSpares) return false;
      spares_.emplace_back(memory, capacity);
      return true;
    }

   private:
    static constexpr size_t kSpares = 640;
    std::mutex mu_;
    std::vector<std::pair<void*, size_t>> spares_;  // guarded by mu_
  };
  // Never destroyed: arenas may be released while the process exits.
  static SpareList& Spare() {
    static SpareList* spare = new SpareList;
    return *spare;
  }

  std::atomic<size_t> refs_{1};
  const size_t capacity_;
  size_t used_ = 0;  // filling thread only
  // The arena's bytes start after its fields, aligned.
  static constexpr size_t kHeader = 2 * kAlign;
};
static_assert(sizeof(ChunkArena) <= 2 * alignof(std::max_align_t));

// An allocator placing objects (with std::allocate_shared: the object and its control block) in
// a ChunkArena while it has room, else on the heap; every object holds a reference to the arena,
// given back when it is deallocated, so the arena outlives every control block whose allocator
// points to it.
template <class T>
class ArenaAllocator {
 public:
  using value_type = T;
  explicit ArenaAllocator(ChunkArena* arena) : arena_(arena) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& other) : arena_(other.arena()) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (void* p = arena_->Take(n * sizeof(T))) return static_cast<T*>(p);
    void* p = ::operator new(n * sizeof(T));
    arena_->Hold();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) {
    if (!arena_->Owns(p)) ChunkArena::FreeOnHeap(p);
    arena_->Release();
  }
  ChunkArena* arena() const { return arena_; }
  template <class U>
  bool operator==(const ArenaAllocator<U>& other) const {
    return arena_ == other.arena();
  }

 private:
  ChunkArena* arena_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_CHUNK_ARENA_H_
