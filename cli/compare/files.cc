// Strings, files and directories of a comparison (internal.h).
#include <dirent.h>
#include <sys/stat.h>

#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cli/compare/internal.h"
#include "core/base/safe_file.h"

namespace vmmshim::compare {

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

std::string Truncate(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

std::string Describe(const ChildResult& c) {
  if (c.timed_out) return "timed out (killed)";
  if (c.interrupted) return "interrupted";
  if (c.signal != 0) return "killed by " + SignalName(c.signal);
  return "exit " + std::to_string(c.exit_code);
}

std::vector<std::string> FilesWithPrefix(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> found;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (StartsWith(e->d_name, prefix)) found.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
  }
  std::sort(found.begin(), found.end());
  return found;
}

bool MakeDirs(const std::string& path, std::string* error) {
  std::string partial;
  for (const std::string& part : Split(path, '/')) {
    partial += part;
    if (!partial.empty() && mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = "cannot create " + partial + ": " + std::strerror(errno);
      return false;
    }
    partial += '/';
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = path + " is not a directory";
    return false;
  }
  // Note [Replacing a file safely] (core/base/safe_file.h): an existing
  // directory of another user, or one reached through their link, is theirs.
  if (std::string problem = DirectoryProblem(path + "/."); !problem.empty()) {
    *error = path + " " + problem + "; nothing written there";
    return false;
  }
  return true;
}

std::optional<std::string> MakeOutputDirectory(const char* tmpdir, std::string* error) {
  const std::string parent = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
  char stamp[32];
  const time_t now = time(nullptr);
  struct tm local;
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&now, &local));
  std::string path = parent + "/vmmshim-compare-" + stamp + "-XXXXXX";
  if (mkdtemp(path.data()) == nullptr) {
    *error = "cannot create a directory in " + parent + " ($TMPDIR): " + std::strerror(errno) +
             " (give --out DIR)";
    return std::nullopt;
  }
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool WriteFile(const std::string& path, const std::string& text, std::string* error) {
  // Note [Replacing a file safely] (core/base/safe_file.h).
  absl::StatusOr<FileReplacement> file = FileReplacement::Begin(path, DefaultFileMode());
  absl::Status s = file.ok() ? file->Write(text) : file.status();
  if (s.ok()) s = file->Commit(/*sync=*/false);
  if (!s.ok()) {
    *error = std::string(s.message());
    return false;
  }
  return true;
}

}  // namespace vmmshim::compare
