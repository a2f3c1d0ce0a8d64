// Pause and resume by tag (PauseCoordinator::Pause / Resume, core/heap/pause.h,
// docs/pause-resume.md) on the simulated driver: memory released and
// addresses kept, contents restored, access as if never paused, the error
// codes, and failures leaving nothing half done (with other threads calling:
// pause_concurrent_calls_test.cc).
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/heap/backup_copier.h"
#include "core/sync/thread_slot.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class PauseTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kMiB);
    MakeCurrent(0);
  }
  CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }

  const CUstream kStream = reinterpret_cast<CUstream>(0x51);
};

TEST_F(PauseTest, PauseReleasesMemoryKeepsAddressesAndResumeRestoresContents) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr model = Alloc(a, 8 * kMiB, "");
  const CUdeviceptr kv = Alloc(a, 32 * kMiB, "kv");
  const CUdeviceptr small = Alloc(a, 4096, "kv");  // packed, in a granule of the tag
  Fill(model, 8 * kMiB, 1);
  Fill(kv, 32 * kMiB, 2);
  Fill(small, 4096, 3);
  const size_t free_before = FreeMemory();

  absl::StatusOr<size_t> released = shim.pause().Pause(TagSelection::Only("kv"), /*keep_contents=*/true);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_GE(*released, 32 * kMiB + 2 * kMiB);
  EXPECT_EQ(FreeMemory(), free_before + *released);  // the driver has it back
  // Still addressable: a kernel reads the kept contents from host memory.
  EXPECT_TRUE(Holds(kv, 32 * kMiB, 2));
  EXPECT_TRUE(Holds(small, 4096, 3));
  EXPECT_TRUE(Holds(model, 8 * kMiB, 1));                      // other memory untouched
  EXPECT_TRUE(a.Find(kv).ok());                                // the pointer is still known
  EXPECT_EQ(shim.control().GetStats().paused_bytes, *released);

  // The freed memory serves other allocations meanwhile.
  const CUdeviceptr other = Alloc(a, 32 * kMiB, "");
  Fill(other, 32 * kMiB, 9);
  ASSERT_TRUE(a.Free(other).ok());

  absl::StatusOr<size_t> restored = shim.pause().Resume(TagSelection::Only("kv"));
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, *released);
  EXPECT_TRUE(Holds(kv, 32 * kMiB, 2));
  EXPECT_TRUE(Holds(small, 4096, 3));
  EXPECT_TRUE(Holds(model, 8 * kMiB, 1));
  const AllocatorStats s = shim.control().GetStats();
  EXPECT_EQ(s.paused_bytes, 0u);
  EXPECT_EQ(s.peak_paused_bytes, *released);
  EXPECT_EQ(sim::LiveHostAllocations(), 0u);
  for (CUdeviceptr p : {model, kv, small}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
  EXPECT_EQ(sim::GetUsage().handles, 0u);
}

