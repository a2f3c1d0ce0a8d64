// core/peer/enable/peer_enable.h on the simulated driver: cuCtxEnablePeerAccess and
// cuCtxDisablePeerAccess as the shim performs them, with the driver deciding
// (VMMSHIM_PEER_ENABLE_DRIVER=1) and emulated (0).
#include "core/peer/enable/peer_enable.h"

#include <memory>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "core/peer/enable/peer_contexts.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kBytes = 4 * kMiB;

class PeerEnableTest : public ::testing::Test {
 protected:
  void SetUp() override { SetUpSim({}); }
  void SetUpSim(std::vector<std::pair<int, int>> pairs_without_p2p) {
    core_.reset();  // before the driver state it holds goes
    sim::SimOptions o;
    o.device_count = 3;
    o.memory_per_device = 1024 * kMiB;
    o.pairs_without_p2p = std::move(pairs_without_p2p);
    sim::Reset(o);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    api_ = sim::Api();
    AllocatorOptions options;
    options.peer_policy.kind = PeerPolicy::Kind::kAll;  // every enable grants
    core_ = std::make_unique<ShimCore>(api_, options);
    contexts_ = std::make_unique<PeerContexts>();
    for (int d = 0; d < o.device_count; ++d) {
      ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&primary_[d], d), CUDA_SUCCESS);
    }
    // Device 1's memory, allocated in its primary context; device 0 current.
    MakeCurrent(primary_[1]);
    absl::StatusOr<Allocator::Allocation> a = core_->allocator().Allocate(kBytes);
    ASSERT_TRUE(a.ok() && a->served) << a.status();
    owned_ = a->ptr;
    MakeCurrent(primary_[0]);
    sim::ResetCallCounts();
  }
  static void MakeCurrent(CUcontext ctx) { ASSERT_EQ(sim::cuCtxSetCurrent(ctx), CUDA_SUCCESS); }
  PeerEnable Peer(PeerEnableMode mode) const {
    return PeerEnable(api_, core_->peers(), core_->peer_enables(), *contexts_, mode);
  }
  // A simulated kernel on device 0 reads device 1's allocation.
  bool Device0CanRead() const {
    char c;
    return sim::DeviceRead(0, &c, owned_, 1) == CUDA_SUCCESS &&
           sim::DeviceRead(0, &c, owned_ + kBytes - 1, 1) == CUDA_SUCCESS;
  }

  DriverApi api_;
  std::unique_ptr<ShimCore> core_;
  std::unique_ptr<PeerContexts> contexts_;
  CUcontext primary_[3] = {};
  CUdeviceptr owned_ = 0;
};

TEST_F(PeerEnableTest, ContextDeviceAsksWithTheContextPushed) {
  CUdevice device = -1;
  EXPECT_EQ(ContextDevice(api_, primary_[2], &device), CUDA_SUCCESS);
  EXPECT_EQ(device, 2);
  CUcontext current = nullptr;
  ASSERT_EQ(sim::cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, primary_[0]);  // popped again
  EXPECT_EQ(ContextDevice(api_, nullptr, &device), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(PeerEnableTest, DriverModeGrantsAfterTheDriverAcceptsAndRevokesOnDisable) {
  PeerEnable peer = Peer(PeerEnableMode::kDriver);
  EXPECT_FALSE(Device0CanRead());
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::CallCount("cuCtxEnablePeerAccess"), 1u);
  EXPECT_TRUE(Device0CanRead());
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_SUCCESS);
  EXPECT_EQ(sim::CallCount("cuCtxDisablePeerAccess"), 1u);
  EXPECT_FALSE(Device0CanRead());
}

