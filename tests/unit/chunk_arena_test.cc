// ChunkArena and ArenaAllocator (service/engine/chunk_arena.h): objects placed with
// std::allocate_shared live in the arena while it has room, on the heap after that, and the arena
// goes with the last of its objects, whichever thread drops it.
#include "service/engine/chunk_arena.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ckpt {
namespace {

// Counts its live instances, so that a test sees every object destroyed exactly once.
struct Counted {
  static std::atomic<int> live;
  explicit Counted(std::string v) : value(std::move(v)) { live.fetch_add(1); }
  ~Counted() { live.fetch_sub(1); }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  std::string value;
};
std::atomic<int> Counted::live{0};

// Room for about `n` shared Counted objects (the object and its control block each).
size_t RoomFor(size_t n) { return n * (sizeof(Counted) + 48); }

TEST(ChunkArenaTest, ObjectsArePlacedInTheArenaUntilItIsFullThenOnTheHeap) {
  ChunkArena* arena = ChunkArena::Make(RoomFor(4));
  std::vector<std::shared_ptr<Counted>> objects;
  for (int i = 0; i < 8; ++i) {
    objects.push_back(std::allocate_shared<Counted>(ArenaAllocator<Counted>(arena),
                                                    "object " + std::to_string(i)));
  }
  arena->Release();  // the objects hold it now
  int in_arena = 0;
  for (const auto& o : objects) in_arena += arena->Owns(o.get()) ? 1 : 0;
  EXPECT_GE(in_arena, 3);  // the slack of RoomFor may fit one fewer or more, never none
  EXPECT_LT(in_arena, 8);  // the rest went to the heap
  EXPECT_FALSE(arena->Owns(objects.back().get()));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(objects[i]->value, "object " + std::to_string(i));
  EXPECT_EQ(Counted::live.load(), 8);
  objects.clear();  // the last arena object frees the arena (ASan reports a leak otherwise)
  EXPECT_EQ(Counted::live.load(), 0);
}

TEST(ChunkArenaTest, TheArenaOutlivesItsFillerUntilItsLastObjectGoesOnAnotherThread) {
  ChunkArena* arena = ChunkArena::Make(RoomFor(64));
  std::vector<std::shared_ptr<Counted>> objects;
  for (int i = 0; i < 64; ++i) {
    objects.push_back(
        std::allocate_shared<Counted>(ArenaAllocator<Counted>(arena), std::string(100, 'x')));
  }
  arena->Release();
  // Half dropped here, half on two other threads, interleaved: the arena is freed once, after
  // the last (ASan and TSan check the memory and the counts).
  std::vector<std::shared_ptr<Counted>> a(objects.begin(), objects.begin() + 21);
  std::vector<std::shared_ptr<Counted>> b(objects.begin() + 21, objects.begin() + 42);
  objects.erase(objects.begin(), objects.begin() + 42);
  std::thread ta([v = std::move(a)]() mutable { v.clear(); });
  std::thread tb([v = std::move(b)]() mutable { v.clear(); });
  for (const auto& o : objects) EXPECT_EQ(o->value, std::string(100, 'x'));
  objects.clear();
  ta.join();
  tb.join();
  EXPECT_EQ(Counted::live.load(), 0);
}

TEST(ChunkArenaTest, AWeakReferenceKeepsTheArenaUntilItTooIsGone) {
  ChunkArena* arena = ChunkArena::Make(RoomFor(2));
  auto object = std::allocate_shared<Counted>(ArenaAllocator<Counted>(arena), "kept");
  arena->Release();
  std::weak_ptr<Counted> weak = object;
  object.reset();
  EXPECT_EQ(Counted::live.load(), 0);  // destroyed with its last owner...
  EXPECT_TRUE(weak.expired());         // ...while its control block, in the arena, stays
  weak.reset();                        // and goes here, with the arena
}

TEST(ChunkArenaTest, AnArenaNobodyTookFromIsFreedByItsFiller) {
  ChunkArena* arena = ChunkArena::Make(RoomFor(1));
  EXPECT_FALSE(arena->Owns(&arena));
  arena->Release();
}

}  // namespace
}  // namespace ckpt