// A paused allocation's kept contents are readable in host memory (what
// torch_memory_saver's get_cpu_backup gives), only while paused with them.
TEST_F(PauseTest, PausedContentsAreTheHostCopyWhilePaused) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  const CUdeviceptr small = Alloc(a, 4096, "kv");   // packed: inside a shared granule
  const CUdeviceptr scratch = Alloc(a, 4 * kMiB, "scratch");
  Fill(kv, 4 * kMiB, 5);
  Fill(small, 4096, 6);
  auto code = [](const absl::Status& s) { return ToCuResult(s); };
  EXPECT_EQ(code(shim.control().PausedContents(kv, 16).status()), CUDA_ERROR_NOT_FOUND);  // live

  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), /*keep_contents=*/true).ok());
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("scratch"), /*keep_contents=*/false).ok());
  absl::StatusOr<const void*> host = shim.control().PausedContents(kv + kMiB, 3 * kMiB);
  ASSERT_TRUE(host.ok()) << host.status();
  // Fill's pattern: byte i of an allocation is i * 13 + seed.
  const auto* bytes = static_cast<const unsigned char*>(*host);
  bool same = true;
  for (size_t i = 0; i < 3 * kMiB; ++i) {
    same &= bytes[i] == static_cast<unsigned char>((kMiB + i) * 13 + 5);
  }
  EXPECT_TRUE(same);
  host = shim.control().PausedContents(small, 4096);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(static_cast<const unsigned char*>(*host)[4095],
            static_cast<unsigned char>(4095 * 13 + 6));
  EXPECT_EQ(code(shim.control().PausedContents(kv, 4 * kMiB + 1).status()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(code(shim.control().PausedContents(small + 1, 4096).status()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(code(shim.control().PausedContents(0x1234, 1).status()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(code(shim.control().PausedContents(scratch, 16).status()), CUDA_ERROR_NOT_FOUND);  // dropped

  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_EQ(code(shim.control().PausedContents(kv, 16).status()), CUDA_ERROR_NOT_FOUND);
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 5));
  for (CUdeviceptr p : {kv, small, scratch}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

// The memory margin (torch_memory_saver's memory_margin_bytes): a tagged
// allocation that needs new memory fails when less than the margin would
// stay free; untagged ones and cache hits are not held back.
TEST_F(PauseTest, TheMemoryMarginRefusesTaggedAllocationsThatWouldEatIntoIt) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kept = Alloc(a, 8 * kMiB, "kv");
  ASSERT_TRUE(a.Free(kept).ok());  // cached
  const size_t free_bytes = FreeMemory();
  shim.control().SetMemoryMarginBytes(free_bytes - 16 * kMiB);
  absl::StatusOr<Allocator::Allocation> refused = a.Allocate(32 * kMiB, "kv");
  EXPECT_EQ(ToCuResult(refused.status()), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(FreeMemory(), free_bytes);                  // nothing was made
  const CUdeviceptr fits = Alloc(a, 8 * kMiB, "kv");    // the cached block
  const CUdeviceptr untagged = Alloc(a, 32 * kMiB, "");
  shim.control().SetMemoryMarginBytes(0);
  const CUdeviceptr later = Alloc(a, 32 * kMiB, "kv");
  for (CUdeviceptr p : {fits, untagged, later}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

// The staging ring is page-locked once and kept (pinning costs about as much
// as a seventh of an 8 GiB copy on an H200 host); a context's end that drops
// its registration is met by registering again; the ring's end unregisters
// it.
TEST_F(PauseTest, TheStagingRingIsRegisteredOnceAndAgainAfterAReset) {
  {
    ShimCore shim(api_, FaultingPauses());  // the ring serves pageable copies
    Allocator& a = shim.allocator();
    const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
    Fill(kv, 4 * kMiB, 4);
    EXPECT_EQ(sim::LiveHostRegistrations(), 0u);  // none before a copy
    sim::ResetCallCounts();
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
      ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
      EXPECT_TRUE(Holds(kv, 4 * kMiB, 4));
    }
    EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 1u);
    EXPECT_EQ(sim::LiveHostRegistrations(), 1u);
    ASSERT_TRUE(a.Free(kv).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  EXPECT_EQ(sim::LiveHostRegistrations(), 0u);
  // A registration made in a context that is then destroyed goes with it;
  // the next use registers again, in the context current then.
  {
    StagingRing ring(api_);
    CUcontext other = nullptr;
    ASSERT_EQ(sim::cuCtxCreate_v2(&other, 0, 0), CUDA_SUCCESS);  // current now
    sim::ResetCallCounts();
    ASSERT_TRUE(ring.Ready().ok());
    ASSERT_TRUE(ring.Ready().ok());
    EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 1u);
    ASSERT_EQ(sim::cuCtxDestroy_v2(other), CUDA_SUCCESS);
    EXPECT_EQ(sim::LiveHostRegistrations(), 0u);
    MakeCurrent(0);
    ASSERT_TRUE(ring.Ready().ok());
    EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 2u);
    EXPECT_EQ(sim::LiveHostRegistrations(), 1u);
    ring.slot(1)[StagingRing::kSlotBytes - 1] = 1;  // its memory is the ring's own
  }
  EXPECT_EQ(sim::LiveHostRegistrations(), 0u);
}

TEST_F(PauseTest, UnknownTagsAndRepeatsDoNothingAndSucceed) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  EXPECT_EQ(*shim.pause().Pause(TagSelection::Only("nobody"), true), 0u);
  EXPECT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), 0u);  // nothing paused yet
  EXPECT_GT(*shim.pause().Pause(TagSelection::Only("kv"), false), 0u);
  EXPECT_EQ(*shim.pause().Pause(TagSelection::Only("kv"), true), 0u);  // already paused
  EXPECT_GT(*shim.pause().Resume(TagSelection::Only("kv")), 0u);
  EXPECT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), 0u);  // already resumed
  char c = 0;
  EXPECT_EQ(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);  // mapped again (contents not kept)
  ASSERT_TRUE(a.Free(kv).ok());
}

