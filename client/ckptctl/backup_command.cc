#include "client/ckptctl/backup_command.h"

namespace ckpt {

void AddBackupCommand(CLI::App& app, BackupCommand& command) {
  command.sub = app.add_subcommand(
      "backup",
      "Have the server write a consistent copy of its live store to a new server-side "
      "directory (admin)");
  command.sub
      ->add_option("DIR", command.target_dir,
                   "New directory on the server: an absolute path beneath its --export-root")
      ->required();
}

absl::Status RunBackup(CkptClient& client, const BackupCommand& command, std::ostream& out) {
  absl::StatusOr<v1::BackupResponse> r = client.Backup(command.target_dir);
  if (!r.ok()) return r.status();
  out << "backed up " << r->checkpoints() << " checkpoints to " << r->target_dir() << " ("
      << r->segment_files() << " segment files, " << r->linked_files() << " linked, "
      << r->copied_files() << " copied, " << r->segment_bytes() << " bytes)\n";
  return absl::OkStatus();
}

}  // namespace ckpt
