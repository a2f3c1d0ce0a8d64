// Paused memory stays addressable (core/heap/host_mapped_pool.h,
// docs/pause-resume.md, "Touching paused memory") on the simulated driver:
// the kept contents mapped at the paused address in host VMM memory, writes
// made while paused kept by the resume, scratch memory over dropped
// contents, peers' access, the host memory kept for the next pause and its
// limits, and VMMSHIM_PAUSED_ACCESS=fault.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/base/host_memory.h"
#include "core/driver/cu_status.h"
#include "core/foreign/foreign_vmm.h"
#include "core/report/residency.h"
#include "core/shim_core.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/sim/sim_driver.h"
#include "tests/unit/in_child.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class AddressablePauseTest : public SimTest {
 protected:
  void SetUp() override { Start(sim::SimOptions()); }
  void Start(sim::SimOptions o) {
    o.device_count = 2;
    o.memory_per_device = 256 * kMiB;
    sim::Reset(o);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    api_ = sim::Api();
    MakeCurrent(0);
  }
  CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  // Two blocks of `size` tagged "kv", filled with seeds 1 and 2.
  struct TwoBlocks {
    CUdeviceptr first = 0, second = 0;
    size_t size = 0;
  };
  TwoBlocks AllocTwoFilled(Allocator& a, size_t size) {
    TwoBlocks t{Alloc(a, size, "kv"), Alloc(a, size, "kv"), size};
    Fill(t.first, size, 1);
    Fill(t.second, size, 2);
    return t;
  }
  static bool HoldsBoth(const TwoBlocks& t) {
    return Holds(t.first, t.size, 1) && Holds(t.second, t.size, 2);
  }
  static void FreeBoth(Allocator& a, const TwoBlocks& t) {
    for (CUdeviceptr p : {t.first, t.second}) ASSERT_TRUE(a.Free(p).ok());
  }
  static HostMappedPool::Stats PoolStats(ShimCore& shim, int device) {
    for (HostMappedPool* p : shim.pause().host_pools()) {
      if (p->device() == device) return p->stats();
    }
    return HostMappedPool::Stats();
  }
  // The residency report's paused bytes of `tag` on device 0 whose address
  // maps nothing now (TagResidency::paused_faulting_bytes).
  static uint64_t FaultingBytes(ShimCore& shim, const std::string& tag) {
    const nlohmann::json r = nlohmann::json::parse(ResidencyJson(shim.control(), nullptr));
    const nlohmann::json& by_tag = r.at("devices").at(0).at("shim").at("by_tag");
    return by_tag.at(tag).at("paused_faulting_bytes").get<uint64_t>();
  }
  // Another library's handle of `size` tagged `tag`, mapped read-write for
  // device 0 in a reservation of its own at *va (as PyTorch's expandable
  // segments or NCCL map theirs, through the shim's hooks).
  static CUmemGenericAllocationHandle MapForeignHandle(ShimCore& shim, const DriverApi& api,
                                                       CUdeviceptr* va, size_t size,
                                                       const char* tag) {
    EXPECT_EQ(api.cuMemAddressReserve(va, size, 0, 0, 0), CUDA_SUCCESS);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemGenericAllocationHandle h = 0;
    EXPECT_EQ(shim.foreign().Create(&h, size, &prop, 0, tag), CUDA_SUCCESS);
    EXPECT_EQ(shim.foreign().Map(*va, size, 0, h, 0), CUDA_SUCCESS);
    CUmemAccessDesc desc = {};
    desc.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_EQ(shim.foreign().SetAccess(*va, size, &desc, 1), CUDA_SUCCESS);
    return h;
  }
  // VMMSHIM_HOST_POOL_MAX and VMMSHIM_HOST_POOL_MAKE.
  static AllocatorOptions PoolCappedAt(size_t max_bytes, bool background) {
    AllocatorOptions o;
    o.host_pool_max_bytes = max_bytes;
    o.host_memory_in_background = background;
    return o;
  }
  // VMMSHIM_HOST_POOL_MAKE=background.
  static AllocatorOptions MadeInTheBackground() {
    AllocatorOptions o;
    o.host_memory_in_background = true;
    return o;
  }
  // Pauses `tag` with contents while the pool's maker is held at its
  // cuMemCreate; returns with it held (sim::ReleaseHeldCalls lets it go).
  static void PauseWithTheMakerHeld(ShimCore& shim, const std::string& tag) {
    sim::HoldCalls("cuMemCreate");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only(tag), true).ok());
    ASSERT_TRUE(sim::WaitForHeldCall(5000));
  }
  // VMMSHIM_HOST_POOL_IDLE.
  static AllocatorOptions PoolIdleAfter(double seconds) {
    AllocatorOptions o;
    o.host_pool_idle_seconds = seconds;
    return o;
  }
  // Until device 0's pool has made what was queued in the background (at
  // most 10 s).
  static void AwaitNothingQueued(ShimCore& shim) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (PoolStats(shim, 0).queued_bytes > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Until `p` reads (a view is mapped there: Note [Views made late]), at
  // most 5 s; whether it does.
  static bool AwaitReadable(CUdeviceptr p) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    char c;
    while (sim::DeviceRead(0, &c, p, 1) != CUDA_SUCCESS) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
};