TEST_F(PauseTest, NoTagSelectsEveryAllocationOnEveryDevice) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p0 = Alloc(a, 4 * kMiB, "");
  const CUdeviceptr t0 = Alloc(a, 4096, "x");
  MakeCurrent(1);
  const CUdeviceptr p1 = Alloc(a, 6 * kMiB, "y");
  MakeCurrent(0);
  Fill(p0, 4 * kMiB, 4);
  Fill(t0, 4096, 5);
  absl::StatusOr<size_t> released = shim.pause().Pause(TagSelection::All(), true);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(sim::GetUsage().handles, 0u);  // nothing of the shim's holds device memory now
  char c;
  EXPECT_EQ(sim::DeviceRead(1, &c, p1, 1), CUDA_SUCCESS);  // dropped? no: kept, in host memory
  ASSERT_EQ(*shim.pause().Resume(TagSelection::All()), *released);
  EXPECT_TRUE(Holds(p0, 4 * kMiB, 4));
  EXPECT_TRUE(Holds(t0, 4096, 5));
  EXPECT_EQ(sim::DeviceRead(1, &c, p1, 1), CUDA_SUCCESS);
  for (CUdeviceptr p : {p0, t0, p1}) ASSERT_TRUE(a.Free(p).ok());
}

// cudaFree of paused memory frees it as any other: its backup goes, its
// address range goes back, and resume has nothing of it to restore.
TEST_F(PauseTest, FreeingPausedMemoryWorksAndLeaksNothing) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr big = Alloc(a, 16 * kMiB, "kv");
  const CUdeviceptr s1 = Alloc(a, 4096, "kv");
  const CUdeviceptr s2 = Alloc(a, 8192, "kv");
  Fill(s2, 8192, 6);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(a.Free(big).ok());
  ASSERT_TRUE(a.Free(s1).ok());
  EXPECT_EQ(ToCuResult(a.Free(big)), CUDA_ERROR_INVALID_VALUE);  // a double free, as ever
  const AllocatorStats paused = shim.control().GetStats();
  EXPECT_EQ(paused.live_allocations, 1u);
  absl::StatusOr<size_t> restored = shim.pause().Resume(TagSelection::Only("kv"));
  ASSERT_TRUE(restored.ok());
  EXPECT_LT(*restored, 16 * kMiB);  // only the granule of s2
  EXPECT_TRUE(Holds(s2, 8192, 6));
  ASSERT_TRUE(a.Free(s2).ok());
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());  // nothing left but cached memory
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectNothingLeft();
}

TEST_F(PauseTest, ExportedMemoryIsRefusedAndNothingIsPaused) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kept = Alloc(a, 4 * kMiB, "kv");
  const CUdeviceptr shared = Alloc(a, 4 * kMiB, "kv");
  Fill(kept, 4 * kMiB, 7);
  ASSERT_TRUE(shim.control().Export(shared).ok());
  EXPECT_EQ(ToCuResult(shim.pause().Pause(TagSelection::Only("kv"), true).status()), CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(ToCuResult(shim.pause().Pause(TagSelection::All(), false).status()), CUDA_ERROR_NOT_PERMITTED);
  EXPECT_TRUE(Holds(kept, 4 * kMiB, 7));
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
  // Paused memory cannot be exported either.
  const CUdeviceptr other = Alloc(a, 4 * kMiB, "solo");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("solo"), false).ok());
  EXPECT_EQ(ToCuResult(shim.control().Export(other).status()), CUDA_ERROR_NOT_PERMITTED);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("solo")).ok());
  for (CUdeviceptr p : {kept, shared, other}) ASSERT_TRUE(a.Free(p).ok());
}

