// `ckptctl backup DIR`: asks ckptd for a consistent copy of its live store in the new server-side
// directory DIR (the Backup RPC; DIR is an absolute path beneath the server's --export-root).
#ifndef CKPT_CLIENT_CKPTCTL_BACKUP_COMMAND_H_
#define CKPT_CLIENT_CKPTCTL_BACKUP_COMMAND_H_

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "client/client.h"

namespace ckpt {

struct BackupCommand {
  CLI::App* sub = nullptr;  // set by AddBackupCommand; parsed when *sub is true
  std::string target_dir;
};

// Declares the `backup` subcommand of `app`, parsing into `command` (which must not move after).
void AddBackupCommand(CLI::App& app, BackupCommand& command);

// Runs it: one summary line on `out`.
absl::Status RunBackup(CkptClient& client, const BackupCommand& command, bool json,
                       std::ostream& out);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_BACKUP_COMMAND_H_
