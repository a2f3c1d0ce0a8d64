// Concurrency stress on the simulated driver. First: 16 threads on 4 GPUs allocate,
// free (also each other's pointers), grant and revoke explicitly, while one
// thread enables and disables peer access; fixed seeds. Afterwards an
// invariant check: every live allocation is found whole, no two overlap, each
// peer's access is exactly the explicit grants (no peer is enabled at the
// end), and after freeing everything the driver holds nothing.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kDevices = 4;

struct Live {
  size_t bytes;
  int device;
  uint64_t granted = 0;  // explicit grants in force (large allocations only)
};

TEST(StressTest, SixteenThreadsFourGpus) {
  sim::SimOptions o;
  o.device_count = kDevices;
  o.memory_per_device = 2048 * kMiB;
  sim::Reset(o);
  ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
  DriverApi api = sim::Api();
  AllocatorOptions options;
  options.arenas = 4;  // threads share arenas and free into each other's
  options.peer_policy.kind = PeerPolicy::Kind::kMinSize;
  options.peer_policy.min_bytes = kMiB;
  ShimCore shim(api, options);
  Allocator& a = shim.allocator();

  std::mutex mu;  // guards `live` (the test's own bookkeeping)
  std::map<CUdeviceptr, Live> live;
  std::atomic<bool> failed{false};
  std::atomic<bool> stop{false};

  std::thread toggler([&] {  // enables and disables random pairs
    std::mt19937 rng(99);
    int enabled[kDevices][kDevices] = {};
    while (!stop) {
      const int owner = rng() % kDevices, peer = rng() % kDevices;
      if (owner == peer) continue;
      if (enabled[owner][peer] > 0 && rng() % 2) {
        failed = failed || !shim.peers().DisablePeer(peer, owner).ok();
        --enabled[owner][peer];
      } else if (enabled[owner][peer] < 2) {
        failed = failed || !shim.peers().EnablePeer(peer, owner).ok();
        ++enabled[owner][peer];
      }
    }
    for (int ow = 0; ow < kDevices; ++ow) {
      for (int p = 0; p < kDevices; ++p) {
        while (enabled[ow][p]-- > 0) failed = failed || !shim.peers().DisablePeer(p, ow).ok();
      }
    }
  });

  std::vector<std::thread> workers;
  for (int t = 0; t < 16; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      CUcontext ctx;
      const int device = t % kDevices;
      sim::cuDevicePrimaryCtxRetain(&ctx, device);
      sim::cuCtxSetCurrent(ctx);
      for (int i = 0; i < 1500 && !failed; ++i) {
        const int op = rng() % 10;
        if (op < 5) {
          const size_t bytes = rng() % 4 ? 256 + rng() % 16384 : kMiB + 1 + rng() % (6 * kMiB);
          absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes);
          if (!r.ok() || !r->served) {
            failed = true;
            break;
          }
          std::lock_guard<std::mutex> lock(mu);
          if (!live.emplace(r->ptr, Live{bytes, device}).second) failed = true;  // overlap
        } else if (op < 9) {
          CUdeviceptr victim = 0;
          {
            std::lock_guard<std::mutex> lock(mu);
            if (live.empty()) continue;
            auto it = live.begin();
            std::advance(it, rng() % live.size());
            victim = it->first;
            live.erase(it);  // ours to free now, whoever allocated it
          }
          if (!a.Free(victim).ok()) failed = true;
        } else {
          std::lock_guard<std::mutex> lock(mu);  // held so the allocation stays live
          if (live.empty()) continue;
          auto it = live.begin();
          std::advance(it, rng() % live.size());
          if (it->second.bytes <= kMiB) continue;  // explicit calls on large ones only
          const int peer = (it->second.device + 1 + rng() % (kDevices - 1)) % kDevices;
          const bool grant = rng() % 2;
          absl::Status s = grant ? shim.peers().SetPeerAccess(it->first, peer, true) : shim.peers().SetPeerAccess(it->first, peer, false);
          if (!s.ok()) failed = true;
          const uint64_t bit = uint64_t{1} << peer;
          it->second.granted = grant ? (it->second.granted | bit) : (it->second.granted & ~bit);
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  stop = true;
  toggler.join();
  ASSERT_FALSE(failed);

  // Invariants.
  CUdeviceptr end_of_previous = 0;
  for (const auto& [ptr, l] : live) {
    EXPECT_GE(ptr, end_of_previous) << "overlap";
    end_of_previous = ptr + l.bytes;
    absl::StatusOr<PointerInfo> info = a.Find(ptr + l.bytes - 1);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->allocation_base, ptr);
    EXPECT_EQ(info->allocation_size, l.bytes);
    EXPECT_EQ(info->device, l.device);
    for (int peer = 0; peer < kDevices; ++peer) {
      if (peer == l.device) continue;
      char c;
      const bool readable = sim::DeviceRead(peer, &c, ptr, 1) == CUDA_SUCCESS;
      EXPECT_EQ(readable, (l.granted >> peer & 1) != 0)
          << "peer " << peer << " on a " << l.bytes << "-byte allocation of device " << l.device;
    }
  }
  EXPECT_EQ(shim.control().GetStats().live_allocations, live.size());
  for (const auto& [ptr, l] : live) ASSERT_TRUE(a.Free(ptr).ok());
  shim.control().Trim();
  ASSERT_TRUE(shim.ReleaseAll().ok());
  const sim::Usage u = sim::GetUsage();
  EXPECT_EQ(u.handles, 0u);
  EXPECT_EQ(u.host_handles, 0u);
  EXPECT_EQ(u.mappings, 0u);
  EXPECT_EQ(u.reservations, 0u);
}

}  // namespace
}  // namespace vmmshim