// Out of device memory at resume: everything stays paused (contents kept),
// nothing leaks, and a later resume succeeds.
TEST_F(PauseTest, ResumeWithoutRoomLeavesEverythingPausedUntilThereIsRoom) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv1 = Alloc(a, 64 * kMiB, "kv");
  const CUdeviceptr kv2 = Alloc(a, 64 * kMiB, "kv");
  Fill(kv1, 64 * kMiB, 8);
  Fill(kv2, 64 * kMiB, 9);
  const size_t released = *shim.pause().Pause(TagSelection::Only("kv"), true);
  const size_t handles_paused = sim::GetUsage().handles;
  // Someone else takes the memory (a plain driver allocation, as another
  // library's would be).
  CUdeviceptr hog = 0;
  ASSERT_EQ(sim::cuMemAlloc_v2(&hog, 200 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(ToCuResult(shim.pause().Resume(TagSelection::Only("kv")).status()), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(shim.control().GetStats().paused_bytes, released);
  EXPECT_EQ(sim::GetUsage().handles, handles_paused);  // the half-made resume is undone
  EXPECT_TRUE(Holds(kv1, 64 * kMiB, 8));  // its view mapped again: still the kept contents
  ASSERT_EQ(sim::cuMemFree_v2(hog), CUDA_SUCCESS);
  ASSERT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), released);
  EXPECT_TRUE(Holds(kv1, 64 * kMiB, 8));
  EXPECT_TRUE(Holds(kv2, 64 * kMiB, 9));
  for (CUdeviceptr p : {kv1, kv2}) ASSERT_TRUE(a.Free(p).ok());
}

// A lost context (a sticky error from an earlier kernel) is named as such by
// the resume and by a pause, whichever driver call meets it first; nothing
// changes state, and once the driver answers again the memory comes back.
TEST_F(PauseTest, LostContextIsNamedByResumeAndPause) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  const CUdeviceptr other = Alloc(a, 8 * kMiB, "other");
  Fill(kv, 8 * kMiB, 4);
  Fill(other, 8 * kMiB, 5);
  const size_t released = *shim.pause().Pause(TagSelection::Only("kv"), true);
  sim::FailCall("cuMemCreate", 1, CUDA_ERROR_ILLEGAL_ADDRESS);
  absl::Status resumed = shim.pause().Resume(TagSelection::Only("kv")).status();
  EXPECT_EQ(ToCuResult(resumed), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(resumed.message().find("vmmshim_resume_memory(tag 'kv'): the CUDA context is lost "
                                   "(CUDA_ERROR_ILLEGAL_ADDRESS"),
            absl::string_view::npos)
      << resumed;
  EXPECT_NE(resumed.message().find("the kept contents cannot be mapped back"),
            absl::string_view::npos);
  EXPECT_EQ(shim.control().GetStats().paused_bytes, released);
  // A pause meets it at the synchronize: nothing is paused.
  sim::FailCall("cuCtxSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  sim::FailCall("cuCtxSynchronize_v2", 1, CUDA_ERROR_LAUNCH_FAILED);
  absl::Status paused = shim.pause().Pause(TagSelection::Only("other"), true).status();
  EXPECT_EQ(ToCuResult(paused), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_NE(paused.message().find("the CUDA context is lost"), absl::string_view::npos) << paused;
  EXPECT_TRUE(Holds(other, 8 * kMiB, 5));
  sim::ClearFailures();
  ASSERT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), released);
  EXPECT_TRUE(Holds(kv, 8 * kMiB, 4));
  for (CUdeviceptr p : {kv, other}) ASSERT_TRUE(a.Free(p).ok());
}

// Resume gives exactly the access the allocation would have had: a peer
// that enabled access while it was paused can read it after.
TEST_F(PauseTest, ResumeGrantsThePeersThatEnabledAccessMeanwhile) {
  AllocatorOptions options;
  options.peer_policy.kind = PeerPolicy::Kind::kMinSize;
  options.peer_policy.min_bytes = 2 * kMiB;
  ShimCore shim(api_, options);
  Allocator& a = shim.allocator();
  const CUdeviceptr big = Alloc(a, 8 * kMiB, "kv");   // the policy allows peers
  const CUdeviceptr tiny = Alloc(a, 4096, "kv2");     // denied by it
  Fill(big, 8 * kMiB, 10);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv2"), true).ok());
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());  // device 1 enables access to device 0 meanwhile
  const uint64_t grants_before = shim.control().GetStats().devices[0].peers[1].grants;
  ASSERT_TRUE(shim.peers().SetPeerAccess(tiny, 1, true).ok());  // and an explicit grant on paused memory
  EXPECT_EQ(shim.control().GetStats().devices[0].peers[1].grants, grants_before + 1);  // counted as any grant
  EXPECT_TRUE(*shim.peers().PeerHasAccess(big, 1));   // the access it will get back
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  std::vector<unsigned char> got(8 * kMiB);
  ASSERT_EQ(sim::DeviceRead(1, got.data(), big, got.size()), CUDA_SUCCESS);
  EXPECT_EQ(got[12345], static_cast<unsigned char>(12345 * 13 + 10));
  char c;
  EXPECT_EQ(sim::DeviceRead(1, &c, tiny, 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.peers().DisablePeer(1, 0).ok());
  for (CUdeviceptr p : {big, tiny}) ASSERT_TRUE(a.Free(p).ok());
}

