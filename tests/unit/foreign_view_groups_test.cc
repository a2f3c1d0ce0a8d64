// Note [Adjacent handles share one view] (core/foreign/foreign_vmm.h), on
// the simulated driver: another library's handles side by side in one
// reservation (PyTorch's expandable segments) pause into one host
// allocation shown by one view; handles of two reservations never share
// one; the library's calls over one of them while paused take the run
// apart without losing or hiding anyone's contents; a member that stays
// live does too; the run's memory is made late and reused.
#include <chrono>
#include <thread>
#include <vector>

#include "core/foreign/foreign_vmm.h"
#include "core/shim_core.h"
#include "gtest/gtest.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class ForeignViewGroupsTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kMiB);
    MakeCurrent(0);
  }

  // A reservation of the library's (through the shim: recorded) holding
  // `count` handles of `size`, side by side, each read-write for device 0
  // and filled with seed 10 + its index.
  struct Run {
    CUdeviceptr va = 0;
    size_t size = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    CUdeviceptr at(size_t i) const { return va + i * size; }
  };
  Run MakeRun(ForeignVmm& f, size_t count, size_t size, const char* tag) {
    Run run;
    run.size = size;
    EXPECT_EQ(f.Reserve(&run.va, count * size, 0, 0, 0), CUDA_SUCCESS);
    for (size_t i = 0; i < count; ++i) {
      run.handles.push_back(MapNew(f, run.at(i), size, tag));
      Fill(run.at(i), size, 10 + static_cast<int>(i));
    }
    return run;
  }
  static CUmemAccessDesc ReadWrite(int device) {
    CUmemAccessDesc rw = {};
    rw.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return rw;
  }
  // A new handle of `size` on device 0 made and mapped at `at` by the
  // library, read-write for device 0.
  static CUmemGenericAllocationHandle MapNew(ForeignVmm& f, CUdeviceptr at, size_t size,
                                             const char* tag) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    const CUmemAccessDesc rw = ReadWrite(0);
    CUmemGenericAllocationHandle h = 0;
    EXPECT_EQ(f.Create(&h, size, &prop, 0, tag), CUDA_SUCCESS);
    EXPECT_EQ(f.Map(at, size, 0, h, 0), CUDA_SUCCESS);
    EXPECT_EQ(f.SetAccess(at, size, &rw, 1), CUDA_SUCCESS);
    return h;
  }
  bool HoldsAll(const Run& run) {
    for (size_t i = 0; i < run.handles.size(); ++i) {
      if (!Holds(run.at(i), run.size, 10 + static_cast<int>(i))) return false;
    }
    return true;
  }
  // The library gives back what is left of it: unmap, release, free.
  void Drop(ForeignVmm& f, const Run& run, size_t gone = SIZE_MAX) {
    for (size_t i = 0; i < run.handles.size(); ++i) {
      if (i == gone) continue;
      EXPECT_EQ(f.Unmap(run.at(i), run.size), CUDA_SUCCESS);
      EXPECT_EQ(f.Release(run.handles[i]), CUDA_SUCCESS);
    }
    EXPECT_EQ(f.Free(run.va, run.size * run.handles.size()), CUDA_SUCCESS);
  }
  // The bytes of device 0's paused foreign mappings that map nothing now.
  static uint64_t Faulting(const ForeignVmm& f) {
    for (const ForeignDeviceFigures& d : f.Figures()) {
      if (d.device == 0) return d.paused_faulting_bytes;
    }
    return 0;
  }
};

TEST_F(ForeignViewGroupsTest, AdjacentHandlesOfOneReservationPauseIntoOneViewAndResumeWithWrites) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run run = MakeRun(f, 5, 4 * kMiB, "kv");
    sim::ResetCallCounts();
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    // Five handles unmapped; one host allocation made and one view mapped.
    EXPECT_EQ(sim::CallCount("cuMemUnmap"), 5u);
    EXPECT_EQ(sim::CallCount("cuMemMap"), 2u);  // the view, and the CPU's mapping of its memory
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    EXPECT_EQ(Faulting(f), 0u);
    EXPECT_TRUE(HoldsAll(run));
    Fill(run.at(3) + kMiB, kMiB, 7);  // a kernel's write while paused, across nothing
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(run.at(3) + kMiB, kMiB, 7));
    EXPECT_TRUE(Holds(run.at(4), run.size, 14));
    EXPECT_TRUE(Holds(run.at(0), run.size, 10));
    // The second pause takes the run's memory the first one left in the pool.
    sim::ResetCallCounts();
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_EQ(sim::CallCount("cuMemMap"), 1u);
    EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 1u);
    EXPECT_TRUE(Holds(run.at(3) + kMiB, kMiB, 7));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(run.at(1), run.size, 11));
    Drop(f, run);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// The driver maps within one reservation: handles side by side in two
