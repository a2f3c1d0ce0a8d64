// Multi-GPU behaviour at 4, 8 and 10 simulated GPUs, the parts of the
// multi-GPU runs (tools/gpu/multi-gpu-run.sh, docs/multi-gpu.md) that do not need
// the real hardware: cudaDeviceEnablePeerAccess for every ordered pair
// through the shim's enable path (core/peer/enable/peer_enable.h), the driver's
// peer-connection limit (CUDA_ERROR_TOO_MANY_PEERS, modelled by the simulated
// driver), cold allocations with 0..N-1 peers enabled, and default pools
// made accessible to 1..N-1 peers. Counts and access, not timings.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/peer/enable/peer_contexts.h"
#include "core/peer/enable/peer_enable.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

class MultiGpuTest : public ::testing::Test {
 protected:
  void TearDown() override { core_.reset(); }

  void Start(int gpus, const std::string& policy) {
    core_.reset();  // before the driver state it holds goes
    sim::SimOptions o;
    o.device_count = gpus;
    o.memory_per_device = size_t{4} << 30;
    sim::Reset(o);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    api_ = sim::Api();
    AllocatorOptions options;
    options.peer_policy = TestPeerPolicy(policy, gpus);
    policy_ = options.peer_policy;
    core_ = std::make_unique<ShimCore>(api_, options);
    contexts_ = std::make_unique<PeerContexts>();
    primary_.assign(gpus, nullptr);
    for (int d = 0; d < gpus; ++d) {
      ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&primary_[d], d), CUDA_SUCCESS);
    }
  }
  void MakeCurrent(int device) {
    ASSERT_EQ(sim::cuCtxSetCurrent(primary_[device]), CUDA_SUCCESS);
  }
  CUdeviceptr Allocate(int device, size_t bytes) {
    MakeCurrent(device);
    absl::StatusOr<Allocator::Allocation> a = core_->allocator().Allocate(bytes);
    EXPECT_TRUE(a.ok() && a->served) << a.status();
    return a.ok() ? a->ptr : 0;
  }
  // cuCtxEnablePeerAccess(owner's primary context) from `reader`'s, as the
  // interposed entry point performs it.
  CUresult Enable(int reader, int owner, PeerEnableMode mode = PeerEnableMode::kDriver) {
    MakeCurrent(reader);
    return PeerEnable(api_, core_->peers(), core_->peer_enables(), *contexts_, mode).Enable(primary_[owner], 0);
  }
  // One allocation of `bytes` on each device, by device.
  std::vector<CUdeviceptr> OnePerDevice(size_t bytes) {
    std::vector<CUdeviceptr> owned;
    for (int d = 0; d < static_cast<int>(primary_.size()); ++d) owned.push_back(Allocate(d, bytes));
    return owned;
  }
  static bool Readable(int device, CUdeviceptr ptr, size_t bytes) {
    char c;
    return sim::DeviceRead(device, &c, ptr, 1) == CUDA_SUCCESS &&
           sim::DeviceRead(device, &c, ptr + bytes - 1, 1) == CUDA_SUCCESS;
  }

  DriverApi api_;
  PeerPolicy policy_;
  std::unique_ptr<ShimCore> core_;
  std::unique_ptr<PeerContexts> contexts_;
  std::vector<CUcontext> primary_;
};

struct Owned {
  CUdeviceptr ptr;
  size_t bytes;
  int owner;
};

// Every ordered pair enables through the shim, with live allocations of
// both kinds on every device: on 4 and 8 GPUs every enable succeeds (seven
// peers each, under the limit of eight), and afterwards each (allocation,
// reader) pair is readable exactly when the policy allows it.
TEST_F(MultiGpuTest, EveryOrderedPairEnablesOn4And8Gpus) {
  for (int gpus : {4, 8}) {
    for (const char* policy : {"all", "none", "min-size 1MiB"}) {
      SCOPED_TRACE(std::to_string(gpus) + " GPUs, " + policy);
      Start(gpus, policy);
      std::vector<Owned> owned;
      for (int d = 0; d < gpus; ++d) {
        for (int i = 0; i < 20; ++i) owned.push_back({Allocate(d, 256 * kKiB), 256 * kKiB, d});
        owned.push_back({Allocate(d, 4 * kMiB), 4 * kMiB, d});
      }
      sim::ResetCallCounts();
      for (int reader = 0; reader < gpus; ++reader) {
        for (int owner = 0; owner < gpus; ++owner) {
          if (owner != reader) {
            EXPECT_EQ(Enable(reader, owner), CUDA_SUCCESS);
          }
        }
      }
      EXPECT_EQ(sim::CallCount("cuCtxEnablePeerAccess"), uint64_t(gpus * (gpus - 1)));
      // Batched: at most one cuMemSetAccess per pair (each device's blocks
      // are contiguous here), never one per allocation.
      EXPECT_LE(sim::CallCount("cuMemSetAccess"), uint64_t(gpus * (gpus - 1)));
      if (std::string(policy) == "none") {
        EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 0u);
      }
      for (const Owned& o : owned) {
        for (int reader = 0; reader < gpus; ++reader) {
          if (reader == o.owner) continue;
          EXPECT_EQ(Readable(reader, o.ptr, o.bytes), policy_.Allows(o.owner, reader, o.bytes, ""))
              << "owner " << o.owner << " reader " << reader << " bytes " << o.bytes;
        }
      }
    }
  }
}

