// The peer-mapping overhead comparison: one scripted workload on 4 and 8
// simulated GPUs under each policy, with "all" (what
// cudaDeviceEnablePeerAccess does) as the baseline. Prints the table that
// docs/peer-access.md reproduces:
//   build/tests/vmmshim_unit_tests --gtest_filter='PeerOverhead*'
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/allocator.h"
#include "core/shim_core.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct Row {
  std::string policy;
  int gpus;
  uint64_t set_access_calls;
  uint64_t enable_calls;  // cuMemSetAccess calls made by the enables themselves
  uint64_t peer_bytes;
  double mappings_per_device;
  uint64_t peer_readable;  // (allocation, peer) pairs a peer can read
  uint64_t pairs;
};

struct Alloc {
  CUdeviceptr ptr;
  size_t bytes;
  int owner;
};

// Runs the workload on `gpus` simulated GPUs under `policy_name`, checks
// every (allocation, peer) pair against the policy and fills `row`.
// `stream_ordered`: the allocations are cuMemAllocAsync on each device's
// default pool, and peers get access with cuMemPoolSetAccess (the pool's
// peer event) instead of cuCtxEnablePeerAccess.
void RunWorkload(int gpus, const std::string& policy_name, Row* row,
                 bool stream_ordered = false) {
  sim::SimOptions o;
  o.device_count = gpus;
  o.memory_per_device = size_t{4} << 30;
  sim::Reset(o);
  ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
  DriverApi api = sim::Api();
  AllocatorOptions options;
  options.peer_policy = TestPeerPolicy(policy_name, gpus);
  ShimCore shim(api, options);
  Allocator& a = shim.allocator();
  std::vector<CUcontext> ctx(gpus);
  std::vector<CUstream> stream(gpus);
  std::vector<CUmemoryPool> pool(gpus);
  for (int d = 0; d < gpus; ++d) {
    ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx[d], d), 0);
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx[d]), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuStreamCreate(&stream[d], 0), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuDeviceGetDefaultMemPool(&pool[d], d), CUDA_SUCCESS);
  }
  auto alloc = [&](int d, size_t bytes) {
    return stream_ordered ? shim.stream_ordered().AllocateAsync(bytes, stream[d], false, nullptr) : a.Allocate(bytes);
  };

  std::vector<Alloc> allocs;
  auto allocate = [&](int small, int large) {
    for (int d = 0; d < gpus; ++d) {
      ASSERT_EQ(sim::cuCtxSetCurrent(ctx[d]), CUDA_SUCCESS);
      for (int i = 0; i < small; ++i) {
        size_t bytes = 256 + (i * 37) % 3841;  // 256 B .. 4 KiB
        auto r = alloc(d, bytes);
        ASSERT_TRUE(r.ok() && r->served);
        allocs.push_back({r->ptr, bytes, d});
      }
      for (int i = 0; i < large; ++i) {
        size_t bytes = (size_t{2} + (i * 7) % 63) * kMiB;  // 2 .. 64 MiB
        auto r = alloc(d, bytes);
        ASSERT_TRUE(r.ok() && r->served);
        allocs.push_back({r->ptr, bytes, d});
      }
    }
  };
  sim::ResetCallCounts();
  allocate(10000, 64);
  // Before any enable no peer reads anything (as natively).
  for (size_t i = 0; i < allocs.size(); i += 97) {
    char c;
    EXPECT_NE(sim::DeviceRead((allocs[i].owner + 1) % gpus, &c, allocs[i].ptr, 1), CUDA_SUCCESS);
  }
  const uint64_t before_enables = sim::CallCount("cuMemSetAccess");
  for (int owner = 0; owner < gpus; ++owner) {
    for (int peer = 0; peer < gpus; ++peer) {
      if (peer == owner) continue;
      if (stream_ordered) {
        CUmemAccessDesc desc{};
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = peer;
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        ASSERT_EQ(sim::cuMemPoolSetAccess(pool[owner], &desc, 1), CUDA_SUCCESS);
        ASSERT_TRUE(shim.stream_ordered().PoolAccessChanged(pool[owner], &desc, 1).ok());
      } else {
        ASSERT_TRUE(shim.peers().EnablePeer(peer, owner).ok());
      }
    }
  }
  const uint64_t enable_calls = sim::CallCount("cuMemSetAccess") - before_enables;
  // Batched: at most one call per enabled pair here (each device's blocks
  // are contiguous), never one per allocation.
  EXPECT_LE(enable_calls, static_cast<uint64_t>(gpus * (gpus - 1)));
  allocate(1000, 8);

  *row = Row{policy_name, gpus, sim::CallCount("cuMemSetAccess"), enable_calls, 0, 0, 0, 0};
  for (int d = 0; d < gpus; ++d) {
    row->peer_bytes += sim::PeerMappedBytes(d);
    row->mappings_per_device += static_cast<double>(sim::MappingsOwnedBy(d)) / gpus;
  }
  // Every (allocation, peer) pair: readable exactly when the policy allows.
  uint64_t expected_bytes = 0;
  for (const Alloc& al : allocs) {
    for (int peer = 0; peer < gpus; ++peer) {
      if (peer == al.owner) continue;
      const bool allowed = options.peer_policy.Allows(al.owner, peer, al.bytes, "");
      char c;
      const bool readable = sim::DeviceRead(peer, &c, al.ptr + al.bytes - 1, 1) == CUDA_SUCCESS;
      ASSERT_EQ(readable, allowed) << policy_name << " owner " << al.owner << " peer " << peer
                                   << " bytes " << al.bytes;
      row->peer_readable += readable;
      ++row->pairs;
    }
  }
  for (const DeviceStats& st : shim.control().GetStats().devices) {
    for (int p = 0; p < gpus; ++p) expected_bytes += st.peers[p].mapped_bytes;
  }
  EXPECT_EQ(row->peer_bytes, expected_bytes);
  if (policy_name == "none") {
    EXPECT_EQ(row->peer_bytes, 0u);
  }
  if (policy_name == "all") {
    EXPECT_EQ(row->peer_readable, row->pairs);
  }
}

