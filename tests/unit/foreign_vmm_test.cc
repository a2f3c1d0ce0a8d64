// Other libraries' own VMM memory as the hooks hand it to
// core/foreign/foreign_vmm.h, on the simulated driver: what is held and how
// the residency report names it; pause and resume of it (released, mapped
// again at the same addresses with the same access and contents, the
// library's handle values working throughout); what is left alone; faults.
#include "core/foreign/foreign_vmm.h"

#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/driver/cu_status.h"
#include "core/shim_core.h"
#include "core/report/residency.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

CUmemAllocationProp OnDevice(int device, bool exportable = false) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

const ForeignDeviceFigures* On(const std::vector<ForeignDeviceFigures>& figures, int device) {
  for (const ForeignDeviceFigures& d : figures) {
    if (d.device == device) return &d;
  }
  return nullptr;
}

uint64_t HeldOn(const ForeignVmm& f, int device) {
  const std::vector<ForeignDeviceFigures> figures = f.Figures();
  const ForeignDeviceFigures* d = On(figures, device);
  return d != nullptr ? d->bytes() : 0;
}

class ForeignVmmTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kMiB);
    MakeCurrent(0);
  }

  // Memory "another library" makes the way PyTorch's expandable segments
  // do: its own reservation, a handle mapped into it, access for `access`.
  struct Buffer {
    CUdeviceptr va = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
  };
  Buffer Make(ForeignVmm& f, size_t size, const char* tag, std::vector<int> access = {0},
              bool exportable = false) {
    Buffer b;
    b.size = size;
    EXPECT_EQ(api_.cuMemAddressReserve(&b.va, size, 0, 0, 0), CUDA_SUCCESS);
    const CUmemAllocationProp prop = OnDevice(0, exportable);
    EXPECT_EQ(f.Create(&b.handle, size, &prop, 0, tag), CUDA_SUCCESS);
    EXPECT_EQ(f.Map(b.va, size, 0, b.handle, 0), CUDA_SUCCESS);
    std::vector<CUmemAccessDesc> descs;
    for (int d : access) {
      CUmemAccessDesc desc = {};
      desc.location = {CU_MEM_LOCATION_TYPE_DEVICE, d};
      desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      descs.push_back(desc);
    }
    EXPECT_EQ(f.SetAccess(b.va, size, descs.data(), descs.size()), CUDA_SUCCESS);
    return b;
  }
  // Two handles of 4 MiB tagged "kv", filled with seeds 1 and 2.
  std::pair<Buffer, Buffer> MakeTwoFilled(ForeignVmm& f) {
    std::pair<Buffer, Buffer> two{Make(f, 4 * kMiB, "kv"), Make(f, 4 * kMiB, "kv")};
    Fill(two.first.va, two.first.size, 1);
    Fill(two.second.va, two.second.size, 2);
    return two;
  }
  // The library gives it back: unmap, release, address free.
  void Drop(ForeignVmm& f, const Buffer& b) {
    EXPECT_EQ(f.Unmap(b.va, b.size), CUDA_SUCCESS);
    EXPECT_EQ(f.Release(b.handle), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemAddressFree(b.va, b.size), CUDA_SUCCESS);
  }
};

TEST_F(ForeignVmmTest, AHandleIsHeldUntilItsLastReferenceAndMappingGo) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer b = Make(f, 20 * kMiB, "kv");
    EXPECT_EQ(HeldOn(f, 0), 20 * kMiB);
    ASSERT_EQ(f.Release(b.handle), CUDA_SUCCESS);  // still mapped: the driver keeps it
    EXPECT_EQ(HeldOn(f, 0), 20 * kMiB);
    // A retain is one more reference to release, with the library's value.
    CUmemGenericAllocationHandle retained = 0;
    ASSERT_EQ(f.Retain(&retained, reinterpret_cast<void*>(b.va + kMiB)), CUDA_SUCCESS);
    EXPECT_EQ(retained, b.handle);
    ASSERT_EQ(f.Unmap(b.va, b.size), CUDA_SUCCESS);
    EXPECT_EQ(HeldOn(f, 0), 20 * kMiB);
    ASSERT_EQ(f.Release(retained), CUDA_SUCCESS);
    EXPECT_EQ(HeldOn(f, 0), 0u);
    EXPECT_TRUE(f.Figures().empty());
    // Bad input gets the driver's code.
    EXPECT_EQ(f.Release(b.handle), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(f.Map(b.va, 2 * kMiB, 0, 0xdead, 0), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(api_.cuMemAddressFree(b.va, b.size), CUDA_SUCCESS);
  }
  ExpectNothingLeft();
}

