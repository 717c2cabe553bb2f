#include "service/engine/store_maintenance.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "service/engine/loaded_checkpoint.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace {

void Print(std::FILE* f, const std::string& line) { std::fprintf(f, "%s\n", line.c_str()); }

// Verifies one checkpoint; reports each damaged chunk. Returns whether it is intact.
bool VerifyCheckpoint(CheckpointStore& store, const std::string& id, VerifyReport* totals,
                      const std::function<void(const std::string&)>& report) {
  absl::StatusOr<std::string> bytes = store.GetManifest(id);
  if (!bytes.ok()) {
    report(absl::StrCat("damaged checkpoint ", id, ": manifest: ", bytes.status().message()));
    return false;
  }
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> loaded = LoadedCheckpoint::Decode(*bytes);
  if (!loaded.ok()) {
    report(absl::StrCat("damaged checkpoint ", id, ": manifest: ", loaded.status().message()));
    return false;
  }
  const records::CheckpointManifest& m = (*loaded)->manifest;
  if (m.id() != id) {
    report(absl::StrCat("damaged checkpoint ", id, ": manifest names checkpoint \"", m.id(), "\""));
    return false;
  }
  int64_t bad = 0;
  for (const records::TensorRecord& t : m.tensors()) {
    for (const records::BlobRecord& b : t.blobs()) {
      for (int c = 0; c < b.chunk_checksums_size(); ++c) {
        const ChunkAddress address{m.data_id(), t.tensor_index(), b.blob_index(),
                                   static_cast<uint32_t>(c)};
        ++totals->chunks;
        absl::StatusOr<std::unique_ptr<ChunkData>> data =
            store.ReadChunk(address, b.chunk_checksums(c));
        if (data.ok()) continue;
        if (++bad <= kMaxChunkLines) {
          report(absl::StrCat("damaged checkpoint ", id, " tensor ", t.name(), " blob ",
                              b.blob_index(), " chunk ", c, ": ", data.status().message()));
        }
      }
    }
  }
  if (bad > kMaxChunkLines) {
    report(absl::StrCat("damaged checkpoint ", id, ": ", bad - kMaxChunkLines,
                        " more damaged chunks"));
  }
  return bad == 0;
}

}  // namespace

absl::StatusOr<VerifyReport> VerifyStore(CheckpointStore& store,
                                         const std::function<void(const std::string&)>& report) {
  CKPT_ASSIGN_OR_RETURN(const std::vector<std::string> ids, store.ListCheckpoints());
  VerifyReport totals;
  for (const std::string& id : ids) {
    ++totals.checkpoints;
    if (!VerifyCheckpoint(store, id, &totals, report)) totals.damaged.push_back(id);
  }
  return totals;
}

int RunVerify(const std::string& dir, StoreOptions options, std::FILE* out, std::FILE* err) {
  options.read_only = true;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenSegmentStore(dir, options);
  if (!store.ok()) {
    Print(err, absl::StrCat("ckptd --verify: ", store.status().message()));
    Print(err, absl::StrCat("ckptd --verify: the store cannot be opened; `ckptd --salvage --data ",
                            dir, "` repairs its index and drops what cannot be recovered"));
    return kVerifyFailed;
  }
  absl::StatusOr<VerifyReport> result =
      VerifyStore(**store, [out](const std::string& line) { Print(out, line); });
  if (!result.ok()) {
    Print(err, absl::StrCat("ckptd --verify: ", result.status().message()));
    Print(err, absl::StrCat("ckptd --verify: the store's index cannot be read; `ckptd --salvage "
                            "--data ",
                            dir, "` repairs it and drops what cannot be recovered"));
    return kVerifyFailed;
  }
  Print(out, absl::StrFormat("verified %d checkpoints, %d chunks: %d damaged", result->checkpoints,
                             result->chunks, result->damaged.size()));
  return result->damaged.empty() ? kVerifyClean : kVerifyDamaged;
}

