// Where a pause keeps contents and for how long (core/heap/host_backup.h
// BackupKind, PauseCoordinator::Pause / Resume with retain_contents), on the
// simulated driver: a copy retained across a resume stays at its address and
// is written again in place, a page-locked copy is registered with the
// driver until its allocation goes, a copy to a directory is a file of its
// own removed at resume.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "core/heap/host_backup.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class KeptContentsTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(1, 256 * kMiB);
    MakeCurrent(0);
  }
  CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  static const void* Kept(ShimCore& shim, CUdeviceptr p, size_t bytes) {
    absl::StatusOr<const void*> host = shim.control().PausedContents(p, bytes);
    return host.ok() ? *host : nullptr;
  }
  // Fill's pattern (byte i is i * 13 + seed) in host memory.
  static bool HostHolds(const void* host, size_t bytes, int seed) {
    const auto* b = static_cast<const unsigned char*>(host);
    for (size_t i = 0; i < bytes; ++i) {
      if (b[i] != static_cast<unsigned char>(i * 13 + seed)) return false;
    }
    return true;
  }
};

TEST_F(KeptContentsTest, ARetainedCopyStaysAtItsAddressAndIsWrittenAgainInPlace) {
  ShimCore shim(api_, FaultingPauses());  // page-locked copies: the faulting path
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  Fill(kv, 4 * kMiB, 1);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  const void* first = Kept(shim, kv, 4 * kMiB);
  ASSERT_NE(first, nullptr);

  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv"), /*retain_contents=*/true).ok());
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 1));
  EXPECT_EQ(Kept(shim, kv, 4 * kMiB), first);  // live, and its copy still readable
  EXPECT_TRUE(HostHolds(first, 4 * kMiB, 1));

  Fill(kv, 4 * kMiB, 2);  // changed since: the next pause copies it again
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  EXPECT_EQ(Kept(shim, kv, 4 * kMiB), first);
  EXPECT_TRUE(HostHolds(first, 4 * kMiB, 2));

  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());  // not retained: it goes
  EXPECT_EQ(ToCuResult(shim.control().PausedContents(kv, 16).status()), CUDA_ERROR_NOT_FOUND);
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 2));
  ASSERT_TRUE(a.Free(kv).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(KeptContentsTest, APauseWithoutContentsDropsARetainedCopy) {
  ShimCore shim(api_, FaultingPauses());  // page-locked copies: the faulting path
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv"), true).ok());
  ASSERT_NE(Kept(shim, kv, 16), nullptr);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), false).ok());
  EXPECT_EQ(Kept(shim, kv, 16), nullptr);  // it would be stale
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  ASSERT_TRUE(a.Free(kv).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(KeptContentsTest, APageLockedCopyIsRegisteredUntilItsAllocationGoes) {
  for (bool free_while_paused : {false, true}) {
    SCOPED_TRACE(free_while_paused ? "freed while paused" : "freed after a retaining resume");
    ShimCore shim(api_, FaultingPauses());  // page-locked copies: the faulting path
    Allocator& a = shim.allocator();
    const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
    Fill(kv, 4 * kMiB, 3);
    BackupKind pinned;
    pinned.page_locked = true;
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true, pinned).ok());
    void* host = const_cast<void*>(Kept(shim, kv, 4 * kMiB));
    ASSERT_NE(host, nullptr);
    unsigned int flags = 0;
    EXPECT_EQ(api_.cuMemHostGetFlags(&flags, host), CUDA_SUCCESS);
    // Straight to the copy engine: the staging ring was never needed.
    EXPECT_EQ(sim::LiveHostRegistrations(), 1u);
    EXPECT_TRUE(HostHolds(host, 4 * kMiB, 3));
    if (!free_while_paused) {
      ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv"), true).ok());
      EXPECT_TRUE(Holds(kv, 4 * kMiB, 3));
      EXPECT_EQ(Kept(shim, kv, 16), host);
    }
    ASSERT_TRUE(a.Free(kv).ok());
    EXPECT_NE(api_.cuMemHostGetFlags(&flags, host), CUDA_SUCCESS);
    EXPECT_EQ(sim::LiveHostRegistrations(), 0u);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
}