// The statistics' time in cuCtxEnablePeerAccess counts every call, the
// refused ones too (a program pays for those as well), in both modes.
TEST_F(PeerEnableTest, EveryEnableIsCountedAndTimed) {
  EXPECT_EQ(core_->control().GetStats().peer_enable_calls, 0u);
  EXPECT_EQ(Peer(PeerEnableMode::kDriver).Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(Peer(PeerEnableMode::kDriver).Enable(primary_[1], 0),
            CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  EXPECT_EQ(Peer(PeerEnableMode::kEmulated).Enable(primary_[2], 1), CUDA_ERROR_INVALID_VALUE);
  const AllocatorStats s = core_->control().GetStats();
  EXPECT_EQ(s.peer_enable_calls, 3u);
  EXPECT_GT(s.peer_enable_seconds, 0);
  EXPECT_LT(s.peer_enable_seconds, 10);
  EXPECT_EQ(Peer(PeerEnableMode::kDriver).Disable(primary_[1]), CUDA_SUCCESS);
  EXPECT_EQ(core_->control().GetStats().peer_enable_calls, 3u);  // disables are not enables
}

TEST_F(PeerEnableTest, DriverModeReturnsTheDriversCodesUnchanged) {
  PeerEnable peer = Peer(PeerEnableMode::kDriver);
  EXPECT_EQ(peer.Enable(primary_[1], 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(peer.Enable(nullptr, 0), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  sim::FailCall("cuCtxEnablePeerAccess", 1, CUDA_ERROR_TOO_MANY_PEERS);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_ERROR_TOO_MANY_PEERS);
  EXPECT_FALSE(Device0CanRead());  // no grant after a refusal
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 0u);
  ASSERT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_SUCCESS);
  EXPECT_FALSE(Device0CanRead());  // the refused second enable did not count
  sim::FailCall("cuCtxDisablePeerAccess", 1, CUDA_ERROR_UNKNOWN);
  ASSERT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_ERROR_UNKNOWN);
  EXPECT_TRUE(Device0CanRead());  // a failed disable revokes nothing
}

TEST_F(PeerEnableTest, DriverModeUnsupportedPairIsTheDriversAnswer) {
  SetUpSim({{0, 1}});
  EXPECT_EQ(Peer(PeerEnableMode::kDriver).Enable(primary_[1], 0),
            CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  EXPECT_FALSE(Device0CanRead());
}

TEST_F(PeerEnableTest, DriverModeGrantFailureRollsBackTheDriversEnable) {
  PeerEnable peer = Peer(PeerEnableMode::kDriver);
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_ERROR_OUT_OF_MEMORY);  // the grant's code
  EXPECT_EQ(sim::CallCount("cuCtxEnablePeerAccess"), 1u);
  EXPECT_EQ(sim::CallCount("cuCtxDisablePeerAccess"), 1u);  // the rollback
  EXPECT_FALSE(Device0CanRead());
  // The driver's pair was undone: a retry is a fresh enable, not "already".
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_TRUE(Device0CanRead());
}

TEST_F(PeerEnableTest, EmulatedModeNeverAsksTheDriverToEnable) {
  PeerEnable peer = Peer(PeerEnableMode::kEmulated);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_TRUE(Device0CanRead());
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_SUCCESS);
  EXPECT_FALSE(Device0CanRead());
  EXPECT_EQ(sim::CallCount("cuCtxEnablePeerAccess"), 0u);
  EXPECT_EQ(sim::CallCount("cuCtxDisablePeerAccess"), 0u);
}

TEST_F(PeerEnableTest, EmulatedModeGivesTheDriversCodes) {
  PeerEnable peer = Peer(PeerEnableMode::kEmulated);
  EXPECT_EQ(peer.Enable(primary_[1], 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(peer.Enable(nullptr, 0), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(peer.Disable(nullptr), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  ASSERT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_SUCCESS);
  EXPECT_FALSE(Device0CanRead());  // the refused second enable did not count
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  // No current context; flags are checked first, as the driver does.
  MakeCurrent(nullptr);
  CUcontext current = primary_[0];
  ASSERT_EQ(sim::cuCtxGetCurrent(&current), CUDA_SUCCESS);
  ASSERT_EQ(current, nullptr);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(peer.Enable(primary_[1], 2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(PeerEnableTest, EmulatedModeUnsupportedPairIsNotRecorded) {
  SetUpSim({{0, 1}});
  PeerEnable peer = Peer(PeerEnableMode::kEmulated);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  EXPECT_FALSE(Device0CanRead());
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
}

TEST_F(PeerEnableTest, EmulatedModeGrantFailureLeavesThePairDisabled) {
  PeerEnable peer = Peer(PeerEnableMode::kEmulated);
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_FALSE(Device0CanRead());
  EXPECT_EQ(peer.Disable(primary_[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  EXPECT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
  EXPECT_TRUE(Device0CanRead());
}

TEST_F(PeerEnableTest, EnablesOfTwoContextsOfOneDeviceNest) {
  for (PeerEnableMode mode : {PeerEnableMode::kDriver, PeerEnableMode::kEmulated}) {
    SCOPED_TRACE(mode == PeerEnableMode::kDriver ? "driver" : "emulated");
    SetUpSim({});
    PeerEnable peer = Peer(mode);
    CUcontext created;  // a second context of device 0
    ASSERT_EQ(sim::cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
    MakeCurrent(created);
    ASSERT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);
    MakeCurrent(primary_[0]);
    ASSERT_EQ(peer.Enable(primary_[1], 0), CUDA_SUCCESS);  // another pair: not "already"
    EXPECT_TRUE(Device0CanRead());
    MakeCurrent(created);
    ASSERT_EQ(peer.Disable(primary_[1]), CUDA_SUCCESS);
    EXPECT_TRUE(Device0CanRead());  // one enable of the device pair is left
    MakeCurrent(primary_[0]);
    ASSERT_EQ(peer.Disable(primary_[1]), CUDA_SUCCESS);
    EXPECT_FALSE(Device0CanRead());
    ASSERT_EQ(sim::cuCtxDestroy_v2(created), CUDA_SUCCESS);
  }
}

}  // namespace
}  // namespace vmmshim