// Every driver call of a pause and a resume failing once, at each of its
// first calls: the call reports the failure and either nothing is paused
// (contents intact) or everything paused can still be resumed with its
// contents once the driver works again; nothing leaks.
TEST_F(PauseTest, FaultsAnywhereInPauseOrResumeLeaveAConsistentState) {
  std::vector<const char*> entries = PauseDriverCalls();
  entries.push_back("cuCtxPushCurrent_v2");
  CUdeviceptr kv = 0, s = 0;
  const int runs = RunPauseFaults(
      entries, 3, TagSelection::Only("kv"),
      [&](ShimCore& shim) {
        Allocator& a = shim.allocator();
        kv = Alloc(a, 6 * kMiB, "kv");
        s = Alloc(a, 4096, "kv");
        Fill(kv, 6 * kMiB, 11);
        Fill(s, 4096, 12);
      },
      [&](ShimCore& shim, const std::string& what) {
        Allocator& a = shim.allocator();
        EXPECT_TRUE(Holds(kv, 6 * kMiB, 11)) << what;
        EXPECT_TRUE(Holds(s, 4096, 12)) << what;
        EXPECT_TRUE(a.Free(kv).ok()) << what;
        EXPECT_TRUE(a.Free(s).ok()) << what;
      });
  EXPECT_EQ(runs, static_cast<int>(entries.size()) * 3 * 2);
}

// From an adversarial review: each of these failed before its fix.

// A copy that fails on the second device pauses nothing on the first.
TEST_F(PauseTest, CopyFailureOnASecondDevicePausesNothing) {
  ShimCore shim(api_, FaultingPauses());  // copies through the staging ring
  Allocator& a = shim.allocator();
  const CUdeviceptr p0 = Alloc(a, 4 * kMiB, "kv");
  MakeCurrent(1);
  const CUdeviceptr p1 = Alloc(a, 4 * kMiB, "kv");
  MakeCurrent(0);
  Fill(p0, 4 * kMiB, 1);
  sim::FailCall("cuMemcpyDtoH_v2", 2, CUDA_ERROR_UNKNOWN);  // 1: device 0's block, 2: device 1's
  EXPECT_FALSE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  sim::ClearFailures();
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
  EXPECT_TRUE(Holds(p0, 4 * kMiB, 1));
  EXPECT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), 0u);
  for (CUdeviceptr p : {p0, p1}) ASSERT_TRUE(a.Free(p).ok());
}

// Out of memory at resume only after every arena's cache went back.
TEST_F(PauseTest, ResumeReleasesOtherArenasCachesBeforeOutOfMemory) {
  AllocatorOptions options;
  options.arenas = 2;
  options.cache_limit_percent = 100;
  ShimCore shim(api_, options);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 128 * kMiB, "kv");
  Fill(kv, 128 * kMiB, 2);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  int worker_slot = -1;
  std::thread([&] {
    MakeCurrent(0);
    worker_slot = ThreadSlot();
    const CUdeviceptr other = Alloc(a, 160 * kMiB, "");
    ASSERT_TRUE(a.Free(other).ok());  // cached in the other arena
  }).join();
  ASSERT_NE(worker_slot % 2, ThreadSlot() % 2);
  absl::StatusOr<size_t> r = shim.pause().Resume(TagSelection::Only("kv"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Holds(kv, 128 * kMiB, 2));
  ASSERT_TRUE(a.Free(kv).ok());
}