// reservations, and handles of two tags, get views of their own.
TEST_F(ForeignViewGroupsTest, ARunNeverCrossesAReservationOrATag) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run first = MakeRun(f, 2, 4 * kMiB, "kv");
    const Run second = MakeRun(f, 2, 4 * kMiB, "kv");
    ASSERT_EQ(first.at(2), second.va);  // the simulated driver's next range: adjacent
    const Run mixed = MakeRun(f, 2, 4 * kMiB, "kv");
    ASSERT_EQ(f.Unmap(mixed.at(1), mixed.size), CUDA_SUCCESS);  // remade with another tag
    ASSERT_EQ(f.Release(mixed.handles[1]), CUDA_SUCCESS);
    const CUmemGenericAllocationHandle weights = MapNew(f, mixed.at(1), mixed.size, "weights");
    Fill(mixed.at(1), mixed.size, 5);
    sim::ResetCallCounts();
    ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
    // first, second: one run each; mixed: a view per handle. Each view's
    // memory is mapped for the CPU too.
    EXPECT_EQ(sim::CallCount("cuMemMap"), 2u * 4);
    EXPECT_TRUE(HoldsAll(first));
    EXPECT_TRUE(HoldsAll(second));
    EXPECT_TRUE(Holds(mixed.at(0), mixed.size, 10));
    EXPECT_TRUE(Holds(mixed.at(1), mixed.size, 5));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("weights")).ok());
    EXPECT_TRUE(Holds(mixed.at(1), mixed.size, 5));
    EXPECT_TRUE(Holds(mixed.at(0), mixed.size, 10));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
    EXPECT_TRUE(HoldsAll(first));
    EXPECT_TRUE(HoldsAll(second));
    EXPECT_EQ(f.Unmap(mixed.at(1), mixed.size), CUDA_SUCCESS);
    EXPECT_EQ(f.Release(weights), CUDA_SUCCESS);
    Drop(f, first);
    Drop(f, second);
    Drop(f, mixed, /*gone=*/1);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// The library unmaps and releases one handle of a paused run (PyTorch's
// empty_cache): the run's view stays, the others keep their contents; a
// new handle mapped into that range (the segment growing again) takes the
// run apart first, each member then at a view of its own; all resume.
TEST_F(ForeignViewGroupsTest, TheLibrarysUnmapLeavesTheRunAndItsMapIntoTheRunTakesItApart) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run run = MakeRun(f, 4, 4 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    Fill(run.at(2), run.size, 22);  // written while paused
    sim::ResetCallCounts();
    ASSERT_EQ(f.Unmap(run.at(1), run.size), CUDA_SUCCESS);
    ASSERT_EQ(f.Release(run.handles[1]), CUDA_SUCCESS);
    EXPECT_EQ(sim::CallCount("cuMemUnmap") + sim::CallCount("cuMemMap"), 0u);
    EXPECT_TRUE(Holds(run.at(0), run.size, 10));
    EXPECT_TRUE(Holds(run.at(2), run.size, 22));
    EXPECT_TRUE(Holds(run.at(3), run.size, 13));
    EXPECT_EQ(Faulting(f), 0u);
    const CUmemGenericAllocationHandle grown = MapNew(f, run.at(1), run.size, "kv");
    Fill(run.at(1), run.size, 41);
    EXPECT_TRUE(Holds(run.at(0), run.size, 10));
    EXPECT_TRUE(Holds(run.at(2), run.size, 22));
    EXPECT_TRUE(Holds(run.at(3), run.size, 13));
    EXPECT_EQ(Faulting(f), 0u);
    Fill(run.at(3), run.size, 33);  // at its own view now
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(run.at(0), run.size, 10));
    EXPECT_TRUE(Holds(run.at(1), run.size, 41));
    EXPECT_TRUE(Holds(run.at(2), run.size, 22));
    EXPECT_TRUE(Holds(run.at(3), run.size, 33));
    EXPECT_EQ(sim::GetUsage().handles, 4u);
    EXPECT_EQ(f.Unmap(run.at(1), run.size), CUDA_SUCCESS);
    EXPECT_EQ(f.Release(grown), CUDA_SUCCESS);
    Drop(f, run, /*gone=*/1);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// An access change over one member while paused takes the run apart: the
