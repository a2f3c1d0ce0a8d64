// Note [A run of views gets its access once] (core/heap/view_access_batch.h)
// on the simulated driver: adjacent views given access in one call, a
// refused run given access range by range, a refused peer, a range refused
// even for its owner; and a pause of another library's adjacent handles
// (PyTorch's expandable segments) giving its views access in one call.
#include "core/heap/view_access_batch.h"

#include <utility>
#include <vector>

#include "core/driver/cu_status.h"
#include "core/foreign/foreign_vmm.h"
#include "core/heap/host_mapped_memory.h"
#include "core/shim_core.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class ViewAccessBatchTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kMiB);
    MakeCurrent(0);
    node_ = HostNode::Query(api_, 0);
    ASSERT_TRUE(node_.supported);
    ASSERT_EQ(api_.cuMemAddressReserve(&va_, kRange, 0, 0, 0), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (const auto& [piece, handle] : handles_) {
      api_.cuMemUnmap(Range(piece), kPiece);  // those still mapped
      EXPECT_EQ(api_.cuMemRelease(handle), CUDA_SUCCESS);
    }
    EXPECT_EQ(api_.cuMemAddressFree(va_, kRange), CUDA_SUCCESS);
    ExpectNothingLeft();
  }
  // The i-th piece of the reserved range.
  CUdeviceptr Range(size_t i) const { return va_ + i * kPiece; }
  // Host memory of one piece, mapped by `batch` at piece `i` for `grant`.
  void MapPiece(ViewAccessBatch& batch, size_t i, DeviceSet grant) {
    const CUmemAllocationProp prop = node_.Prop();
    CUmemGenericAllocationHandle h = 0;
    ASSERT_EQ(api_.cuMemCreate(&h, kPiece, &prop, 0), CUDA_SUCCESS);
    handles_.push_back({i, h});
    ASSERT_TRUE(batch.Map(Range(i), kPiece, h, grant, /*owner=*/0).ok());
  }
  static bool Reads(int device, CUdeviceptr p) {
    char c;
    return sim::DeviceRead(device, &c, p, 1) == CUDA_SUCCESS;
  }

  static constexpr size_t kPiece = 2 * kMiB;
  static constexpr size_t kRange = 8 * kPiece;
  HostNode node_;
  CUdeviceptr va_ = 0;
  std::vector<std::pair<size_t, CUmemGenericAllocationHandle>> handles_;  // piece, handle
};

TEST_F(ViewAccessBatchTest, AdjacentViewsWithOneGrantGetTheirAccessInOneCall) {
  ViewAccessBatch batch(api_);
  const DeviceSet owner = DeviceSet::Of(0);
  // Mapped out of order: pieces 2, 0, 1 are one run; 4 stands apart; 5 is
  // adjacent to 4 but granted to the peer too.
  for (size_t i : {2, 0, 1, 4}) MapPiece(batch, i, owner);
  MapPiece(batch, 5, owner | DeviceSet::Of(1));
  EXPECT_FALSE(Reads(0, Range(0)));  // mapped, without access yet
  sim::ResetCallCounts();
  EXPECT_TRUE(batch.Flush().empty());
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 3u);
  for (size_t i : {0, 1, 2, 4, 5}) EXPECT_TRUE(Reads(0, Range(i))) << i;
  EXPECT_FALSE(Reads(1, Range(4)));
  EXPECT_TRUE(Reads(1, Range(5)));
}

TEST_F(ViewAccessBatchTest, ARunTheDriverRefusesIsGivenAccessRangeByRange) {
  ViewAccessBatch batch(api_);
  for (size_t i : {0, 1, 2}) MapPiece(batch, i, DeviceSet::Of(0));
  sim::ResetCallCounts();
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_TRUE(batch.Flush().empty());
  sim::ClearFailures();
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 1u + 3u);
  for (size_t i : {0, 1, 2}) EXPECT_TRUE(Reads(0, Range(i))) << i;
}

TEST_F(ViewAccessBatchTest, APeerTheDriverRefusesLeavesTheOwnersAccess) {
  ViewAccessBatch batch(api_);
  MapPiece(batch, 0, DeviceSet::Of(0) | DeviceSet::Of(1));
  MapPiece(batch, 1, DeviceSet::Of(0) | DeviceSet::Of(1));
  // The run, then piece 0 with the peer: refused (each failure counts the
  // calls the one before it let pass); piece 0 for its owner and piece 1
  // with the peer: given.
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_INVALID_DEVICE);
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_INVALID_DEVICE);
  EXPECT_TRUE(batch.Flush().empty());
  sim::ClearFailures();
  EXPECT_TRUE(Reads(0, Range(0)));
  EXPECT_FALSE(Reads(1, Range(0)));
  EXPECT_TRUE(Reads(0, Range(1)));
  EXPECT_TRUE(Reads(1, Range(1)));
}

TEST_F(ViewAccessBatchTest, ARangeRefusedEvenForItsOwnerIsUnmappedAndReported) {
  ViewAccessBatch batch(api_);
  for (size_t i : {0, 1}) MapPiece(batch, i, DeviceSet::Of(0));
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);  // the run
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);  // piece 0
  const std::vector<ViewAccessBatch::Refused> refused = batch.Flush();
  sim::ClearFailures();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].va, Range(0));
  EXPECT_EQ(refused[0].size, kPiece);
  EXPECT_TRUE(refused[0].unmapped);
  EXPECT_EQ(ToCuResult(refused[0].status), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(sim::GetUsage().mappings, 1u);  // piece 1's alone
  EXPECT_FALSE(Reads(0, Range(0)));
  EXPECT_TRUE(Reads(0, Range(1)));
}

// What the note is for: another library's handles side by side in one
// reservation, as PyTorch's expandable segments map them. From the second
// pause on (the host memory kept by the first), the views of the eight
// handles get their access in one call, and the contents are all there.
TEST_F(ViewAccessBatchTest, APauseOfAdjacentHandlesGivesTheirViewsAccessInOneCall) {
  {
    ShimCore shim(api_);
    ForeignVmm& f = shim.foreign();
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemAccessDesc desc = {};
    desc.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::vector<CUmemGenericAllocationHandle> segment(8);
    for (size_t i = 0; i < segment.size(); ++i) {
      ASSERT_EQ(f.Create(&segment[i], kPiece, &prop, 0, "kv"), CUDA_SUCCESS);
      ASSERT_EQ(f.Map(Range(i), kPiece, 0, segment[i], 0), CUDA_SUCCESS);
      ASSERT_EQ(f.SetAccess(Range(i), kPiece, &desc, 1), CUDA_SUCCESS);
      Fill(Range(i), kPiece, static_cast<int>(i));
    }
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    sim::ResetCallCounts();
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 1u);
    for (size_t i = 0; i < segment.size(); ++i) {
      EXPECT_TRUE(Holds(Range(i), kPiece, static_cast<int>(i))) << i;
    }
    Fill(Range(3), kPiece, 9);  // written while paused
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(Range(3), kPiece, 9));
    EXPECT_TRUE(Holds(Range(7), kPiece, 7));
    for (size_t i = 0; i < segment.size(); ++i) {
      ASSERT_EQ(f.Unmap(Range(i), kPiece), CUDA_SUCCESS);
      ASSERT_EQ(f.Release(segment[i]), CUDA_SUCCESS);
    }
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
}

}  // namespace
}  // namespace vmmshim