TEST_F(ForeignVmmTest, TagsExportsAndImportsAreNamed) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer weights = Make(f, 4 * kMiB, "weights");
    Buffer shared = Make(f, 6 * kMiB, "", {0}, /*exportable=*/true);
    int fd = -1;
    ASSERT_EQ(f.Export(&fd, shared.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    CUmemGenericAllocationHandle imported = 0;
    ASSERT_EQ(f.Import(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_SUCCESS);
    EXPECT_EQ(HeldOn(f, 0), 10 * kMiB);  // an import counts once mapped
    CUdeviceptr view = 0;
    ASSERT_EQ(api_.cuMemAddressReserve(&view, 6 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(f.Map(view, 6 * kMiB, 0, imported, 0), CUDA_SUCCESS);
    const std::vector<ForeignDeviceFigures> figures = f.Figures();
    ASSERT_EQ(figures.size(), 1u);
    EXPECT_EQ(figures[0].by_tag.at("weights"), 4 * kMiB);
    EXPECT_EQ(figures[0].by_tag.at(""), 6 * kMiB);
    EXPECT_EQ(figures[0].exported_bytes, 6 * kMiB);
    EXPECT_EQ(figures[0].imported_bytes, 6 * kMiB);
    EXPECT_EQ(figures[0].handles, 3u);
    ASSERT_EQ(f.Unmap(view, 6 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(f.Release(imported), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAddressFree(view, 6 * kMiB), CUDA_SUCCESS);
    close(fd);
    Drop(f, weights);
    Drop(f, shared);
    EXPECT_TRUE(f.Figures().empty());
  }
  ExpectNothingLeft();
}

TEST_F(ForeignVmmTest, PauseReleasesItAndResumeMapsItBackWithAccessAndContents) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    ForeignVmm& f = shim.foreign();
    Buffer kv = Make(f, 8 * kMiB, "kv", {0, 1});
    Buffer weights = Make(f, 4 * kMiB, "weights", {0});
    const CUdeviceptr served = MustAllocate(a, 4 * kMiB);
    Fill(kv.va, kv.size, 1);
    Fill(weights.va, weights.size, 2);
    Fill(served, 4 * kMiB, 3);
    CUmemGenericAllocationHandle retained = 0;  // a second reference of kv
    ASSERT_EQ(f.Retain(&retained, reinterpret_cast<void*>(kv.va)), CUDA_SUCCESS);

    absl::StatusOr<size_t> paused = shim.pause().Pause(TagSelection::All(), true);
    ASSERT_TRUE(paused.ok()) << paused.status();
    EXPECT_EQ(*paused, 16 * kMiB);
    EXPECT_EQ(sim::DeviceBytesInUse(0), 0u);
    // Addressable: the owner and the peer read the contents in host memory.
    EXPECT_TRUE(Holds(kv.va, kv.size, 1));
    std::vector<char> peer_byte(1);
    EXPECT_EQ(sim::DeviceRead(1, peer_byte.data(), kv.va, 1), CUDA_SUCCESS);
    const std::vector<ForeignDeviceFigures> figures = f.Figures();
    ASSERT_NE(On(figures, 0), nullptr);
    EXPECT_EQ(On(figures, 0)->bytes(), 0u);
    EXPECT_EQ(On(figures, 0)->paused_by_tag.at("kv"), 8 * kMiB);
    EXPECT_EQ(On(figures, 0)->paused_by_tag.at("weights"), 4 * kMiB);
    EXPECT_EQ(On(figures, 0)->paused_faulting_bytes, 0u);  // every mapping has its view

    // While paused, the library's handles keep working.
    CUmemAllocationProp prop = {};
    EXPECT_EQ(f.GetProperties(&prop, kv.handle), CUDA_SUCCESS);
    EXPECT_EQ(prop.location.id, 0);
    CUmemGenericAllocationHandle again = 0;
    EXPECT_EQ(f.Retain(&again, reinterpret_cast<void*>(kv.va + kMiB)), CUDA_SUCCESS);
    EXPECT_EQ(again, kv.handle);
    EXPECT_EQ(f.Release(again), CUDA_SUCCESS);
    CUdeviceptr elsewhere = 0;
    ASSERT_EQ(api_.cuMemAddressReserve(&elsewhere, 2 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(f.Map(elsewhere, 2 * kMiB, 0, kv.handle, 0), CUDA_ERROR_ILLEGAL_STATE);
    ASSERT_EQ(api_.cuMemAddressFree(elsewhere, 2 * kMiB), CUDA_SUCCESS);
    // Pausing again releases nothing more.
    absl::StatusOr<size_t> twice = shim.pause().Pause(TagSelection::All(), true);
    ASSERT_TRUE(twice.ok());
    EXPECT_EQ(*twice, 0u);

    absl::StatusOr<size_t> resumed = shim.pause().Resume(TagSelection::All());
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(*resumed, 16 * kMiB);
    EXPECT_TRUE(Holds(kv.va, kv.size, 1));
    EXPECT_TRUE(Holds(weights.va, weights.size, 2));
    EXPECT_TRUE(Holds(served, 4 * kMiB, 3));
    // The same access: device 1 reads kv, not the weights.
    std::vector<char> byte(1);
    EXPECT_EQ(sim::DeviceRead(1, byte.data(), kv.va, 1), CUDA_SUCCESS);
    EXPECT_EQ(sim::DeviceRead(1, byte.data(), weights.va, 1), CUDA_ERROR_ILLEGAL_ADDRESS);
    // A retain answers with the library's value; two references, then gone.
    ASSERT_EQ(f.Retain(&again, reinterpret_cast<void*>(kv.va)), CUDA_SUCCESS);
    EXPECT_EQ(again, kv.handle);
    ASSERT_EQ(f.Release(again), CUDA_SUCCESS);
    ASSERT_EQ(f.Release(retained), CUDA_SUCCESS);
    EXPECT_EQ(HeldOn(f, 0), 12 * kMiB);
    Drop(f, kv);
    Drop(f, weights);
    EXPECT_TRUE(f.Figures().empty());
    ASSERT_TRUE(a.Free(served).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// VMMSHIM_PAUSED_ACCESS=host over other libraries' memory: a mapping that
// shows the whole handle maps its kept contents (written while paused, the
// writes kept by the resume); a mapping of part of a handle faults (the
// host memory cannot be mapped from an offset); dropped contents read
// scratch; the library's unmap while paused takes the view away.
TEST_F(ForeignVmmTest, PausedMemoryMapsItsContentsWhereAMappingShowsTheWholeHandle) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer kv = Make(f, 4 * kMiB, "kv");
    Buffer tmp = Make(f, 4 * kMiB, "tmp");
    CUdeviceptr part = 0;  // kv's second half, mapped a second time
    ASSERT_EQ(api_.cuMemAddressReserve(&part, 2 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(f.Map(part, 2 * kMiB, 2 * kMiB, kv.handle, 0), CUDA_SUCCESS);
    CUmemAccessDesc desc = {};
    desc.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(f.SetAccess(part, 2 * kMiB, &desc, 1), CUDA_SUCCESS);
    Fill(kv.va, kv.size, 1);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("tmp"), false).ok());
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    EXPECT_TRUE(Holds(kv.va, kv.size, 1));
    Fill(kv.va + 2 * kMiB, 2 * kMiB, 7);  // written while paused
    char c;
    EXPECT_NE(sim::DeviceRead(0, &c, part, 1), CUDA_SUCCESS);
    EXPECT_EQ(sim::DeviceRead(0, &c, tmp.va + kMiB, 1), CUDA_SUCCESS);
    // The library frees what it paused: the scratch view goes with its unmap.
    ASSERT_EQ(f.Unmap(tmp.va, tmp.size), CUDA_SUCCESS);
    EXPECT_NE(sim::DeviceRead(0, &c, tmp.va + kMiB, 1), CUDA_SUCCESS);
    ASSERT_EQ(f.Release(tmp.handle), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAddressFree(tmp.va, tmp.size), CUDA_SUCCESS);
    // A resume that fails maps the view again; the next one restores it all.
    sim::FailCall("cuMemCreate", 1, CUDA_ERROR_UNKNOWN);
    EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    sim::ClearFailures();
    EXPECT_TRUE(Holds(kv.va + 2 * kMiB, 2 * kMiB, 7));
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv.va, 2 * kMiB, 1));
    EXPECT_TRUE(Holds(kv.va + 2 * kMiB, 2 * kMiB, 7));
    EXPECT_TRUE(Holds(part, 2 * kMiB, 7));
    ASSERT_EQ(f.Unmap(part, 2 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAddressFree(part, 2 * kMiB), CUDA_SUCCESS);
    Drop(f, kv);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// As with the shim's blocks, a resume starts each handle's copy back as
// soon as its memory is mapped: when the second handle cannot be made, the
// first's copy has started, and is waited for before the undo.
TEST_F(ForeignVmmTest, AResumeCopiesEachHandleBackAsSoonAsItIsMapped) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const auto [first, second] = MakeTwoFilled(f);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    sim::ResetCallCounts();
    sim::FailCall("cuMemCreate", 2, CUDA_ERROR_UNKNOWN);
    EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    sim::ClearFailures();
    EXPECT_EQ(sim::CallCount("cuMemcpyDtoDAsync_v2"), 1u);
    EXPECT_TRUE(Holds(first.va, first.size, 1));  // its view again
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(first.va, first.size, 1));
    EXPECT_TRUE(Holds(second.va, second.size, 2));
    Drop(f, first);
    Drop(f, second);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// Note [A pause's memory goes as its copy completes] (core/heap/
// pausable_memory.h), for other libraries' handles: the copy engine reports
// the second handle's copy failed after the first handle went; the first
// stays paused (its contents at its view), the second live and whole.
TEST_F(ForeignVmmTest, APausesHandlesGoOneByOneAsTheirCopiesComplete) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    const auto [first, second] = MakeTwoFilled(f);
    sim::ResetCallCounts();
    sim::FailCall("cuEventSynchronize", 2, CUDA_ERROR_UNKNOWN);
    absl::StatusOr<size_t> paused = shim.pause().Pause(TagSelection::Only("kv"), true);
    sim::ClearFailures();
    EXPECT_EQ(ToCuResult(paused.status()), CUDA_ERROR_UNKNOWN);
    EXPECT_EQ(sim::CallCount("cuEventSynchronize"), 2u);
    EXPECT_EQ(sim::GetUsage().handles, 1u);  // one live, one paused
    EXPECT_TRUE(Holds(first.va, first.size, 1));
    EXPECT_TRUE(Holds(second.va, second.size, 2));
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(first.va, first.size, 1));
    EXPECT_TRUE(Holds(second.va, second.size, 2));
    Drop(f, first);
    Drop(f, second);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// A peer the library let read only reads the view and cannot write it.
TEST_F(ForeignVmmTest, AReadOnlyPeerReadsTheViewOnly) {
  ShimCore shim(api_);
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());
  ForeignVmm& f = shim.foreign();
  Buffer kv = Make(f, 4 * kMiB, "kv");
  CUmemAccessDesc reader = {};
  reader.location = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  reader.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  ASSERT_EQ(f.SetAccess(kv.va, kv.size, &reader, 1), CUDA_SUCCESS);
  Fill(kv.va, kv.size, 4);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  std::vector<char> byte(1, 9);
  EXPECT_EQ(sim::DeviceRead(1, byte.data(), kv.va, 1), CUDA_SUCCESS);
  EXPECT_NE(sim::DeviceWrite(1, kv.va, byte.data(), 1), CUDA_SUCCESS);
  EXPECT_EQ(sim::DeviceWrite(0, kv.va + 1, byte.data(), 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  EXPECT_TRUE(Holds(kv.va, 1, 4));
  Drop(f, kv);
  ASSERT_TRUE(shim.peers().DisablePeer(1, 0).ok());
}

// A failed resume whose undo cannot unmap the new handle leaves that
// mapping marked: the next resume unmaps it first and restores everything.
TEST_F(ForeignVmmTest, AMappingAFailedResumeLeftMappedIsUnmappedByTheNext) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer kv = Make(f, 4 * kMiB, "kv");
    Fill(kv.va, kv.size, 5);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    // The copy back fails, then the undo's unmap (the view's was the first).
    sim::FailCall("cuMemcpyDtoDAsync_v2", 1, CUDA_ERROR_UNKNOWN);
    sim::FailCall("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN);
    EXPECT_FALSE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    sim::ClearFailures();
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv.va, kv.size, 5));
    Drop(f, kv);
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

TEST_F(ForeignVmmTest, ReleaseAndUnmapWhilePausedNeedNoResume) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer kv = Make(f, 6 * kMiB, "kv");
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), false).ok());
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    Drop(f, kv);  // the library frees what it paused
    EXPECT_TRUE(f.Figures().empty());
    absl::StatusOr<size_t> resumed = shim.pause().Resume(TagSelection::Only("kv"));
    ASSERT_TRUE(resumed.ok());
    EXPECT_EQ(*resumed, 0u);
  }
  ExpectNothingLeft();
}

