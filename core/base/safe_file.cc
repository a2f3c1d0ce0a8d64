#include "core/base/safe_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vmmshim {
namespace {

std::string Errno(int err) { return std::strerror(err); }

// What a file of mode `mode` is, in words; empty for a regular file.
std::string KindProblem(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISLNK(mode)) return "is a symbolic link";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISFIFO(mode)) return "is a FIFO";
  if (S_ISSOCK(mode)) return "is a socket";
  if (S_ISDIR(mode)) return "is a directory";
  return "is not a regular file";
}

std::string OwnerProblem(const struct stat& st) {
  if (st.st_uid == geteuid()) return "";
  return absl::StrCat("belongs to uid ", st.st_uid, ", not to this user (uid ", geteuid(), ")");
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// `verb`: "written", "appended to".
absl::Status Refuse(absl::string_view verb, const std::string& path, absl::string_view why) {
  return absl::PermissionDeniedError(absl::StrCat("'", path, "' ", why, ": not ", verb,
                                                  " (only a regular file of this user is "
                                                  "replaced or appended to)"));
}

// The prefixes of absolute path `path`: "/a", "/a/b", ... (and "/").
std::vector<std::string> Prefixes(const std::string& path) {
  std::vector<std::string> out = {"/"};
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at == path.size() || path[at] == '/') {
      if (at > 1 && path[at - 1] != '/') out.push_back(path.substr(0, at));
    }
  }
  return out;
}

bool Trusted(uid_t uid) { return uid == geteuid() || uid == 0; }

}  // namespace

std::string DirectoryProblem(const std::string& dir) {
  std::string absolute = dir.empty() ? "." : dir;
  if (absolute.front() != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd) == nullptr) return absl::StrCat("cannot be checked: ", Errno(errno));
    absolute = absl::StrCat(cwd, "/", absolute);
  }
  struct stat st;
  for (const std::string& p : Prefixes(absolute)) {
    if (lstat(p.c_str(), &st) != 0) break;  // missing: what follows is reported by its user
    if (S_ISLNK(st.st_mode) && !Trusted(st.st_uid)) {
      return absl::StrCat("has '", p, "' on its way, a symbolic link of uid ", st.st_uid,
                          ", not of this user (uid ", geteuid(), ") or root");
    }
  }
  char real[PATH_MAX];
  if (realpath(absolute.c_str(), real) == nullptr) return "";  // missing: made or refused later
  for (const std::string& p : Prefixes(real)) {
    if (stat(p.c_str(), &st) != 0) break;
    if (!Trusted(st.st_uid)) {
      return absl::StrCat("is in '", p, "', a directory of uid ", st.st_uid,
                          " (who could swap what is in it), not of this user (uid ", geteuid(),
                          ") or root");
    }
    if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
      return absl::StrFormat("is in '%s', a directory others may write without the sticky bit "
                             "(mode %04o)",
                             p, st.st_mode & 07777);
    }
  }
  return "";
}

std::string TargetProblem(const std::string& path) {
  if (path.empty()) return "is empty";
  if (std::string problem = DirectoryProblem(DirectoryOf(path)); !problem.empty()) {
    return problem;
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? "" : absl::StrCat("cannot be checked: ", Errno(errno));
  }
  if (std::string kind = KindProblem(st.st_mode); !kind.empty()) return kind;
  return OwnerProblem(st);
}

mode_t DefaultFileMode() {
  mode_t mask = 022;
  if (FILE* f = std::fopen("/proc/self/status", "re")) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned value = 0;
      if (std::sscanf(line, "Umask: %o", &value) == 1) {
        mask = static_cast<mode_t>(value & 0777);
        break;
      }
    }
    std::fclose(f);
  }
  return 0666 & ~mask;
}

absl::StatusOr<FileReplacement> FileReplacement::Begin(const std::string& path, mode_t mode) {
  if (std::string problem = TargetProblem(path); !problem.empty()) {
    return Refuse("written", path, problem);
  }
  std::string temporary = absl::StrCat(DirectoryOf(path), "/.", BaseName(path), ".XXXXXX");
  const int fd = mkostemp(temporary.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot write '", path, "': cannot create a file in '",
                                               DirectoryOf(path), "': ", Errno(errno)));
  }
  fchmod(fd, mode);
  return FileReplacement(path, std::move(temporary), fd);
}

