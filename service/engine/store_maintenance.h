// Operator maintenance of a store: offline verification and salvage (`ckptd --verify`,
// `ckptd --salvage`) and the online backup (the Backup RPC). Verification needs the manifests
// decoded, which is why it lives in the engine rather than in storage.
#ifndef CKPT_SERVICE_ENGINE_STORE_MAINTENANCE_H_
#define CKPT_SERVICE_ENGINE_STORE_MAINTENANCE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "storage/checkpoint_store.h"
#include "storage/confined_dir.h"

namespace ckpt {

// Exit codes of `ckptd --verify` and `ckptd --salvage` (docs/storage.md).
inline constexpr int kVerifyClean = 0;    // every checkpoint verified (salvage: store usable)
inline constexpr int kVerifyDamaged = 1;  // damaged checkpoints found (listed)
inline constexpr int kVerifyFailed = 2;   // the store cannot be opened or read: salvage it

struct VerifyReport {
  int64_t checkpoints = 0;  // checkpoints checked
  int64_t chunks = 0;       // chunks read and checksummed
  // Ids of damaged checkpoints, ascending, each once.
  std::vector<std::string> damaged;
};

// Reads every committed checkpoint's manifest and every chunk it names (location record, segment
// file, XXH3-64 checksum). Calls `report` with one line per damaged checkpoint or chunk (at most
// kMaxChunkLines chunks per checkpoint, then a count). An error only when the checkpoints cannot
// even be listed.
inline constexpr int kMaxChunkLines = 16;
absl::StatusOr<VerifyReport> VerifyStore(CheckpointStore& store,
                                         const std::function<void(const std::string&)>& report);

// `ckptd --verify`: opens the store in `dir` read-only (nothing is written), verifies it, prints
// the damaged items and a summary to `out`, errors to `err`. Returns an exit code above.
int RunVerify(const std::string& dir, StoreOptions options, std::FILE* out, std::FILE* err);

// `ckptd --salvage`: RepairSegmentStore on the index, then opens the store, verifies it and
// deletes every damaged checkpoint, printing each repair and each dropped checkpoint. Returns
// kVerifyClean when the store is then usable, kVerifyFailed when it still cannot be opened.
int RunSalvage(const std::string& dir, StoreOptions options, std::FILE* out, std::FILE* err);

// The Backup RPC: a consistent copy of the live store in the new directory `target_dir`, an
// absolute path beneath `root` (ckptd's --export-root; null: FAILED_PRECONDITION naming the
// flag). The copy is made under a temporary name beside the target and renamed into place, so
// the target is either absent or complete; an existing target is ALREADY_EXISTS, a relative path
// INVALID_ARGUMENT.
absl::StatusOr<v1::BackupResponse> BackupStore(CheckpointStore& store, const ConfinedRoot* root,
                                               const std::string& target_dir);

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_STORE_MAINTENANCE_H_