// What a library may do with its paused memory, and what it gets.
TEST_F(ForeignVmmTest, TheLibrarysCallsWhilePausedActAsOnLiveMemory) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer kv = Make(f, 4 * kMiB, "kv");
    Fill(kv.va, kv.size, 3);
    // A handle made before the shim saw it (straight to the driver), mapped
    // next to kv in one reservation through the hooks.
    CUdeviceptr pair = 0;
    ASSERT_EQ(api_.cuMemAddressReserve(&pair, 4 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    const CUmemAllocationProp prop = OnDevice(0);
    CUmemGenericAllocationHandle early = 0, late = 0;
    ASSERT_EQ(api_.cuMemCreate(&early, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(f.Create(&late, 2 * kMiB, &prop, 0, "kv"), CUDA_SUCCESS);
    ASSERT_EQ(f.Map(pair, 2 * kMiB, 0, early, 0), CUDA_SUCCESS);
    ASSERT_EQ(f.Map(pair + 2 * kMiB, 2 * kMiB, 0, late, 0), CUDA_SUCCESS);

    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    // Mapping over a paused mapping's range fails, as over a mapped one.
    EXPECT_EQ(f.Map(kv.va, 2 * kMiB, 0, early, 0), CUDA_ERROR_INVALID_VALUE);
    // Access is checked as the driver checks it, then kept for the resume.
    CUmemAccessDesc bad = {};
    bad.location = {CU_MEM_LOCATION_TYPE_DEVICE, 7};
    bad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_EQ(f.SetAccess(kv.va, kv.size, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
    CUmemAccessDesc peer = bad;
    peer.location.id = 1;
    EXPECT_EQ(f.SetAccess(kv.va, kv.size, &peer, 1), CUDA_SUCCESS);
    // An unmap of a range with a paused mapping and one the shim did not
    // make reaches the driver for the latter.
    EXPECT_EQ(f.Unmap(pair, 4 * kMiB), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemRelease(early), CUDA_SUCCESS);
    EXPECT_EQ(f.Release(late), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemAddressFree(pair, 4 * kMiB), CUDA_SUCCESS);
    // kv unmapped while paused, its handle kept: its contents come back
    // with it wherever it is mapped next.
    EXPECT_EQ(f.Unmap(kv.va, kv.size), CUDA_SUCCESS);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    // Nothing of the library's is mapped; the host memory kept for the next
    // pause is, each at a range of its own.
    EXPECT_EQ(sim::GetUsage().mappings, sim::GetUsage().host_handles);
    CUdeviceptr elsewhere = 0;
    ASSERT_EQ(api_.cuMemAddressReserve(&elsewhere, kv.size, 0, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(f.Map(elsewhere, kv.size, 0, kv.handle, 0), CUDA_SUCCESS);
    CUmemAccessDesc owner = peer;
    owner.location.id = 0;
    ASSERT_EQ(f.SetAccess(elsewhere, kv.size, &owner, 1), CUDA_SUCCESS);
    EXPECT_TRUE(Holds(elsewhere, kv.size, 3));
    ASSERT_EQ(api_.cuMemAddressFree(kv.va, kv.size), CUDA_SUCCESS);
    kv.va = elsewhere;
    Drop(f, kv);
    EXPECT_TRUE(f.Figures().empty());
  }
  ExpectNothingLeft();
}

TEST_F(ForeignVmmTest, ValuesTheDriverReusesStayDistinct) {
  sim::SimOptions o;
  o.device_count = 2;
  o.memory_per_device = 256 * kMiB;
  o.reuse_handle_values = true;
  sim::Reset(o);
  ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
  api_ = sim::Api();
  MakeCurrent(0);
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer kv = Make(f, 4 * kMiB, "kv");
    Fill(kv.va, kv.size, 5);
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    // The driver hands the freed value out again: the library gets another.
    Buffer other = Make(f, 2 * kMiB, "other");
    EXPECT_NE(other.handle, kv.handle);
    Fill(other.va, other.size, 6);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv.va, kv.size, 5));
    EXPECT_TRUE(Holds(other.va, other.size, 6));
    CUmemGenericAllocationHandle h = 0;
    ASSERT_EQ(f.Retain(&h, reinterpret_cast<void*>(other.va)), CUDA_SUCCESS);
    EXPECT_EQ(h, other.handle);
    ASSERT_EQ(f.Release(h), CUDA_SUCCESS);
    ASSERT_EQ(f.Retain(&h, reinterpret_cast<void*>(kv.va)), CUDA_SUCCESS);
    EXPECT_EQ(h, kv.handle);
    ASSERT_EQ(f.Release(h), CUDA_SUCCESS);
    CUmemAllocationProp prop = {};
    EXPECT_EQ(f.GetProperties(&prop, other.handle), CUDA_SUCCESS);
    Drop(f, other);
    EXPECT_TRUE(Holds(kv.va, kv.size, 5));  // the other library's release did not reach kv
    Drop(f, kv);
    EXPECT_TRUE(f.Figures().empty());
  }
  ExpectNothingLeft();
}

TEST_F(ForeignVmmTest, ExceptSelectionExportsAndUnmappedHandlesAreLeftAlone) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    Buffer kv = Make(f, 8 * kMiB, "kv");
    Buffer weights = Make(f, 4 * kMiB, "weights");
    Buffer shared = Make(f, 2 * kMiB, "kv", {0}, /*exportable=*/true);
    int fd = -1;
    ASSERT_EQ(f.Export(&fd, shared.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    CUmemGenericAllocationHandle loose = 0;  // made, never mapped
    const CUmemAllocationProp prop = OnDevice(0);
    ASSERT_EQ(f.Create(&loose, 2 * kMiB, &prop, 0, "kv"), CUDA_SUCCESS);
    absl::StatusOr<size_t> paused =
        shim.pause().Pause(TagSelection::AllExcept({"weights"}), true);
    ASSERT_TRUE(paused.ok()) << paused.status();
    EXPECT_EQ(*paused, 8 * kMiB);
    const nlohmann::json doc = nlohmann::json::parse(ResidencyJson(shim.control(), nullptr));
    const nlohmann::json& other = doc["devices"][0]["other_libraries_vmm"];
    EXPECT_EQ(other["bytes"], 8 * kMiB);  // weights, the export, the unmapped handle
    EXPECT_EQ(other["by_tag"]["weights"], 4 * kMiB);
    EXPECT_EQ(other["paused_by_tag"]["kv"], 8 * kMiB);
    EXPECT_EQ(other["paused_faulting_bytes"], 0u);
    EXPECT_EQ(other["left_alone"]["exported_bytes"], 2 * kMiB);
    EXPECT_EQ(other["left_alone"]["unmapped_bytes"], 2 * kMiB);
    EXPECT_TRUE(other["left_alone"]["exported_reason"].is_string());
    ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
    close(fd);
    ASSERT_EQ(f.Release(loose), CUDA_SUCCESS);
    Drop(f, kv);
    Drop(f, weights);
    Drop(f, shared);
  }
  ExpectNothingLeft();
}

// Every driver call a pause or resume makes for other libraries' memory
// failing once, first and second call: nothing leaked, and a later resume
// restores every content (theirs and the shim's).
TEST_F(ForeignVmmTest, FaultsLeaveAConsistentState) {
  Buffer kv, more;
  CUdeviceptr served = 0;
  const int runs = RunPauseFaults(
      PauseDriverCalls(), 2, TagSelection::All(),
      [&](ShimCore& shim) {
        Allocator& a = shim.allocator();
        kv = Make(shim.foreign(), 6 * kMiB, "kv", {0, 1});
        more = Make(shim.foreign(), 2 * kMiB, "kv", {0});
        served = MustAllocate(a, 4 * kMiB);
        Fill(kv.va, kv.size, 7);
        Fill(more.va, more.size, 8);
        Fill(served, 4 * kMiB, 9);
      },
      [&](ShimCore& shim, const std::string& what) {
        Allocator& a = shim.allocator();
        EXPECT_TRUE(Holds(kv.va, kv.size, 7)) << what;
        EXPECT_TRUE(Holds(more.va, more.size, 8)) << what;
        EXPECT_TRUE(Holds(served, 4 * kMiB, 9)) << what;
        std::vector<char> byte(1);
        EXPECT_EQ(sim::DeviceRead(1, byte.data(), kv.va, 1), CUDA_SUCCESS) << what;
        for (const ForeignDeviceFigures& d : shim.foreign().Figures()) {
          EXPECT_TRUE(d.paused_by_tag.empty()) << what;
        }
        Drop(shim.foreign(), kv);
        Drop(shim.foreign(), more);
        EXPECT_TRUE(a.Free(served).ok()) << what;
      });
  EXPECT_EQ(runs, static_cast<int>(PauseDriverCalls().size()) * 2 * 2);
}

TEST_F(ForeignVmmTest, TheResidencyReportNamesOtherLibrariesMemory) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  // The allocator's own memory, and memory "another library" made itself
  // on device 1, where the shim served nothing.
  const CUdeviceptr own = MustAllocate(a, 4 * kMiB);
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = OnDevice(1);
  ASSERT_EQ(shim.foreign().Create(&h, 32 * kMiB, &prop, 0, "nccl"), CUDA_SUCCESS);
  const nlohmann::json doc = nlohmann::json::parse(ResidencyJson(shim.control(), nullptr));
  ASSERT_EQ(doc["devices"].size(), 2u);
  EXPECT_EQ(doc["devices"][0]["other_libraries_vmm"]["bytes"], 0u);
  EXPECT_EQ(doc["devices"][1]["device"], 1);
  EXPECT_EQ(doc["devices"][1]["other_libraries_vmm"]["bytes"], 32 * kMiB);
  EXPECT_EQ(doc["devices"][1]["other_libraries_vmm"]["by_tag"]["nccl"], 32 * kMiB);
  EXPECT_EQ(doc["devices"][1]["shim"]["resident_bytes"], 0u);
  ASSERT_EQ(shim.foreign().Release(h), CUDA_SUCCESS);
  ASSERT_TRUE(a.Free(own).ok());
}

}  // namespace
}  // namespace vmmshim