void PrintTable(bool stream_ordered) {
  std::vector<Row> table;
  for (int gpus : {4, 8}) {
    for (const char* policy : {"all", "none", "min-size 1MiB", "rules: ring"}) {
      Row row;
      RunWorkload(gpus, policy, &row, stream_ordered);
      if (::testing::Test::HasFatalFailure()) return;
      table.push_back(row);
    }
  }
  std::printf("\nPeer-mapping overhead%s: per device 10,000 small (256 B-4 KiB) + 64 large "
              "(2-64 MiB)\nallocations, peer access %s between all pairs, then 1,000 small "
              "+ 8 large more.\n\n",
              stream_ordered ? " of stream-ordered memory (cuMemAllocAsync)" : "",
              stream_ordered ? "given to the default pools (cuMemPoolSetAccess)" : "enabled");
  std::printf("| GPUs | policy | cuMemSetAccess calls (by the enables) | bytes mapped into "
              "peers | vs all | mappings per device | peer-readable (allocation, peer) pairs |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : table) {
    uint64_t base = 0;
    for (const Row& b : table) {
      if (b.gpus == r.gpus && b.policy == "all") base = b.peer_bytes;
    }
    std::printf("| %d | %s | %llu (%llu) | %s | %s | %.1f | %llu of %llu |\n", r.gpus,
                r.policy.c_str(), static_cast<unsigned long long>(r.set_access_calls),
                static_cast<unsigned long long>(r.enable_calls),
                absl::StrFormat("%.2f GiB", r.peer_bytes / double(size_t{1} << 30)).c_str(),
                base ? absl::StrFormat("%.1f%%", 100.0 * r.peer_bytes / base).c_str() : "-",
                r.mappings_per_device, static_cast<unsigned long long>(r.peer_readable),
                static_cast<unsigned long long>(r.pairs));
  }
}

TEST(PeerOverheadTest, TableOn4And8Gpus) { PrintTable(/*stream_ordered=*/false); }

// The same workload as stream-ordered memory: natively, cuMemPoolSetAccess
// maps every allocation of the pool into the peer ("all").
TEST(PeerOverheadTest, StreamOrderedTableOn4And8Gpus) { PrintTable(/*stream_ordered=*/true); }

}  // namespace
}  // namespace vmmshim