TEST_F(AddressablePauseTest, AKernelReadsAndWritesKeptContentsWhilePausedAndTheResumeKeepsTheWrites) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const CUdeviceptr big = Alloc(a, 16 * kMiB, "kv");
    const CUdeviceptr small = Alloc(a, 4096, "kv");  // in a packed granule
    Fill(big, 16 * kMiB, 1);
    Fill(small, 4096, 2);
    const size_t free_before = FreeMemory();
    absl::StatusOr<size_t> released = shim.pause().Pause(TagSelection::Only("kv"), true);
    ASSERT_TRUE(released.ok()) << released.status();
    // The device memory went back to the driver; the host holds the contents.
    EXPECT_EQ(FreeMemory(), free_before + *released);
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    EXPECT_EQ(sim::GetUsage().host_handle_bytes, *released);
    EXPECT_TRUE(Holds(big, 16 * kMiB, 1));
    EXPECT_TRUE(Holds(small, 4096, 2));
    // A kernel writes paused memory: the write lands in the kept contents...
    Fill(big + 4 * kMiB, 2 * kMiB, 7);
    Fill(small, 4096, 8);
    // ...which the CPU reads too (torch_memory_saver's get_cpu_backup).
    absl::StatusOr<const void*> host = shim.control().PausedContents(small, 4096);
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(static_cast<const unsigned char*>(*host)[100], static_cast<unsigned char>(100 * 13 + 8));
    // ...and is there after the resume, in device memory again.
    ASSERT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), *released);
    EXPECT_EQ(sim::GetUsage().handles, 2u);
    EXPECT_TRUE(Holds(big, 4 * kMiB, 1));
    EXPECT_TRUE(Holds(big + 4 * kMiB, 2 * kMiB, 7));
    EXPECT_TRUE(Holds(small, 4096, 8));
    for (CUdeviceptr p : {big, small}) ASSERT_TRUE(a.Free(p).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

TEST_F(AddressablePauseTest, DroppedContentsMapScratchThatNeverFaultsAndHoldsNoDeviceMemory) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const size_t size = 64 * kMiB + 6 * kMiB;
  const CUdeviceptr kv = Alloc(a, size, "kv");
  Fill(kv, size, 3);
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), /*keep_contents=*/false).ok());
  EXPECT_EQ(sim::GetUsage().handles, 0u);
  // The large scratch handle over 64 MiB and one granule thrice over the
  // rest stand for all of it: 66 MiB of host memory, four mappings (and
  // each new handle's own, HostMappedMemory::Create).
  EXPECT_EQ(sim::CallCount("cuMemMap"), 4u + 2u);
  EXPECT_EQ(sim::GetUsage().host_handle_bytes, 66 * kMiB);
  EXPECT_EQ(PoolStats(shim, 0).scratch_bytes, 66 * kMiB);
  std::vector<unsigned char> v(size);
  EXPECT_EQ(sim::DeviceWrite(0, kv, v.data(), v.size()), CUDA_SUCCESS);
  EXPECT_EQ(sim::DeviceRead(0, v.data(), kv, v.size()), CUDA_SUCCESS);
  EXPECT_EQ(ToCuResult(shim.control().PausedContents(kv, 16).status()), CUDA_ERROR_NOT_FOUND);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  Fill(kv, size, 4);  // device memory again, its own
  EXPECT_TRUE(Holds(kv, size, 4));
  // The scratch is kept: the next pause maps it alone.
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), /*keep_contents=*/false).ok());
  EXPECT_EQ(sim::CallCount("cuMemMap"), 4u);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_TRUE(a.Free(kv).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectNothingLeft();
}

TEST_F(AddressablePauseTest, PeersThatHadAccessKeepItToTheHostMemory) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());  // device 1 reaches device 0's memory
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  Fill(kv, 8 * kMiB, 5);
  std::vector<unsigned char> got(8 * kMiB);
  ASSERT_EQ(sim::DeviceRead(1, got.data(), kv, got.size()), CUDA_SUCCESS);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  // The peer reads the kept contents in host memory, as the owner does.
  ASSERT_EQ(sim::DeviceRead(1, got.data(), kv, got.size()), CUDA_SUCCESS);
  EXPECT_EQ(got[4321], static_cast<unsigned char>(4321 * 13 + 5));
  EXPECT_TRUE(Holds(kv, 8 * kMiB, 5));
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_EQ(sim::DeviceRead(1, got.data(), kv, got.size()), CUDA_SUCCESS);
  ASSERT_TRUE(shim.peers().DisablePeer(1, 0).ok());
  ASSERT_TRUE(a.Free(kv).ok());
}

