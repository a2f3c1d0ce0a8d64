// Files the shim and the CLI write on a user's behalf (snapshots,
// statistics, traces, the log, disk backups, compare's output), made so
// that another local user cannot turn the write against anyone: a process
// under the shim may run as root, in a directory others can write (/tmp),
// at a path whose name others can guess (it holds the pid).
//
// Note [Replacing a file safely]: a file is never opened by its final name
// for writing, nor written in a directory another user controls
// (DirectoryProblem). Its contents go to a private temporary file made with
// mkstemp (O_EXCL: a planted symbolic link or file at the temporary name
// makes mkstemp pick another) in the target's directory, which is then
// renamed over the target: rename(2) replaces the directory entry and never
// follows a symbolic link there. Before the rename the target is checked:
// missing, or a regular file of this effective user; a symbolic link, a
// device node, a FIFO, a socket, a directory or another user's file is
// refused with a message naming it, so the shim never replaces what it did
// not make (CWE-59, CWE-377; the rule other interposers learned:
// ../shared/DESIGN.md section 9). A file written in place (the log, which
// several processes append to) is opened with O_NOFOLLOW|O_NONBLOCK after
// the same check and checked again on the descriptor.
//
// Errors: absl::Status with the path and the reason in words; errno-based
// reasons use strerror. Nothing here logs.
// Thread safety: every function may be called from any thread; a
// FileReplacement is used by one thread at a time.
// Process exit: a FileReplacement destroyed before Commit() removes its
// temporary file; a process killed meanwhile leaves one `.NAME.XXXXXX` file
// (mode 0600) beside the target.
#ifndef VMMSHIM_CORE_BASE_SAFE_FILE_H_
#define VMMSHIM_CORE_BASE_SAFE_FILE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vmmshim {

// Why a file in directory `dir` could be redirected or swapped by another
// user, in words naming the culprit, or "" when it could not:
// - every symbolic link on `dir`'s path as written belongs to this
//   effective user or root (a link another user planted in /tmp would send
//   the write anywhere; the kernel's fs.protected_symlinks is not relied
//   on), and
// - every directory of its real path (symbolic links resolved) belongs to
//   this user or root and is not writable by all unless sticky (as /tmp):
//   no other user can rename an entry on the way. (A group-writable
//   directory is left to its group, whom the administrator chose.)
// A relative `dir` is taken from the working directory.
std::string DirectoryProblem(const std::string& dir);

// Why `path` may not be replaced or appended to, in words naming it (a
// directory on its way another user controls: DirectoryProblem; a symbolic
// link, a device node, another user's file...), or "" when it may: it does
// not exist, or it is a regular file owned by this effective user.
std::string TargetProblem(const std::string& path);

// The mode a file created by open(2) with 0666 would get under this
// process's umask (read from /proc/self/status: umask(2) cannot be read
// without being set, which races other threads). 0644 when unknown.
mode_t DefaultFileMode();

// A new file that replaces `path` when committed (Note [Replacing a file
// safely]).
class FileReplacement {
 public:
  // A temporary file `.BASENAME.XXXXXX` in `path`'s directory, mode `mode`;
  // refused when TargetProblem(path) is not empty or the directory does not
  // take the file.
  static absl::StatusOr<FileReplacement> Begin(const std::string& path, mode_t mode);

  FileReplacement(FileReplacement&& other) noexcept;
  FileReplacement& operator=(FileReplacement&&) = delete;
  FileReplacement(const FileReplacement&) = delete;
  ~FileReplacement();

  // The descriptor of the file (close-on-exec); owned by this object until
  // Release().
  int fd() const { return fd_; }
  // Writes all of `bytes` at the current offset (EINTR and short writes
  // retried).
  absl::Status Write(absl::string_view bytes);
  // Checks the target again and renames the file over it. The descriptor
  // stays open (a stream written after the commit goes on to the named
  // file). `sync`: fsync first, so that a crash leaves either the old file
  // or the whole new one.
  absl::Status Commit(bool sync);
  // Gives the descriptor to the caller (after Commit(): it is the named
  // file's); the destructor no longer closes it.
  int Release();

 private:
  FileReplacement(std::string path, std::string temporary, int fd)
      : path_(std::move(path)), temporary_(std::move(temporary)), fd_(fd) {}

  std::string path_;
  std::string temporary_;  // empty once committed
  int fd_ = -1;
};

// `contents` as the whole of `path` (FileReplacement, synced, committed,
// closed), mode DefaultFileMode(). `what` names the file in the error
// ("VMMSHIM_STATS_FILE").
absl::Status ReplaceFile(const std::string& path, absl::string_view contents,
                         absl::string_view what);

// `path` replaced at once by a new empty file of mode `mode` (a
// FileReplacement begun and committed), for a stream written after: its
// descriptor, the caller's.
absl::StatusOr<int> CreateReplacing(const std::string& path, mode_t mode);

// `path` opened for appending (created with DefaultFileMode() when
// missing), after TargetProblem() and, on the descriptor, the same check:
// a regular file of this user. The descriptor is the caller's.
absl::StatusOr<int> OpenForAppend(const std::string& path);

// All of `bytes` written to descriptor `fd` (a file or a pipe) at its
// offset, EINTR and short writes retried; the error (strerror) of the first
// write that fails.
absl::Status WriteFully(int fd, absl::string_view bytes);

// The contents of `path`, read only when it is a regular file (opened with
// O_NOFOLLOW|O_NONBLOCK: a planted link, FIFO or device node is refused,
// never followed, waited on or read without end) of at most `max_bytes`;
// otherwise why not, naming the path.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max_bytes);

// A new private file (mode 0600, O_EXCL: never an existing one) in
// `directory` (refused when DirectoryProblem), named PREFIX.XXXXXX; its
// descriptor and path.
struct PrivateFile {
  int fd = -1;
  std::string path;
};
absl::StatusOr<PrivateFile> CreatePrivateFile(const std::string& directory,
                                              const std::string& prefix);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_SAFE_FILE_H_
