#include "client/ckptctl/backup_command.h"

#include "client/ckptctl/output.h"
#include "client/ckptctl/progress.h"

namespace ckpt {

void AddBackupCommand(CLI::App& app, BackupCommand& command) {
  command.sub = app.add_subcommand(
      "backup",
      "Have the server write a consistent copy of its live store to a new server-side "
      "directory (admin)");
  command.sub
      ->add_option("DIR", command.target_dir,
                   "New directory on the server, relative to its --export-root (or an absolute "
                   "path beneath it)")
      ->required();
}

absl::Status RunBackup(CkptClient& client, const BackupCommand& command, bool json,
                       std::ostream& out) {
  absl::StatusOr<v1::BackupResponse> r = client.Backup(command.target_dir);
  if (!r.ok()) return r.status();
  if (json) {
    PrintJsonLine({{"target_dir", r->target_dir()},
                   {"checkpoints", r->checkpoints()},
                   {"segment_files", r->segment_files()},
                   {"linked_files", r->linked_files()},
                   {"copied_files", r->copied_files()},
                   {"segment_bytes", r->segment_bytes()}},
                  out);
    return absl::OkStatus();
  }
  out << "backed up " << r->checkpoints() << " checkpoints to " << r->target_dir() << " ("
      << r->segment_files() << " segment files, " << r->linked_files() << " linked, "
      << r->copied_files() << " copied, " << FormatBytes(r->segment_bytes()) << ")\n";
  return absl::OkStatus();
}

}  // namespace ckpt