TEST_F(AddressablePauseTest, TheSecondPauseTakesTheHostMemoryTheFirstMade) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 32 * kMiB, "kv");
  const CUdeviceptr w = Alloc(a, 6 * kMiB, "kv");
  Fill(kv, 32 * kMiB, 6);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  HostMappedPool::Stats s = PoolStats(shim, 0);
  EXPECT_EQ(s.made_bytes, 38 * kMiB);
  EXPECT_EQ(s.kept_bytes, 38 * kMiB);  // sized to what was paused last
  EXPECT_EQ(s.in_use_bytes, 0u);
  sim::ResetCallCounts();
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_EQ(PoolStats(shim, 0).in_use_bytes, 38 * kMiB);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv, 32 * kMiB, 6));
  }
  s = PoolStats(shim, 0);
  EXPECT_EQ(s.made_bytes, 38 * kMiB);  // nothing made after the first pause
  EXPECT_EQ(s.reused_bytes, 3 * 38 * kMiB);
  // The residency report shows it (vmmshim.residency()).
  const nlohmann::json r = nlohmann::json::parse(ResidencyJson(shim.control(), nullptr));
  const nlohmann::json& host = r.at("host_memory_for_pauses").at(0);
  EXPECT_EQ(host.at("device").get<int>(), 0);
  EXPECT_EQ(host.at("kept_bytes").get<size_t>(), 38 * kMiB);
  EXPECT_EQ(host.at("made_bytes").get<size_t>(), 38 * kMiB);
  EXPECT_EQ(host.at("sized_by").get<std::string>(), "what the process paused last");
  // Only the device memory of the resumes: no host memory made or reserved.
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 3 * 2u);
  EXPECT_EQ(sim::CallCount("cuMemAddressReserve"), 0u);
  for (CUdeviceptr p : {kv, w}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectNothingLeft();
}

// VMMSHIM_HOST_POOL_MAX: contents past it are kept as fault keeps them, in
// the pause's path and in the background alike, and the report names it.
TEST_F(AddressablePauseTest, TheHostPoolHoldsNoMoreThanItsMax) {
  for (bool background : {false, true}) {
    SCOPED_TRACE(background ? "made in the background" : "made by the pause");
    ShimCore shim(api_, PoolCappedAt(10 * kMiB, background));
    Allocator& a = shim.allocator();
    const TwoBlocks kv = AllocTwoFilled(a, 8 * kMiB);
    for (int cycle = 0; cycle < 2; ++cycle) {
      ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
      const HostMappedPool::Stats s = PoolStats(shim, 0);
      EXPECT_LE(s.in_use_bytes + s.kept_bytes + s.queued_bytes, 10 * kMiB);
      // One of the two is addressable (at once when the pause makes its
      // memory; a moment later when the background does), never both.
      std::vector<unsigned char> got(16);
      auto readable = [&] {
        return (sim::DeviceRead(0, got.data(), kv.first, 16) == CUDA_SUCCESS) +
               (sim::DeviceRead(0, got.data(), kv.second, 16) == CUDA_SUCCESS);
      };
      if (background && cycle == 0) {
        // Made in the background, then mapped late (Note [Views made late]).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (readable() == 0 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      EXPECT_EQ(readable(), 1);
      ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
      EXPECT_TRUE(HoldsBoth(kv));
      AwaitNothingQueued(shim);
    }
    EXPECT_EQ(PoolStats(shim, 0).kept_bytes, 8 * kMiB);
    const nlohmann::json r = nlohmann::json::parse(ResidencyJson(shim.control(), nullptr));
    EXPECT_EQ(r.at("host_memory_for_pauses").at(0).at("sized_by").get<std::string>(),
              "cut by VMMSHIM_HOST_POOL_MAX (10485760 bytes)");
    FreeBoth(a, kv);
    ASSERT_TRUE(shim.ReleaseAll().ok());
    ExpectNothingLeft();
  }
}

// In the background, kept memory of another set gives way to the set paused
// last, by the maker, off the pause's path: the pause itself releases none.
TEST_F(AddressablePauseTest, InTheBackgroundTheMakerGivesWayToTheSetPausedLast) {
  ShimCore shim(api_, PoolCappedAt(10 * kMiB, /*background=*/true));
  Allocator& a = shim.allocator();
  const CUdeviceptr first = Alloc(a, 8 * kMiB, "a");
  const CUdeviceptr second = Alloc(a, 6 * kMiB, "b");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("a"), true).ok());
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("a")).ok());
  AwaitNothingQueued(shim);
  ASSERT_EQ(PoolStats(shim, 0).kept_bytes, 8 * kMiB);
  sim::HoldCalls("cuMemCreate");  // the maker waits: the pause alone is seen
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("b"), true).ok());
  EXPECT_EQ(PoolStats(shim, 0).queued_bytes, 6 * kMiB);
  ASSERT_TRUE(sim::WaitForHeldCall(5000));  // set a's memory given way, b's being made
  EXPECT_EQ(PoolStats(shim, 0).kept_bytes, 0u);
  sim::ReleaseHeldCalls();
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("b")).ok());
  AwaitNothingQueued(shim);
  const HostMappedPool::Stats s = PoolStats(shim, 0);
  EXPECT_EQ(s.kept_bytes, 6 * kMiB);
  EXPECT_EQ(s.trimmed_bytes, 8 * kMiB);
  EXPECT_NE(s.limited_by.find("VMMSHIM_HOST_POOL_MAX"), std::string::npos) << s.limited_by;
  for (CUdeviceptr p : {first, second}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectNothingLeft();
}