// A deep sleep pauses and resumes from the control socket's thread, which
// has no current context: the page-locked copy is still made, and dropped
// at the resume (asked about in its own context), not leaked.
TEST_F(KeptContentsTest, APageLockedCopyIsDroppedFromAThreadWithoutAContext) {
  ShimCore shim(api_, FaultingPauses());  // page-locked copies: the faulting path
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  Fill(kv, 4 * kMiB, 5);
  BackupKind pinned;
  pinned.page_locked = true;
  absl::Status paused, resumed;
  size_t registered_while_paused = 0;
  std::thread([&] {
    paused = shim.pause().Pause(TagSelection::Only("kv"), true, pinned).status();
    registered_while_paused = sim::LiveHostRegistrations();
    resumed = shim.pause().Resume(TagSelection::Only("kv")).status();
  }).join();
  ASSERT_TRUE(paused.ok()) << paused;
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_EQ(registered_while_paused, 1u);
  EXPECT_EQ(sim::LiveHostRegistrations(), 0u);
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 5));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

// Pinning is for speed: a driver that refuses it (a memlock limit) still
// gets the pause, with a pageable copy.
TEST_F(KeptContentsTest, ARefusedPageLockKeepsTheCopyPageable) {
  ShimCore shim(api_, FaultingPauses());  // page-locked copies: the faulting path
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  Fill(kv, 4 * kMiB, 7);
  BackupKind pinned;
  pinned.page_locked = true;
  sim::FailCall("cuMemHostRegister_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true, pinned).ok());
  sim::ClearFailures();
  void* host = const_cast<void*>(Kept(shim, kv, 4 * kMiB));
  ASSERT_NE(host, nullptr);
  unsigned int flags = 0;
  EXPECT_NE(api_.cuMemHostGetFlags(&flags, host), CUDA_SUCCESS);
  EXPECT_TRUE(HostHolds(host, 4 * kMiB, 7));
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 7));
  ASSERT_TRUE(a.Free(kv).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(KeptContentsTest, ACopyToADirectoryIsAFileOfItsOwnRemovedAtResume) {
  char dir[] = "/tmp/vmmshim-kept-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ShimCore shim(api_, FaultingPauses());  // page-locked copies: the faulting path
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  const CUdeviceptr more = Alloc(a, 6 * kMiB, "kv");
  Fill(kv, 4 * kMiB, 4);
  Fill(more, 6 * kMiB, 5);
  BackupKind disk;
  disk.directory = dir;
  for (int cycle = 0; cycle < 2; ++cycle) {
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true, disk).ok());
    size_t files = 0, bytes = 0;
    for (CUdeviceptr p : {kv, more}) {
      // NAME.XXXXXX: made with O_EXCL, never an existing file.
      const std::string name = "vmmshim-" + std::to_string(getpid()) + "-device0-" +
                               absl::StrFormat("%#x", p) + ".backup.";
      for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const std::string found = entry.path().filename().string();
        if (found.rfind(name, 0) == 0 && found.size() == name.size() + 6) {
          ++files;
          bytes += static_cast<size_t>(entry.file_size());
        }
      }
    }
    EXPECT_EQ(files, 2u);
    EXPECT_GE(bytes, 10 * kMiB);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv, 4 * kMiB, 4));
    EXPECT_TRUE(Holds(more, 6 * kMiB, 5));
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "files left behind after the resume";
  }
  std::filesystem::remove_all(dir);
  for (CUdeviceptr p : {kv, more}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(KeptContentsTest, ADirectoryThatCannotHoldTheFilesPausesNothing) {
  ShimCore shim(api_, FaultingPauses());  // page-locked copies: the faulting path
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  Fill(kv, 4 * kMiB, 6);
  BackupKind disk;
  disk.directory = "/nonexistent/vmmshim-backups";
  absl::StatusOr<size_t> paused = shim.pause().Pause(TagSelection::Only("kv"), true, disk);
  EXPECT_EQ(ToCuResult(paused.status()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(paused.status().message().find("/nonexistent/vmmshim-backups"), std::string::npos)
      << paused.status();
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 6));  // still live
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
  ASSERT_TRUE(a.Free(kv).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

}  // namespace
}  // namespace vmmshim