namespace vmmshim {
namespace {

// The first failure seen by any thread.
struct Why {
  std::mutex mu;
  std::string first;
};
void Note(Why* why, const std::string& what) {
  std::lock_guard<std::mutex> lock(why->mu);
  if (why->first.empty()) why->first = what;
}

// Captures begin and end (alternating relaxed and global mode, as the hook
// makes them: inside the tracker's gate) while six threads allocate and
// free: every call either succeeds or gets the driver's
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (a refused free leaves the
// allocation live, to be freed later); afterwards nothing is deferred,
// nothing is live, and the driver holds nothing.
TEST(StressTest, AllocationsAndFreesDuringCapturesOnSixThreads) {
  constexpr int kWorkers = 6;
  sim::SimOptions o;
  o.device_count = 1;
  o.memory_per_device = 4096 * kMiB;
  sim::Reset(o);
  ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
  DriverApi api = sim::Api();
  ShimCore shim(api);
  Allocator& a = shim.allocator();
  CUcontext ctx = nullptr;
  ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  std::atomic<bool> stop{false}, failed{false};
  Why why;
  std::thread capturer([&] {
    const CUstream s = reinterpret_cast<CUstream>(0x77);
    for (int i = 0; i < 300; ++i) {
      const CUstreamCaptureMode mode =
          i % 3 == 0 ? CU_STREAM_CAPTURE_MODE_GLOBAL : CU_STREAM_CAPTURE_MODE_RELAXED;
      // As the hook does: the driver's begin inside the tracker's gate.
      if (shim.captures().BeginCapture(s, false, [&] {
            return sim::cuStreamBeginCapture_v2(s, mode);
          }) != CUDA_SUCCESS) {
        Note(&why, "begin capture failed");
        failed = true;
      }
      std::this_thread::yield();
      CUgraph graph = nullptr;
      sim::cuStreamEndCapture(s, &graph);
      a.CaptureEnded(s, false);
      // Captures are short and apart, as a framework makes them; frees
      // between them complete what was deferred during them.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    stop = true;
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kWorkers; ++t) {
    workers.emplace_back([&, t] {
      ASSERT_EQ(sim::cuCtxSetCurrent(ctx), CUDA_SUCCESS);
      std::mt19937 rng(100 + t);
      std::vector<CUdeviceptr> mine;
      const size_t sizes[] = {256, 4096, 100000, kMiB, 3 * kMiB};
      for (int i = 0; i < 3000 || !stop; ++i) {
        // Pauses leave the capturing thread time to end its captures on a
        // machine with fewer cores than threads.
        if (i % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
        if (mine.size() < 16 && rng() % 2 == 0) {
          absl::StatusOr<Allocator::Allocation> r = a.Allocate(sizes[rng() % 5]);
          if (r.ok() && r->served) {
            mine.push_back(r->ptr);
          } else if (ToCuResult(r.status()) != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
            const AllocatorStats st = shim.control().GetStats();
            Note(&why, "allocate: " + r.status().ToString() + " live " +
                           std::to_string(st.live_bytes) + " handles " +
                           std::to_string(st.handle_bytes) + " deferred " +
                           std::to_string(st.deferred_frees) + " peak " + std::to_string(st.peak_handle_bytes) + " cached " +
                           std::to_string(shim.control().IdleBytes(0)) + " sim in use " +
                           std::to_string(sim::DeviceBytesInUse(0)));
            failed = true;
          }
        } else if (!mine.empty()) {
          const size_t k = rng() % mine.size();
          absl::Status s = a.Free(mine[k]);
          if (s.ok()) {
            mine[k] = mine.back();
            mine.pop_back();
          } else if (ToCuResult(s) != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
            Note(&why, "free: " + s.ToString());
            failed = true;
          }
        }
        if (i > 100000) break;  // the capturer is stuck: fail below rather than hang
      }
      for (CUdeviceptr p : mine) {
        absl::Status s = a.Free(p);
        if (!s.ok()) {
          Note(&why, "final free: " + s.ToString());
          failed = true;
        }
      }
    });
  }
  capturer.join();
  for (auto& w : workers) w.join();
  ASSERT_FALSE(failed) << why.first;
  EXPECT_FALSE(shim.captures().any());
  shim.control().Trim();  // completes what the last captures deferred, then releases the cache
  const AllocatorStats s = shim.control().GetStats();
  EXPECT_EQ(s.deferred_frees, 0u);
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.handles, 0u);
  EXPECT_EQ(sim::DeviceBytesInUse(0), 0u);
}

}  // namespace
}  // namespace vmmshim