// Release (the deep sleep's checkpoint, the exit) returns only when a
// release another thread began is done: no host memory is left behind it.
TEST_F(AddressablePauseTest, ReleaseWaitsForTheIdleTrimUnderWay) {
  ShimCore shim(api_, PoolIdleAfter(0.05));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  sim::HoldCalls("cuMemRelease");
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_TRUE(sim::WaitForHeldCall(5000));  // the idle trimmer releases the 8 MiB
  std::atomic<bool> done{false};
  std::thread releaser([&] {
    shim.pause().ReleaseHostMemory();
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load());
  sim::ReleaseHeldCalls();
  releaser.join();
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  ASSERT_TRUE(a.Free(kv).ok());
}

TEST_F(AddressablePauseTest, UnusedHostMemoryIsReleasedAfterTheIdleTime) {
  ShimCore shim(api_, PoolIdleAfter(0.05));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_GT(sim::GetUsage().host_handles, 0u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (PoolStats(shim, 0).kept_bytes > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(PoolStats(shim, 0).kept_bytes, 0u);
  EXPECT_EQ(PoolStats(shim, 0).trimmed_bytes, 8 * kMiB);
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  // The next pause makes it again.
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  EXPECT_EQ(PoolStats(shim, 0).made_bytes, 16 * kMiB);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_TRUE(a.Free(kv).ok());
}

TEST_F(AddressablePauseTest, HostMemoryTheDriverRefusesLeavesThoseBlocksKeptButFaulting) {
  sim::SimOptions o;
  o.host_memory = 24 * kMiB;  // room for one of the two
  Start(o);
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const TwoBlocks kv = AllocTwoFilled(a, 20 * kMiB);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  const int readable = Holds(kv.first, kv.size, 1) + Holds(kv.second, kv.size, 2);
  EXPECT_EQ(readable, 1);  // one in host VMM memory, the other kept elsewhere
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_TRUE(HoldsBoth(kv));
  FreeBoth(a, kv);
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectNothingLeft();
}

TEST_F(AddressablePauseTest, WithoutHostVmmMemoryAPauseWorksAsBeforeAndFaults) {
  sim::SimOptions o;
  o.host_numa_vmm = false;
  Start(o);
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  const CUdeviceptr dropped = Alloc(a, 8 * kMiB, "tmp");
  Fill(kv, 8 * kMiB, 9);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("tmp"), false).ok());
  char c;
  EXPECT_NE(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);
  EXPECT_NE(sim::DeviceRead(0, &c, dropped, 1), CUDA_SUCCESS);
  EXPECT_TRUE(shim.pause().host_pools().empty());
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 8 * kMiB, 9));
  for (CUdeviceptr p : {kv, dropped}) ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(AddressablePauseTest, PausedAccessFaultMapsNothing) {
  ShimCore shim(api_, FaultingPauses());
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  const CUdeviceptr dropped = Alloc(a, 8 * kMiB, "tmp");
  Fill(kv, 8 * kMiB, 9);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("tmp"), false).ok());
  char c;
  EXPECT_NE(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);
  EXPECT_NE(sim::DeviceRead(0, &c, dropped, 1), CUDA_SUCCESS);
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 8 * kMiB, 9));
  for (CUdeviceptr p : {kv, dropped}) ASSERT_TRUE(a.Free(p).ok());
}

// cudaFree of paused memory unmaps its host view; the host memory goes back
// to the pool (kept for the next pause), the scratch stays the pool's.
TEST_F(AddressablePauseTest, FreeingPausedMemoryUnmapsItsView) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const CUdeviceptr kept = Alloc(a, 8 * kMiB, "kv");
    const CUdeviceptr dropped = Alloc(a, 8 * kMiB, "tmp");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("tmp"), false).ok());
    ASSERT_TRUE(a.Free(kept).ok());
    ASSERT_TRUE(a.Free(dropped).ok());
    char c;
    EXPECT_NE(sim::DeviceRead(0, &c, kept, 1), CUDA_SUCCESS);  // freed: nothing there
    EXPECT_NE(sim::DeviceRead(0, &c, dropped, 1), CUDA_SUCCESS);
    EXPECT_EQ(PoolStats(shim, 0).kept_bytes, 8 * kMiB);
    EXPECT_EQ(PoolStats(shim, 0).in_use_bytes, 0u);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// A resume that fails after taking some views away maps them again: the