// change reaches that member's own view, the others keep theirs.
TEST_F(ForeignViewGroupsTest, AnAccessChangeOverOneMemberTakesTheRunApart) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run run = MakeRun(f, 3, 4 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    Fill(run.at(0), run.size, 20);
    const CUmemAccessDesc descs[2] = {ReadWrite(0), ReadWrite(1)};
    ASSERT_EQ(f.SetAccess(run.at(2), run.size, descs, 2), CUDA_SUCCESS);
    EXPECT_TRUE(Holds(run.at(0), run.size, 20));
    EXPECT_TRUE(Holds(run.at(1), run.size, 11));
    EXPECT_TRUE(Holds(run.at(2), run.size, 12));
    char c;
    EXPECT_EQ(sim::DeviceRead(1, &c, run.at(2), 1), CUDA_SUCCESS);  // the peer reaches it
    EXPECT_EQ(Faulting(f), 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(run.at(0), run.size, 20));
    EXPECT_TRUE(Holds(run.at(2), run.size, 12));
    EXPECT_EQ(sim::DeviceRead(1, &c, run.at(2), 1), CUDA_SUCCESS);
    Drop(f, run);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// The access the library gave a peer reaches the run's view: read-write,
// and read-only where it let the peer only read (a write faults there).
TEST_F(ForeignViewGroupsTest, APeersAccessReachesTheRunsView) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run writers = MakeRun(f, 2, 4 * kMiB, "kv");
    const Run readers = MakeRun(f, 2, 4 * kMiB, "kv");
    const CUmemAccessDesc both[2] = {ReadWrite(0), ReadWrite(1)};
    ASSERT_EQ(f.SetAccess(writers.va, 2 * writers.size, both, 2), CUDA_SUCCESS);
    CUmemAccessDesc read_only[2] = {ReadWrite(0), ReadWrite(1)};
    read_only[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    ASSERT_EQ(f.SetAccess(readers.va, 2 * readers.size, read_only, 2), CUDA_SUCCESS);
    sim::ResetCallCounts();
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_EQ(sim::CallCount("cuMemMap"), 2u * 2);  // per run: its view, its memory's CPU mapping
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    char c = 0;
    EXPECT_EQ(sim::DeviceRead(1, &c, writers.at(1) + 5, 1), CUDA_SUCCESS);
    EXPECT_EQ(sim::DeviceWrite(1, writers.at(1) + 5, &c, 1), CUDA_SUCCESS);
    EXPECT_EQ(sim::DeviceRead(1, &c, readers.at(1) + 5, 1), CUDA_SUCCESS);
    EXPECT_NE(sim::DeviceWrite(1, readers.at(1) + 5, &c, 1), CUDA_SUCCESS);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(HoldsAll(writers));
    EXPECT_TRUE(HoldsAll(readers));
    EXPECT_EQ(sim::DeviceRead(1, &c, readers.at(0), 1), CUDA_SUCCESS);
    Drop(f, writers);
    Drop(f, readers);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// The library gives back every handle of a paused run and its
// reservation: the run's view goes with the reservation, nothing is left.
TEST_F(ForeignViewGroupsTest, ARunTheLibraryFreesWhilePausedGoesWithItsReservation) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run run = MakeRun(f, 3, 4 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    Drop(f, run);
    char c;
    EXPECT_NE(sim::DeviceRead(0, &c, run.at(0), 1), CUDA_SUCCESS);  // the range is gone
    EXPECT_EQ(Faulting(f), 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// A member whose unmap the driver refuses at the pause stays live and
// whole; the rest of its run pause, each addressable through a view of
// its own.
TEST_F(ForeignViewGroupsTest, AMemberLeftLiveAtThePauseTakesTheRunApart) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run run = MakeRun(f, 3, 4 * kMiB, "kv");
    sim::FailCall("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN);
    absl::StatusOr<size_t> paused = shim.pause().Pause(TagSelection::Only("kv"), true);
    sim::ClearFailures();
    EXPECT_FALSE(paused.ok());
    EXPECT_EQ(sim::GetUsage().handles, 1u);
    EXPECT_TRUE(HoldsAll(run));
    EXPECT_EQ(Faulting(f), 0u);
    Fill(run.at(2), run.size, 4);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(run.at(0), run.size, 10));
    EXPECT_TRUE(Holds(run.at(1), run.size, 11));
    EXPECT_TRUE(Holds(run.at(2), run.size, 4));
    Drop(f, run);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// A resume that fails midway (the driver fails the second handle's cuMemCreate) leaves
// the run paused and shown by its view again, its writes kept.
TEST_F(ForeignViewGroupsTest, AFailedResumeMapsTheRunsViewAgain) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const Run run = MakeRun(f, 3, 4 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    Fill(run.at(1), run.size, 21);
    sim::FailCall("cuMemCreate", 2, CUDA_ERROR_UNKNOWN);
    EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    sim::ClearFailures();
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    EXPECT_EQ(Faulting(f), 0u);
    EXPECT_TRUE(Holds(run.at(0), run.size, 10));
    EXPECT_TRUE(Holds(run.at(1), run.size, 21));
    EXPECT_TRUE(Holds(run.at(2), run.size, 12));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(run.at(1), run.size, 21));
    EXPECT_TRUE(Holds(run.at(2), run.size, 12));
    Drop(f, run);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// VMMSHIM_HOST_POOL_MAKE=background: the run's host memory is made after
// the first pause and its view mapped then (Note [Views made late]); the
// next pause finds it kept.
TEST_F(ForeignViewGroupsTest, ARunsMemoryIsMadeLateAndKeptForTheNextPause) {
  {
    AllocatorOptions o;
    o.host_memory_in_background = true;
    ShimCore shim(api_, o);
    ForeignVmm& f = shim.foreign();
    const Run run = MakeRun(f, 3, 4 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (Faulting(f) != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(Faulting(f), 0u);
    EXPECT_TRUE(HoldsAll(run));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    sim::ResetCallCounts();
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_EQ(Faulting(f), 0u);
    EXPECT_EQ(sim::CallCount("cuMemCreate"), 0u);
    EXPECT_EQ(sim::CallCount("cuMemMap"), 1u);  // the run's one view
    EXPECT_TRUE(HoldsAll(run));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(HoldsAll(run));
    Drop(f, run);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

}  // namespace
}  // namespace vmmshim