// Two faults in one resume: the undo's own unmap fails; a later resume
// still succeeds with the contents.
TEST_F(PauseTest, ResumeUndoWhoseUnmapFailsStillAllowsALaterResume) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv1 = Alloc(a, 4 * kMiB, "kv"), kv2 = Alloc(a, 4 * kMiB, "kv");
  Fill(kv1, 4 * kMiB, 3);
  Fill(kv2, 4 * kMiB, 4);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  sim::FailCall("cuMemMap", 2, CUDA_ERROR_UNKNOWN);
  sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);  // the undo of the first block
  EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  sim::ClearFailures();
  absl::StatusOr<size_t> r = shim.pause().Resume(TagSelection::Only("kv"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Holds(kv1, 4 * kMiB, 3));
  EXPECT_TRUE(Holds(kv2, 4 * kMiB, 4));
  for (CUdeviceptr p : {kv1, kv2}) ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(PauseTest, ResumeUndoWhoseReleaseFailsLeaksNothing) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const CUdeviceptr kv1 = Alloc(a, 4 * kMiB, "kv"), kv2 = Alloc(a, 4 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), false).ok());
    sim::FailCall("cuMemMap", 2, CUDA_ERROR_UNKNOWN);
    sim::FailCall("cuMemRelease", 2, CUDA_ERROR_UNKNOWN);  // 1: block 2's new handle, 2: undo of 1
    EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    sim::ClearFailures();
    EXPECT_EQ(shim.control().GetStats().handle_bytes, sim::GetUsage().handle_bytes);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    for (CUdeviceptr p : {kv1, kv2}) ASSERT_TRUE(a.Free(p).ok());
    shim.control().Trim();
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  EXPECT_EQ(sim::GetUsage().handles, 0u);
}

// An unmap failure at pause: that block stays live, the error is returned,
// and a resume brings back the rest.
TEST_F(PauseTest, UnmapFailureAtPauseIsReportedAndResumable) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv1 = Alloc(a, 4 * kMiB, "kv"), kv2 = Alloc(a, 4 * kMiB, "kv");
  Fill(kv1, 4 * kMiB, 5);
  Fill(kv2, 4 * kMiB, 6);
  sim::FailCall("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(ToCuResult(shim.pause().Pause(TagSelection::Only("kv"), true).status()), CUDA_ERROR_UNKNOWN);
  sim::ClearFailures();
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 4 * kMiB);  // one paused, one left live
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_TRUE(Holds(kv1, 4 * kMiB, 5));
  EXPECT_TRUE(Holds(kv2, 4 * kMiB, 6));
  for (CUdeviceptr p : {kv1, kv2}) ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(PauseTest, PauseDuringACaptureIsRefusedWithoutInvalidatingIt) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  ASSERT_EQ(shim.captures().BeginCapture(kStream, false, [&] {
    return sim::cuStreamBeginCapture_v2(kStream, CU_STREAM_CAPTURE_MODE_RELAXED);
  }), CUDA_SUCCESS);
  EXPECT_EQ(ToCuResult(shim.pause().Pause(TagSelection::Only("kv"), true).status()),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(ToCuResult(shim.pause().Resume(TagSelection::Only("kv")).status()), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph g = nullptr;
  EXPECT_EQ(sim::cuStreamEndCapture(kStream, &g), CUDA_SUCCESS);
  a.CaptureEnded(kStream, false);
  ASSERT_TRUE(a.Free(kv).ok());
}

// A release that failed at pause is not counted as released, and the
// resume retries it.
TEST_F(PauseTest, ResumeRetriesAHandleWhoseReleaseFailedAtPause) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 200 * kMiB, "kv");
  const size_t free_before = FreeMemory();
  sim::FailCall("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
  absl::StatusOr<size_t> released = shim.pause().Pause(TagSelection::Only("kv"), false);
  sim::ClearFailures();
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(FreeMemory(), free_before + *released);
  EXPECT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_TRUE(a.Free(kv).ok());
}

TEST_F(PauseTest, ReleaseContextOfPausedMemoryReleasesNoPhysicalBytes) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Alloc(a, 8 * kMiB, "kv");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), false).ok());
  CUcontext ctx = nullptr;
  ASSERT_EQ(sim::cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  EXPECT_EQ(a.ReleaseContext(ctx, false), 0u);
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
}

TEST(HostBackupTest, MoreThanTheHostHasIsOutOfMemoryNamingHostMemory) {
  absl::StatusOr<HostBackup> b = HostBackup::Create(size_t{1} << 62);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(ToCuResult(b.status()), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(b.status().message().find("host memory for the backup"), std::string::npos)
      << b.status();
  absl::StatusOr<HostBackup> small = HostBackup::Create(4096);
  ASSERT_TRUE(small.ok());
  small->data()[4095] = 1;
  HostBackup moved = *std::move(small);
  EXPECT_EQ(moved.size(), 4096u);
  EXPECT_EQ(moved.data()[4095], 1);
}

}  // namespace
}  // namespace vmmshim