int RunSalvage(const std::string& dir, StoreOptions options, std::FILE* out, std::FILE* err) {
  options.read_only = false;
  absl::StatusOr<std::vector<std::string>> repaired = RepairSegmentStore(dir);
  if (!repaired.ok()) {
    Print(err, absl::StrCat("ckptd --salvage: ", repaired.status().message()));
    return kVerifyFailed;
  }
  for (const std::string& note : *repaired) Print(out, absl::StrCat("repaired: ", note));
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenSegmentStore(dir, options);
  if (!store.ok()) {
    Print(err, absl::StrCat("ckptd --salvage: after repair: ", store.status().message()));
    return kVerifyFailed;
  }
  absl::StatusOr<VerifyReport> result =
      VerifyStore(**store, [out](const std::string& line) { Print(out, line); });
  if (!result.ok()) {
    Print(err, absl::StrCat("ckptd --salvage: ", result.status().message()));
    return kVerifyFailed;
  }
  int failed = 0;
  for (const std::string& id : result->damaged) {
    const absl::Status dropped = (*store)->DeleteCheckpoint(id);
    if (dropped.ok()) {
      Print(out, absl::StrCat("dropped checkpoint ", id));
    } else {
      ++failed;
      Print(err,
            absl::StrCat("ckptd --salvage: cannot drop checkpoint ", id, ": ", dropped.message()));
    }
  }
  // Space of what was dropped: segment files and deleted records.
  if (absl::StatusOr<int64_t> gc = (*store)->CollectGarbage(); !gc.ok()) {
    Print(err, absl::StrCat("ckptd --salvage: collecting garbage: ", gc.status().message()));
  }
  Print(out,
        absl::StrFormat("salvaged: %d checkpoints kept, %d dropped",
                        result->checkpoints - static_cast<int64_t>(result->damaged.size()) + failed,
                        result->damaged.size() - failed));
  return failed == 0 ? kVerifyClean : kVerifyFailed;
}

absl::StatusOr<v1::BackupResponse> BackupStore(CheckpointStore& store, const ConfinedRoot* root,
                                               const std::string& target_dir) {
  if (root == nullptr) {
    return absl::FailedPreconditionError(
        "backup is disabled on this server: ckptd writes server-side files only beneath the "
        "directory given by its --export-root flag (CKPTD_EXPORT_ROOT), which is not set");
  }
  CKPT_ASSIGN_OR_RETURN(const std::string relative, root->Normalize("target_dir", target_dir));
  CKPT_ASSIGN_OR_RETURN(ConfinedRoot::Location location,
                        root->OpenParent(relative, "target_dir", target_dir));
  struct stat st;
  if (::fstatat(location.parent.get(), location.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("target_dir \"", target_dir,
                     "\" already exists; a backup writes a new directory and never replaces one"));
  }
  if (errno != ENOENT) return ErrnoToStatus(errno, "stat", target_dir);
  // Built under a temporary name in the same directory (reached through this process's
  // descriptor of it, so that nothing is resolved outside the root again), then renamed.
  std::random_device random;
  const std::string partial =
      absl::StrFormat("%s.ckptd-partial-backup-%08x", location.name, random());
  const std::string partial_path =
      absl::StrCat("/proc/self/fd/", location.parent.get(), "/", partial);
  absl::StatusOr<BackupStats> stats = store.Backup(partial_path);
  if (!stats.ok()) {
    (void)RemoveTreeAt(location.parent.get(), partial, target_dir);
    (void)RemoveTreeAt(location.parent.get(), partial + ".tmp", target_dir);
    return absl::Status(stats.status().code(),
                        absl::StrCat("backup to \"", target_dir, "\": ", stats.status().message()));
  }
  if (absl::Status renamed = RenameNoReplaceAt(location.parent.get(), partial,
                                               location.parent.get(), location.name, target_dir);
      !renamed.ok()) {
    (void)RemoveTreeAt(location.parent.get(), partial, target_dir);
    return renamed;
  }
  CKPT_RETURN_IF_ERROR(SyncDirectoryFd(location.parent.get(), target_dir));
  v1::BackupResponse response;
  response.set_target_dir(target_dir);
  response.set_checkpoints(stats->checkpoints);
  response.set_segment_files(stats->segment_files);
  response.set_linked_files(stats->linked_files);
  response.set_copied_files(stats->copied_files);
  response.set_segment_bytes(stats->segment_bytes);
  return response;
}

}  // namespace ckpt