// memory stays paused and addressable, and a later resume succeeds.
TEST_F(AddressablePauseTest, AFailedResumeMapsTheViewsAgain) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr first = Alloc(a, 8 * kMiB, "kv");
  const CUdeviceptr second = Alloc(a, 8 * kMiB, "kv");
  const CUdeviceptr dropped = Alloc(a, 8 * kMiB, "kv");
  Fill(first, 8 * kMiB, 1);
  Fill(second, 8 * kMiB, 2);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  Fill(second, 8 * kMiB, 3);  // written while paused
  // The second block's device mapping fails: the first is undone.
  sim::FailCall("cuMemMap", 2, CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  sim::ClearFailures();
  EXPECT_TRUE(Holds(first, 8 * kMiB, 1));
  EXPECT_TRUE(Holds(second, 8 * kMiB, 3));
  char c;
  EXPECT_EQ(sim::DeviceRead(0, &c, dropped, 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_TRUE(Holds(first, 8 * kMiB, 1));
  EXPECT_TRUE(Holds(second, 8 * kMiB, 3));
  for (CUdeviceptr p : {first, second, dropped}) ASSERT_TRUE(a.Free(p).ok());
}

// VMMSHIM_HOST_POOL_MAKE=background: a pause makes no host memory on its
// path; what it lacks is kept as fault mode keeps it (an access faults)
// while the pool makes host memory for it in the background, and the next
// pause of the same set takes that memory and stays addressable.
TEST_F(AddressablePauseTest, HostMemoryMadeInTheBackgroundServesTheNextPause) {
  {
    ShimCore shim(api_, MadeInTheBackground());
    Allocator& a = shim.allocator();
    const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
    Fill(kv, 8 * kMiB, 1);
    PauseWithTheMakerHeld(shim, "kv");  // the pause alone is seen
    char c;
    EXPECT_NE(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);  // no view yet
    EXPECT_EQ(FaultingBytes(shim, "kv"), 8 * kMiB);           // and the report says so
    EXPECT_EQ(PoolStats(shim, 0).made_bytes, 0u);             // nothing made on the path
    sim::ReleaseHeldCalls();
    // Note [Views made late]: once made, the contents move there and map.
    ASSERT_TRUE(AwaitReadable(kv));
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 1));
    EXPECT_EQ(FaultingBytes(shim, "kv"), 0u);
    EXPECT_EQ(PoolStats(shim, 0).in_use_bytes, 8 * kMiB);
    EXPECT_EQ(PoolStats(shim, 0).background_bytes, 8 * kMiB);
    EXPECT_EQ(PoolStats(shim, 0).queued_bytes, 0u);
    Fill(kv, 8 * kMiB, 5);  // written while paused, through the late view
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 5));
    Fill(kv, 8 * kMiB, 2);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 2));  // through its view at once now
    EXPECT_EQ(PoolStats(shim, 0).reused_bytes, 2 * 8 * kMiB);  // the late view's, this pause's
    EXPECT_EQ(PoolStats(shim, 0).made_bytes, 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 2));
    ASSERT_TRUE(a.Free(kv).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// Note [A pause's memories share the queue] (core/heap/host_mapped_pool.h):
// the shim's block and another library's handle, both of 8 MiB, pause
// together under the background maker; each gets host memory of its own
// and a late view, none waits for memory that is never made.
TEST_F(AddressablePauseTest, TwoMemoriesOfOnePauseEachGetTheirHostMemoryMadeLate) {
  {
    ShimCore shim(api_, MadeInTheBackground());
    Allocator& a = shim.allocator();
    const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
    CUdeviceptr other = 0;
    const CUmemGenericAllocationHandle handle =
        MapForeignHandle(shim, api_, &other, 8 * kMiB, "kv");
    Fill(kv, 8 * kMiB, 1);
    Fill(other, 8 * kMiB, 2);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    ASSERT_TRUE(AwaitReadable(kv));
    ASSERT_TRUE(AwaitReadable(other));
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 1));
    EXPECT_TRUE(Holds(other, 8 * kMiB, 2));
    EXPECT_EQ(PoolStats(shim, 0).background_bytes, 2 * 8 * kMiB);
    EXPECT_EQ(PoolStats(shim, 0).queued_bytes, 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 1));
    EXPECT_TRUE(Holds(other, 8 * kMiB, 2));
    // The next pause, before anything more is made, finds both kept.
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 1));
    EXPECT_TRUE(Holds(other, 8 * kMiB, 2));
    EXPECT_EQ(PoolStats(shim, 0).queued_bytes, 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    ASSERT_EQ(shim.foreign().Unmap(other, 8 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(shim.foreign().Release(handle), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAddressFree(other, 8 * kMiB), CUDA_SUCCESS);
    ASSERT_TRUE(a.Free(kv).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// Note [Views made late]: contents whose address the program was given
// (vmmshim_get_paused_contents, torch_memory_saver's get_cpu_backup) stay
// where they are: no late view moves them, and the address keeps them.
TEST_F(AddressablePauseTest, ContentsTheProgramHoldsAnAddressOfAreNotMovedLate) {
  {
    ShimCore shim(api_, MadeInTheBackground());
    Allocator& a = shim.allocator();
    const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
    Fill(kv, 8 * kMiB, 1);
    PauseWithTheMakerHeld(shim, "kv");
    absl::StatusOr<const void*> host = shim.control().PausedContents(kv, 4096);
    ASSERT_TRUE(host.ok()) << host.status();
    const unsigned char before = static_cast<const unsigned char*>(*host)[100];
    sim::ReleaseHeldCalls();
    HostMappedPool& pool = *shim.pause().host_pools()[0];
    ASSERT_TRUE(pool.AwaitMade(absl::Seconds(5)));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the thread's pass
    char c;
    EXPECT_NE(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);  // no view: not moved
    EXPECT_EQ(FaultingBytes(shim, "kv"), 8 * kMiB);
    EXPECT_EQ(pool.stats().kept_bytes, 8 * kMiB);           // made, left for the next pause
    EXPECT_EQ(static_cast<const unsigned char*>(*host)[100], before);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 1));
    ASSERT_TRUE(a.Free(kv).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// Note [The maker keeps quiet] (core/heap/host_mapped_pool.h): while the
// pools are quiet (a pause or resume runs), what is queued waits; it is
// made after.
TEST_F(AddressablePauseTest, TheMakerKeepsQuietWhileAPauseOrResumeRuns) {
  {
    ShimCore shim(api_, MadeInTheBackground());
    Allocator& a = shim.allocator();
    const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());  // makes the pool
    ASSERT_EQ(shim.pause().host_pools().size(), 1u);
    HostMappedPool& pool = *shim.pause().host_pools()[0];
    ASSERT_TRUE(pool.AwaitMade(absl::Seconds(5)));
    pool.SetQuiet(true);
    std::vector<absl::StatusOr<HostMappedMemory>> taken = pool.Take({6 * kMiB});
    EXPECT_TRUE(absl::IsUnavailable(taken[0].status())) << taken[0].status();
    EXPECT_FALSE(pool.AwaitMade(absl::Milliseconds(50)));
    EXPECT_EQ(pool.stats().queued_bytes, 6 * kMiB);
    pool.SetQuiet(false);
    ASSERT_TRUE(pool.AwaitMade(absl::Seconds(5)));
    absl::StatusOr<HostMappedMemory> made = pool.TakeKept(6 * kMiB);
    ASSERT_TRUE(made.ok()) << made.status();
    pool.Give(*std::move(made));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    ASSERT_TRUE(a.Free(kv).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// Host memory being made in the background when a deep sleep releases the
// pools' memory for the driver's checkpoint: the release waits for it and
// releases it too, and nothing queued is made afterwards (Note [The
// driver's checkpoint and host VMM memory]).
TEST_F(AddressablePauseTest, TheCheckpointsReleaseWaitsForHostMemoryBeingMade) {
  {
    ShimCore shim(api_, MadeInTheBackground());
    Allocator& a = shim.allocator();
    const CUdeviceptr first = Alloc(a, 8 * kMiB, "kv");
    const CUdeviceptr second = Alloc(a, 4 * kMiB, "kv");
    Fill(first, 8 * kMiB, 1);
    sim::HoldCalls("cuMemCreate");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    ASSERT_TRUE(sim::WaitForHeldCall(5000));  // the pool's thread is making one
    std::atomic<bool> done{false};
    absl::StatusOr<size_t> released;
    std::thread releaser([&] {
      released = shim.pause().ReleaseHostMemoryForCheckpoint();
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(done.load());
    sim::ReleaseHeldCalls();
    releaser.join();
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_EQ(sim::GetUsage().host_handles, 0u);
    EXPECT_EQ(PoolStats(shim, 0).queued_bytes, 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(sim::GetUsage().host_handles, 0u);  // nothing made after
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(first, 8 * kMiB, 1));
    for (CUdeviceptr p : {first, second}) ASSERT_TRUE(a.Free(p).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// A resume starts each block's copy back as soon as its device memory is
// mapped, so that the copy engine runs while the next block is made, its
// view unmapped and its memory mapped (on an H100 unmapping the views alone
// took 45 ms of a 16 GiB resume: docs/pause-resume.md, "What host costs"):
// when the second block's mapping fails, the first block's copy has started,
// and is waited for before the undo unmaps its memory.
TEST_F(AddressablePauseTest, AResumeCopiesEachBlockBackAsSoonAsItIsMapped) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const TwoBlocks kv = AllocTwoFilled(a, 8 * kMiB);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  sim::ResetCallCounts();
  sim::FailCall("cuMemMap", 2, CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  sim::ClearFailures();
  EXPECT_EQ(sim::CallCount("cuMemcpyDtoDAsync_v2"), 1u);  // the first block's, started
  EXPECT_TRUE(Holds(kv.first, kv.size, 1));  // its view again
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_TRUE(HoldsBoth(kv));
  FreeBoth(a, kv);
}

// Note [A pause's memory goes as its copy completes] (core/heap/
// pausable_memory.h): each block waits for its own copy and goes before the
// next one's wait, so when the copy engine reports the second block's copy
// failed, the first is paused already (its device memory released, its
// contents addressable) and the second stays live and whole.
TEST_F(AddressablePauseTest, APausesBlocksGoOneByOneAsTheirCopiesComplete) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const TwoBlocks kv = AllocTwoFilled(a, 8 * kMiB);
    sim::ResetCallCounts();
    sim::FailCall("cuEventSynchronize", 2, CUDA_ERROR_UNKNOWN);
    absl::StatusOr<size_t> paused = shim.pause().Pause(TagSelection::Only("kv"), true);
    sim::ClearFailures();
    EXPECT_EQ(ToCuResult(paused.status()), CUDA_ERROR_UNKNOWN);
    EXPECT_EQ(sim::CallCount("cuEventSynchronize"), 2u);
    EXPECT_EQ(sim::GetUsage().handles, 1u);  // the second's, live
    EXPECT_EQ(PoolStats(shim, 0).in_use_bytes, 8 * kMiB);  // the first's contents
    EXPECT_EQ(PoolStats(shim, 0).kept_bytes, 8 * kMiB);    // the second's, given back
    EXPECT_TRUE(HoldsBoth(kv));  // the first through its view, the second in device memory
    // The second is live: a pause takes it now, and a resume brings both.
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(HoldsBoth(kv));
    FreeBoth(a, kv);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// A driver without events (or one that refuses them): each block's wait
// is for the copier's whole stream, and the pause is as whole.
TEST_F(AddressablePauseTest, WithoutEventsEachBlockWaitsForTheCopiesStream) {
  DriverApi no_events = api_;
  no_events.cuEventCreate = nullptr;
  ShimCore shim(no_events);
  Allocator& a = shim.allocator();
  const TwoBlocks kv = AllocTwoFilled(a, 8 * kMiB);
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  EXPECT_EQ(sim::CallCount("cuEventSynchronize"), 0u);
  EXPECT_EQ(sim::CallCount("cuStreamSynchronize"), 3u);  // each block's wait, then Finish
  EXPECT_EQ(sim::GetUsage().handles, 0u);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_TRUE(HoldsBoth(kv));
  FreeBoth(a, kv);
}

// A view whose unmap fails midway: the free fails and the block stays
// paused; the next free unmaps from where the first stopped (the pieces
// already unmapped are not unmapped again). The whole-range unmap fails,
// then the second piece's (the simulated driver counts the second failure
// from the call after the first): [0, piece) is unmapped, `still_mapped`
// offsets are not, until the next free. `handles`: the scratch handles the
// range maps, each left with its own range alone.
void ExpectAFailedViewUnmapFinishedByTheNextFree(const DriverApi& api, size_t size,
                                                 std::vector<size_t> still_mapped,
                                                 size_t handles) {
  ShimCore shim(api);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> r = a.Allocate(size, "tmp");
  ASSERT_TRUE(r.ok() && r->served) << r.status();
  const CUdeviceptr dropped = r->ptr;
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("tmp"), false).ok());
  sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  sim::FailCall("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(a.Free(dropped).ok());
  sim::ClearFailures();
  char c;
  EXPECT_NE(sim::DeviceRead(0, &c, dropped, 1), CUDA_SUCCESS);  // unmapped
  for (size_t at : still_mapped) {
    EXPECT_EQ(sim::DeviceRead(0, &c, dropped + at, 1), CUDA_SUCCESS) << at;
  }
  ASSERT_TRUE(a.Free(dropped).ok());
  for (size_t at = 0; at < size; at += 2 * kMiB) {
    EXPECT_NE(sim::DeviceRead(0, &c, dropped + at, 1), CUDA_SUCCESS) << at;
  }
  EXPECT_EQ(sim::GetUsage().mappings, handles);
}

TEST_F(AddressablePauseTest, AFreeWhoseViewUnmapFailsMidwayFinishesItNextTime) {
  // Four 2 MiB scratch mappings.
  ExpectAFailedViewUnmapFinishedByTheNextFree(api_, 8 * kMiB, {2 * kMiB}, 1);
}

// The same over the large scratch handle and the granule after it (2 x 64
// MiB, 2 x 2 MiB): the retry starts inside the large part and finishes the
// granules.
TEST_F(AddressablePauseTest, AViewOverBothScratchHandlesFinishesAFailedUnmapNextTime) {
  ExpectAFailedViewUnmapFinishedByTheNextFree(api_, 132 * kMiB, {64 * kMiB, 130 * kMiB}, 2);
}

// A paused block whose context goes while its view will not unmap: the
// view keeps its host memory, which no other pause is handed while it is
// still mapped there; a later trim unmaps it and the pool keeps it.
TEST_F(AddressablePauseTest, HostMemoryStillMappedAtAViewIsNeverHandedToAnotherPause) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const CUcontext ctx = MakeCurrent(0);
    const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
    Fill(kv, 8 * kMiB, 1);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
    a.ReleaseContext(ctx, /*synchronize=*/true);
    sim::ClearFailures();
    EXPECT_EQ(PoolStats(shim, 0).kept_bytes, 0u);
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 1));  // still mapped at the old address
    const CUdeviceptr other = Alloc(a, 8 * kMiB, "other");
    Fill(other, 8 * kMiB, 2);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("other"), true).ok());
    EXPECT_EQ(sim::GetUsage().host_handle_bytes, 16 * kMiB);  // made, not taken from kv's
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 1));
    EXPECT_TRUE(Holds(other, 8 * kMiB, 2));
    shim.control().Trim();
    char c;
    EXPECT_NE(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);
    EXPECT_EQ(PoolStats(shim, 0).kept_bytes, 8 * kMiB);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("other")).ok());
    EXPECT_TRUE(Holds(other, 8 * kMiB, 2));
    ASSERT_TRUE(a.Free(other).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// Other libraries' paused memory keeps its contents in host memory of the
// pools the pause coordinator owns, mapped at the library's range: a
// teardown without a resume unmaps that view and gives the memory back
// before the pools go.
TEST_F(AddressablePauseTest, TeardownWithOtherLibrariesMemoryPausedLeavesNoHostMemory) {
  CUdeviceptr va = 0;
  {
    ShimCore shim(api_);
    MapForeignHandle(shim, api_, &va, 8 * kMiB, "nccl");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("nccl"), true).ok());
    EXPECT_EQ(sim::GetUsage().host_handle_bytes, 8 * kMiB);
  }
  EXPECT_EQ(sim::GetUsage().handles, 0u);
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  EXPECT_EQ(sim::GetUsage().mappings, 0u);
  EXPECT_EQ(api_.cuMemAddressFree(va, 8 * kMiB), CUDA_SUCCESS);
}

// An explicit revoke while paused reaches the host memory mapped there at
// once; a grant does too.
TEST_F(AddressablePauseTest, PeerAccessChangedWhilePausedReachesTheView) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  char c;
  ASSERT_EQ(sim::DeviceRead(1, &c, kv, 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.peers().SetPeerAccess(kv, 1, /*grant=*/false).ok());
  EXPECT_NE(sim::DeviceRead(1, &c, kv, 1), CUDA_SUCCESS);
  EXPECT_EQ(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.peers().SetPeerAccess(kv, 1, /*grant=*/true).ok());
  EXPECT_EQ(sim::DeviceRead(1, &c, kv, 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_EQ(sim::DeviceRead(1, &c, kv, 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.peers().DisablePeer(1, 0).ok());
  ASSERT_TRUE(a.Free(kv).ok());
}

// fork(): the child's copy of a paused block's host memory is the
// parent's: a free there unmaps the child's view and forgets the memory
// (no cuMemRelease of the parent's handle, nothing kept for a pause).
TEST_F(AddressablePauseTest, AForkChildForgetsTheParentsHostMemory) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  shim.PrepareFork();
  const std::string result = InChild(
      [&]() -> std::string {
        shim.AfterFork(true);
        sim::ResetCallCounts();
        if (!a.Free(kv).ok()) return "the child's free of paused memory failed";
        if (sim::CallCount("cuMemRelease") != 0) return "the child released the parent's handle";
        if (PoolStats(shim, 0).kept_bytes != 0) return "the child keeps the parent's host memory";
        return "";
      },
      10);
  shim.AfterFork(false);
  EXPECT_EQ(result, "");
  EXPECT_EQ(sim::GetUsage().host_handle_bytes, 8 * kMiB);  // the parent's, untouched
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_TRUE(a.Free(kv).ok());
}

// A driver without the calls of the copier's own stream: the copies into
// and out of host VMM memory run without one, and are waited for before the
// device memory goes (a copy between device addresses is asynchronous to
// the host even without a stream).
TEST_F(AddressablePauseTest, CopiesWithoutAStreamAreWaitedFor) {
  // The context synchronizes one pause of one block makes, with the
  // copier's stream and without it.
  auto pause_synchronizes = [&](const DriverApi& api) {
    ShimCore shim(api);
    Allocator& a = shim.allocator();
    const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
    Fill(kv, 8 * kMiB, 3);
    sim::ResetCallCounts();
    EXPECT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    const uint64_t synchronizes = sim::CallCount("cuCtxSynchronize");
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 3));
    EXPECT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv, 8 * kMiB, 3));
    EXPECT_TRUE(a.Free(kv).ok());
    return synchronizes;
  };
  const uint64_t with_stream = pause_synchronizes(api_);
  DriverApi no_streams = api_;
  no_streams.cuStreamCreate = nullptr;
  EXPECT_EQ(pause_synchronizes(no_streams), with_stream + 1);
}

