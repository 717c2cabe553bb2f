// The internal modes in which the harness re-executes itself (tests/bench/child.h runs them):
// a fetch worker of the concurrent phase and the naive transform baseline. The transport server
// mode is RunTransportServer (tests/bench/transport.h).
#ifndef CKPT_TESTS_BENCH_CHILD_MODES_H_
#define CKPT_TESTS_BENCH_CHILD_MODES_H_

#include <cstdint>
#include <string>

namespace ckpt::bench {

// `--worker`: connects to ckptd at `server`, prints "ready", then fetches rank `rank` of the
// uploaded checkpoint re-split to `strategy_name` once per "go" line on stdin, checking it, and
// prints "ok BYTES SECONDS BYTES_CHECKED CPU_SECONDS" (or "error ..." and exits 1); exits 0 on
// "quit". `size_gib` must be the harness's, so that the generator matches the uploaded bytes.
int WorkerMain(const std::string& server, const std::string& strategy_name, int64_t rank,
               double size_gib);

// `--baseline`: the naive transform (tests/bench/baseline.h) of the source rank files under
// `src_dir` to the 3-rank strategy under `out_dir`. 0 on success.
int BaselineMain(const std::string& src_dir, const std::string& out_dir, double size_gib);

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_CHILD_MODES_H_