FileReplacement::FileReplacement(FileReplacement&& other) noexcept
    : path_(std::move(other.path_)),
      temporary_(std::exchange(other.temporary_, std::string())),
      fd_(std::exchange(other.fd_, -1)) {}

FileReplacement::~FileReplacement() {
  if (!temporary_.empty()) unlink(temporary_.c_str());
  if (fd_ >= 0) close(fd_);
}

absl::Status FileReplacement::Write(absl::string_view bytes) {
  if (absl::Status s = WriteFully(fd_, bytes); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot write '", path_, "': ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status FileReplacement::Commit(bool sync) {
  if (temporary_.empty()) return absl::FailedPreconditionError("committed already");
  if (sync && fsync(fd_) != 0 && errno != EINVAL) {
    return absl::UnavailableError(absl::StrCat("cannot write '", path_, "': fsync: ", Errno(errno)));
  }
  // Checked again: the target may have appeared since Begin().
  if (std::string problem = TargetProblem(path_); !problem.empty()) {
    return Refuse("written", path_, problem);
  }
  if (rename(temporary_.c_str(), path_.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write '", path_, "': rename: ", Errno(errno)));
  }
  temporary_.clear();
  return absl::OkStatus();
}

int FileReplacement::Release() { return std::exchange(fd_, -1); }

absl::Status ReplaceFile(const std::string& path, absl::string_view contents,
                         absl::string_view what) {
  auto prefixed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  };
  absl::StatusOr<FileReplacement> file = FileReplacement::Begin(path, DefaultFileMode());
  if (!file.ok()) return prefixed(file.status());
  if (absl::Status s = file->Write(contents); !s.ok()) return prefixed(s);
  if (absl::Status s = file->Commit(/*sync=*/true); !s.ok()) return prefixed(s);
  return absl::OkStatus();
}

absl::StatusOr<int> CreateReplacing(const std::string& path, mode_t mode) {
  absl::StatusOr<FileReplacement> file = FileReplacement::Begin(path, mode);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Commit(/*sync=*/false); !s.ok()) return s;
  return file->Release();
}

absl::StatusOr<int> OpenForAppend(const std::string& path) {
  if (std::string problem = TargetProblem(path); !problem.empty()) {
    return Refuse("appended to", path, problem);
  }
  // O_NONBLOCK: a FIFO put there since the check fails at once instead of
  // blocking; O_NOFOLLOW: a symbolic link put there is refused.
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK |
                                        O_CLOEXEC, DefaultFileMode());
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open '", path, "': ", Errno(errno)));
  }
  struct stat st;
  std::string problem;
  if (fstat(fd, &st) != 0) {
    problem = absl::StrCat("cannot be checked: ", Errno(errno));
  } else if (problem = KindProblem(st.st_mode); problem.empty()) {
    problem = OwnerProblem(st);
  }
  if (!problem.empty()) {
    close(fd);
    return Refuse("appended to", path, problem);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // blocking writes from here on
  return fd;
}

absl::Status WriteFully(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("write: ", Errno(errno)));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) return absl::PermissionDeniedError(absl::StrCat("'", path, "' is a symbolic link: not read"));
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", Errno(err)));
  }
  struct stat st;
  std::string problem;
  if (fstat(fd, &st) != 0) {
    problem = absl::StrCat("cannot be checked: ", Errno(errno));
  } else if (problem = KindProblem(st.st_mode); problem.empty() &&
                                                static_cast<uint64_t>(st.st_size) > max_bytes) {
    problem = absl::StrCat("holds ", st.st_size, " bytes, more than the ", max_bytes,
                           " such a file may");
  }
  if (!problem.empty()) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat("'", path, "' ", problem, ": not read"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = read(fd, text.data() + done, text.size() - done);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // the file shrank
    done += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(done);
  return text;
}

absl::StatusOr<PrivateFile> CreatePrivateFile(const std::string& directory,
                                              const std::string& prefix) {
  if (std::string problem = DirectoryProblem(directory); !problem.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("'", directory, "' ", problem, ": no file made there"));
  }
  PrivateFile file;
  file.path = absl::StrCat(directory, "/", prefix, ".XXXXXX");
  file.fd = mkostemp(file.path.data(), O_CLOEXEC);
  if (file.fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create a file in '", directory, "': ",
                                               Errno(errno)));
  }
  return file;
}

}  // namespace vmmshim