// Kept memory of other sizes gives way when what a pause must make would
// not fit beside it in the host's headroom (the simulated driver refuses
// the large request, so nothing that large is made). The headroom is a
// planted /proc/meminfo: the machine's own changes while the test runs.
TEST_F(AddressablePauseTest, KeptMemoryOfOtherSizesGivesWayWhenTheHostIsShort) {
  const std::string root = ::testing::TempDir() + "/host_short_" + std::to_string(getpid());
  std::filesystem::create_directories(root + "/proc");
  std::ofstream(root + "/proc/meminfo") << "MemTotal: 2097152 kB\nMemAvailable: 1048576 kB\n";
  const size_t headroom = size_t{1} << 30;
  sim::SimOptions o;
  o.host_memory = 4 * kMiB;
  Start(o);
  const HostNode node = HostNode::Query(api_, 0);
  ASSERT_TRUE(node.supported);
  HostMappedPool::Options options;
  options.idle_seconds = 0;
  options.headroom_root = root;
  HostMappedPool pool(api_, 0, node, options);
  std::vector<absl::StatusOr<HostMappedMemory>> small = pool.Take({2 * kMiB});
  ASSERT_TRUE(small[0].ok()) << small[0].status();
  pool.Give(*std::move(small[0]));
  ASSERT_EQ(pool.stats().kept_bytes, 2 * kMiB);
  // Larger than the headroom: the kept 2 MiB go first, then the driver refuses.
  const size_t huge = (headroom / node.granularity + 1) * node.granularity;
  std::vector<absl::StatusOr<HostMappedMemory>> big = pool.Take({huge});
  EXPECT_EQ(ToCuResult(big[0].status()), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(pool.stats().kept_bytes, 0u);
  EXPECT_EQ(pool.stats().trimmed_bytes, 2 * kMiB);
  EXPECT_NE(pool.stats().limited_by.find("MemAvailable"), std::string::npos)
      << pool.stats().limited_by;
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace vmmshim
