// core/base/safe_file.h: what the shim writes on a user's behalf never
// follows a planted symbolic link, never replaces a device node, a FIFO, a
// directory or another user's file, and never opens a guessable temporary
// name. Run as root (CI), the other user's file is real (chown).
#include "core/base/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/base/host_memory.h"
#include "gtest/gtest.h"

namespace vmmshim {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class SafeFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vmmshim-safe-file-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    victim_ = dir_ + "/victim";
    std::ofstream(victim_) << "the victim's 20 bytes";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The names in the directory other than those given.
  size_t Entries() {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      (void)e;
      ++n;
    }
    return n;
  }

  std::string dir_, victim_;
};

TEST_F(SafeFileTest, ANewFileAndAnOwnRegularFileAreWritten) {
  const std::string path = dir_ + "/stats.json";
  ASSERT_TRUE(ReplaceFile(path, "first", "VMMSHIM_STATS_FILE").ok());
  EXPECT_EQ(Slurp(path), "first");
  ASSERT_TRUE(ReplaceFile(path, "second, longer", "VMMSHIM_STATS_FILE").ok());
  EXPECT_EQ(Slurp(path), "second, longer");
  EXPECT_EQ(Entries(), 2u) << "a temporary file was left behind";
}

TEST_F(SafeFileTest, APlantedSymbolicLinkAtTheTargetIsRefused) {
  const std::string path = dir_ + "/snap.pickle";
  ASSERT_EQ(symlink(victim_.c_str(), path.c_str()), 0);
  const absl::Status s = ReplaceFile(path, "a pickle", "memory snapshot");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("is a symbolic link"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_EQ(Slurp(victim_), "the victim's 20 bytes");
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  // Appending (the log) and a stream (the trace) refuse it too.
  EXPECT_FALSE(OpenForAppend(path).ok());
  EXPECT_FALSE(CreateReplacing(path, 0644).ok());
  EXPECT_EQ(Slurp(victim_), "the victim's 20 bytes");
}

TEST_F(SafeFileTest, TheOldGuessableTemporaryNameIsNeverOpened) {
  // The snapshot once went to PATH.tmp.<pid>: a link planted there now
  // stays untouched, and the file is written.
  const std::string path = dir_ + "/snap.pickle";
  const std::string guessable = path + ".tmp." + std::to_string(getpid());
  ASSERT_EQ(symlink(victim_.c_str(), guessable.c_str()), 0);
  ASSERT_TRUE(ReplaceFile(path, "a pickle", "memory snapshot").ok());
  EXPECT_EQ(Slurp(path), "a pickle");
  EXPECT_EQ(Slurp(victim_), "the victim's 20 bytes");
}

TEST_F(SafeFileTest, DeviceNodesFifosAndDirectoriesAreRefusedAndLeftAsTheyWere) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string directory = dir_ + "/subdir";
  ASSERT_EQ(mkdir(directory.c_str(), 0700), 0);
  std::string node = "/dev/null";
  if (geteuid() == 0) {  // a node of its own, as an attacker's /dev/null look-alike
    node = dir_ + "/null";
    ASSERT_EQ(mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  }
  for (const auto& [path, kind] : {std::pair<std::string, const char*>{node, "character device"},
                                   {fifo, "FIFO"},
                                   {directory, "directory"}}) {
    const absl::Status s = ReplaceFile(path, "x", "VMMSHIM_SNAPSHOT_FILE");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_NE(s.message().find(kind), absl::string_view::npos) << s;
    EXPECT_FALSE(OpenForAppend(path).ok()) << path;  // a FIFO does not block either
  }
  struct stat st;
  ASSERT_EQ(lstat(node.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device node was replaced";
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(SafeFileTest, AnotherUsersFileIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user (chown)";
  ASSERT_EQ(chown(victim_.c_str(), 65534, 65534), 0);
  const absl::Status s = ReplaceFile(victim_, "overwritten", "VMMSHIM_STATS_FILE");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("belongs to uid 65534"), absl::string_view::npos) << s;
  EXPECT_FALSE(OpenForAppend(victim_).ok());
  EXPECT_EQ(Slurp(victim_), "the victim's 20 bytes");
}

TEST_F(SafeFileTest, ADirectoryOnTheWayThatAnotherUserControlsIsRefused) {
  const std::string mine = dir_ + "/mine";
  ASSERT_EQ(mkdir(mine.c_str(), 0700), 0);
  std::ofstream(mine + "/run.json") << "mine";
  // A directory anyone may write without the sticky bit: entries can be
  // renamed away under the writer.
  const std::string open_dir = dir_ + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  absl::Status s = ReplaceFile(open_dir + "/run.json", "x", "VMMSHIM_STATS_FILE");
  EXPECT_NE(s.message().find("others may write without the sticky bit"), absl::string_view::npos)
      << s;
  ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);  // as /tmp: fine
  EXPECT_TRUE(ReplaceFile(open_dir + "/run.json", "x", "VMMSHIM_STATS_FILE").ok());
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a link and a directory of another user";
  // Another user's link to my directory (planted in a sticky /tmp), and
  // another user's directory.
  const std::string link = open_dir + "/jobs";
  ASSERT_EQ(symlink(mine.c_str(), link.c_str()), 0);
  ASSERT_EQ(lchown(link.c_str(), 65534, 65534), 0);
  s = ReplaceFile(link + "/run.json", "overwritten", "VMMSHIM_STATS_FILE");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("a symbolic link of uid 65534"), absl::string_view::npos) << s;
  EXPECT_FALSE(OpenForAppend(link + "/shim.log").ok());
  EXPECT_FALSE(CreatePrivateFile(link, "backup").ok());
  EXPECT_EQ(Slurp(mine + "/run.json"), "mine");
  const std::string theirs = dir_ + "/theirs";
  ASSERT_EQ(mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  s = ReplaceFile(theirs + "/run.json", "x", "VMMSHIM_STATS_FILE");
  EXPECT_NE(s.message().find("a directory of uid 65534"), absl::string_view::npos) << s;
}

TEST_F(SafeFileTest, OnlyRegularFilesAreReadAndWithinTheirBound) {
  EXPECT_EQ(*ReadRegularFile(victim_, 1024), "the victim's 20 bytes");
  EXPECT_NE(ReadRegularFile(victim_, 4).status().message().find("more than the 4"),
            absl::string_view::npos);
  const std::string fifo = dir_ + "/c.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const absl::StatusOr<std::string> from_fifo = ReadRegularFile(fifo, 1024);  // no wait
  EXPECT_NE(from_fifo.status().message().find("is a FIFO"), absl::string_view::npos);
  const std::string zero = dir_ + "/d.json";
  ASSERT_EQ(symlink("/dev/zero", zero.c_str()), 0);
  EXPECT_NE(ReadRegularFile(zero, 1024).status().message().find("is a symbolic link"),
            absl::string_view::npos);
  EXPECT_NE(ReadRegularFile("/dev/zero", 1024).status().message().find("character device"),
            absl::string_view::npos);
}

TEST_F(SafeFileTest, AppendingKeepsWhatIsThereAndCreatesWhatIsNot) {
  absl::StatusOr<int> fd = OpenForAppend(victim_);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(write(*fd, "+more", 5), 5);
  close(*fd);
  EXPECT_EQ(Slurp(victim_), "the victim's 20 bytes+more");
  const std::string fresh = dir_ + "/log";
  fd = OpenForAppend(fresh);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  EXPECT_TRUE(std::filesystem::exists(fresh));
}

TEST_F(SafeFileTest, AFileNotCommittedLeavesNothingAndPrivateFilesAreNew) {
  {
    absl::StatusOr<FileReplacement> f = FileReplacement::Begin(dir_ + "/never", 0644);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->Write("abandoned").ok());
  }
  EXPECT_EQ(Entries(), 1u);  // the victim only
  absl::StatusOr<PrivateFile> a = CreatePrivateFile(dir_, "backup");
  absl::StatusOr<PrivateFile> b = CreatePrivateFile(dir_, "backup");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->path, b->path);
  struct stat st;
  ASSERT_EQ(fstat(a->fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  close(a->fd);
  close(b->fd);
  EXPECT_FALSE(CreatePrivateFile(dir_ + "/missing", "backup").ok());
}

TEST_F(SafeFileTest, HostMemoryHeadroomIsTheSmallestLimit) {
  // A planted /proc and /sys/fs/cgroup: cgroup v2, a limit on the parent.
  const std::string root = dir_ + "/root";
  std::filesystem::create_directories(root + "/proc/self");
  std::filesystem::create_directories(root + "/sys/fs/cgroup/job/step");
  std::ofstream(root + "/proc/meminfo") << "MemTotal: 100000000 kB\nMemAvailable: 8388608 kB\n";
  std::ofstream(root + "/proc/self/cgroup") << "0::/job/step\n";
  std::ofstream(root + "/sys/fs/cgroup/job/step/memory.max") << "max\n";
  std::ofstream(root + "/sys/fs/cgroup/job/step/memory.current") << "1000\n";
  std::ofstream(root + "/sys/fs/cgroup/job/memory.max") << (size_t{1} << 30) << "\n";
  std::ofstream(root + "/sys/fs/cgroup/job/memory.current") << (size_t{64} << 20) << "\n";
  HostMemoryHeadroom h = HostMemoryHeadroomUnder(root);
  EXPECT_EQ(h.bytes, (size_t{1} << 30) - (size_t{64} << 20));
  EXPECT_NE(h.limited_by.find("/sys/fs/cgroup/job "), std::string::npos) << h.limited_by;
  // No cgroup limit: MemAvailable.
  std::ofstream(root + "/sys/fs/cgroup/job/memory.max") << "max\n";
  h = HostMemoryHeadroomUnder(root);
  EXPECT_EQ(h.bytes, size_t{8} << 30);
  EXPECT_NE(h.limited_by.find("MemAvailable"), std::string::npos);
  // cgroup v1.
  std::ofstream(root + "/proc/self/cgroup") << "5:cpu,memory:/v1job\n";
  std::filesystem::create_directories(root + "/sys/fs/cgroup/memory/v1job");
  std::ofstream(root + "/sys/fs/cgroup/memory/v1job/memory.limit_in_bytes") << (size_t{2} << 30);
  std::ofstream(root + "/sys/fs/cgroup/memory/v1job/memory.usage_in_bytes") << (size_t{3} << 30);
  h = HostMemoryHeadroomUnder(root);
  EXPECT_EQ(h.bytes, 0u);  // over its limit already
  // Nothing readable.
  EXPECT_EQ(HostMemoryHeadroomUnder(dir_ + "/nothing").bytes, SIZE_MAX);
}

}  // namespace
}  // namespace vmmshim