// On 10 GPUs the driver refuses the ninth peer connection of a device
// (CUDA_ERROR_TOO_MANY_PEERS, NVIDIA/nccl#241). Through the shim every pair
// gets exactly the driver's code of a native run in the same order, and a
// refused pair grants nothing: its reader cannot read the owner's memory,
// while every accepted pair can.
TEST_F(MultiGpuTest, TheDriversPeerLimitGivesTheSameCodesThroughTheShim) {
  constexpr int kGpus = 10;
  // Natively: the simulated driver alone, the same order of enables.
  Start(kGpus, "all");
  std::map<std::pair<int, int>, CUresult> native;
  for (int reader = 0; reader < kGpus; ++reader) {
    MakeCurrent(reader);
    for (int owner = 0; owner < kGpus; ++owner) {
      if (owner != reader) {
        native[std::make_pair(reader, owner)] = sim::cuCtxEnablePeerAccess(primary_[owner], 0);
      }
    }
  }
  int refused = 0;
  for (const auto& [pair, code] : native) {
    EXPECT_TRUE(code == CUDA_SUCCESS || code == CUDA_ERROR_TOO_MANY_PEERS) << code;
    refused += code == CUDA_ERROR_TOO_MANY_PEERS;
  }
  ASSERT_GT(refused, 0);  // the limit is reached on 10 GPUs
  std::printf("10 simulated GPUs, every ordered pair enabled in order: %d of 90 refused with "
              "CUDA_ERROR_TOO_MANY_PEERS\n", refused);

  Start(kGpus, "all");
  const std::vector<CUdeviceptr> owned = OnePerDevice(4 * kMiB);
  for (int reader = 0; reader < kGpus; ++reader) {
    for (int owner = 0; owner < kGpus; ++owner) {
      if (owner == reader) continue;
      const CUresult want = native.at(std::make_pair(reader, owner));
      EXPECT_EQ(Enable(reader, owner), want) << reader << "->" << owner;
    }
  }
  for (int reader = 0; reader < kGpus; ++reader) {
    for (int owner = 0; owner < kGpus; ++owner) {
      if (owner == reader) continue;
      const bool enabled = native.at(std::make_pair(reader, owner)) == CUDA_SUCCESS;
      EXPECT_EQ(Readable(reader, owned[owner], 4 * kMiB), enabled) << reader << "->" << owner;
      absl::StatusOr<bool> has = core_->peers().PeerHasAccess(owned[owner], reader);
      ASSERT_TRUE(has.ok()) << has.status();
      EXPECT_EQ(*has, enabled) << reader << "->" << owner;
    }
  }
  // A refused enable left no count behind: disabling it is "not enabled".
  for (const auto& [pair, code] : native) {
    if (code != CUDA_ERROR_TOO_MANY_PEERS) continue;
    MakeCurrent(pair.first);
    EXPECT_EQ(PeerEnable(api_, core_->peers(), core_->peer_enables(), *contexts_, PeerEnableMode::kDriver)
                  .Disable(primary_[pair.second]),
              CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    break;
  }
}

// The simulated driver's connection limit itself: a ninth peer of one device
// is refused, and a reset primary context loses its peer access (the
// connections are free again, and enabling a pair once more succeeds).
TEST_F(MultiGpuTest, SimulatedPeerLimitAndPrimaryContextReset) {
  Start(10, "all");
  MakeCurrent(0);
  for (int p = 1; p <= 8; ++p) EXPECT_EQ(sim::cuCtxEnablePeerAccess(primary_[p], 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuCtxEnablePeerAccess(primary_[9], 0), CUDA_ERROR_TOO_MANY_PEERS);
  // Device 9 cannot take device 0 as a peer either: device 0 has eight.
  MakeCurrent(9);
  EXPECT_EQ(sim::cuCtxEnablePeerAccess(primary_[0], 0), CUDA_ERROR_TOO_MANY_PEERS);
  // The other direction of an existing connection is no new connection.
  MakeCurrent(1);
  EXPECT_EQ(sim::cuCtxEnablePeerAccess(primary_[0], 0), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&primary_[0], 0), CUDA_SUCCESS);
  MakeCurrent(0);
  EXPECT_EQ(sim::cuCtxEnablePeerAccess(primary_[9], 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuCtxEnablePeerAccess(primary_[1], 0), CUDA_SUCCESS);
}

// VMMSHIM_PEER_ENABLE_DRIVER=0: the shim never asks the driver to enable, so
// the driver's connection limit is not reached and all 90 pairs of 10 GPUs
// are enabled with the shim's VMM grants. (Whether real hardware maps VMM
// memory into more than eight peers is not known here: no machine with more
// than 8 GPUs was run.)
TEST_F(MultiGpuTest, EmulatedEnablesAreNotLimitedByTheDriversConnections) {
  constexpr int kGpus = 10;
  Start(kGpus, "all");
  const std::vector<CUdeviceptr> owned = OnePerDevice(4 * kMiB);
  for (int reader = 0; reader < kGpus; ++reader) {
    for (int owner = 0; owner < kGpus; ++owner) {
      if (owner == reader) continue;
      EXPECT_EQ(Enable(reader, owner, PeerEnableMode::kEmulated), CUDA_SUCCESS);
      EXPECT_TRUE(Readable(reader, owned[owner], 4 * kMiB)) << reader << "->" << owner;
    }
  }
  EXPECT_EQ(sim::CallCount("cuCtxEnablePeerAccess"), 0u);
}

// A cold allocation (the cache released first) on device 0 with k peers
// enabled: one cuMemCreate, one cuMemMap and one cuMemSetAccess whatever k
// (the owner and the policy's peers in one call), readable by exactly the
// enabled peers the policy allows. Natively the driver maps the allocation
// into each enabled peer; the shim's cost per cold allocation does not grow
// with calls, only with what the one cuMemSetAccess does.
TEST_F(MultiGpuTest, ColdAllocationWithKPeersIsOneCreateMapAndSetAccess) {
  constexpr int kGpus = 8;
  for (const char* policy : {"all", "none", "min-size 1MiB"}) {
    SCOPED_TRACE(policy);
    Start(kGpus, policy);
    for (int k = 0; k < kGpus; ++k) {
      if (k > 0) {
        ASSERT_EQ(Enable(k, 0), CUDA_SUCCESS);
      }
      for (size_t bytes : {size_t{256}, 2 * kMiB, 64 * kMiB}) {
        SCOPED_TRACE(std::to_string(k) + " peers, " + std::to_string(bytes) + " bytes");
        core_->control().Trim(0);
        sim::ResetCallCounts();
        const CUdeviceptr p = Allocate(0, bytes);
        EXPECT_EQ(sim::CallCount("cuMemCreate"), 1u);
        EXPECT_EQ(sim::CallCount("cuMemMap"), 1u);
        EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 1u);
        for (int peer = 1; peer < kGpus; ++peer) {
          EXPECT_EQ(Readable(peer, p, bytes), peer <= k && policy_.Allows(0, peer, bytes, ""))
              << "peer " << peer;
        }
        MakeCurrent(0);
        ASSERT_TRUE(core_->allocator().Free(p).ok());
      }
    }
  }
}

// Device 0's default pool made accessible to 1..N-1 peers
// (cuMemPoolSetAccess, the peer event of stream-ordered memory): a new
// stream-ordered allocation is readable by exactly the peers given access
// that the policy allows, and cudaMalloc memory is not touched by it.
TEST_F(MultiGpuTest, PoolAccessToKPeersOn8Gpus) {
  constexpr int kGpus = 8;
  for (const char* policy : {"all", "none", "min-size 1MiB"}) {
    SCOPED_TRACE(policy);
    Start(kGpus, policy);
    MakeCurrent(0);
    CUstream stream;
    ASSERT_EQ(sim::cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    CUmemoryPool pool;
    ASSERT_EQ(sim::cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    const CUdeviceptr plain = Allocate(0, 4 * kMiB);
    for (int k = 0; k < kGpus; ++k) {
      if (k > 0) {
        CUmemAccessDesc desc{};
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = k;
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        ASSERT_EQ(sim::cuMemPoolSetAccess(pool, &desc, 1), CUDA_SUCCESS);
        ASSERT_TRUE(core_->stream_ordered().PoolAccessChanged(pool, &desc, 1).ok());
      }
      for (size_t bytes : {size_t{256}, 2 * kMiB, 64 * kMiB}) {
        SCOPED_TRACE(std::to_string(k) + " peers, " + std::to_string(bytes) + " bytes");
        MakeCurrent(0);
        absl::StatusOr<Allocator::Allocation> a =
            core_->stream_ordered().AllocateAsync(bytes, stream, false, nullptr);
        ASSERT_TRUE(a.ok() && a->served) << a.status();
        for (int peer = 1; peer < kGpus; ++peer) {
          EXPECT_EQ(Readable(peer, a->ptr, bytes), peer <= k && policy_.Allows(0, peer, bytes, ""))
              << "peer " << peer;
          EXPECT_FALSE(Readable(peer, plain, 4 * kMiB)) << "peer " << peer;
        }
        ASSERT_TRUE(core_->allocator().FreeAsync(a->ptr, stream, false).ok());
      }
    }
    ASSERT_EQ(sim::cuStreamSynchronize(stream), CUDA_SUCCESS);
    ASSERT_TRUE(core_->allocator().Free(plain).ok());
  }
}

}  // namespace
}  // namespace vmmshim
