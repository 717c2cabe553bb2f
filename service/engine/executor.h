// A fixed pool of worker threads for blocking work (store reads and writes, planning), so that
// gRPC's callback threads never block.
#ifndef CKPT_SERVICE_ENGINE_EXECUTOR_H_
#define CKPT_SERVICE_ENGINE_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt {

// Thread-safe. Tasks run in submission order across `threads` workers.
class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();  // runs the remaining tasks, then joins
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Submit(std::function<void()> task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_EXECUTOR_H_
