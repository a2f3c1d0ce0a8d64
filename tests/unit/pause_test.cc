// Pause and resume by tag (Allocator::PauseMemory / ResumeMemory,
// docs/pause-resume.md) on the simulated driver: memory released and
// addresses kept, contents restored, access as if never paused, the error
// codes, failures leaving nothing half done, and concurrency.
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class PauseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim::SimOptions o;
    o.device_count = 2;
    o.memory_per_device = 256 * kMiB;
    sim::Reset(o);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    MakeCurrent(0);
    api_ = sim::Api();
  }
  void MakeCurrent(int device) {
    CUcontext ctx;
    ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  }
  CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  // Fills with a pattern of `seed`; Check compares.
  static void Fill(CUdeviceptr p, size_t bytes, int seed) {
    std::vector<unsigned char> v(bytes);
    for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 13 + seed);
    ASSERT_EQ(sim::DeviceWrite(0, p, v.data(), bytes), CUDA_SUCCESS);
  }
  static bool Holds(CUdeviceptr p, size_t bytes, int seed) {
    std::vector<unsigned char> v(bytes);
    if (sim::DeviceRead(0, v.data(), p, bytes) != CUDA_SUCCESS) return false;
    for (size_t i = 0; i < bytes; ++i) {
      if (v[i] != static_cast<unsigned char>(i * 13 + seed)) return false;
    }
    return true;
  }
  static size_t FreeMemory() {
    size_t free = 0, total = 0;
    EXPECT_EQ(sim::cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
    return free;
  }

  DriverApi api_;
};

TEST_F(PauseTest, PauseReleasesMemoryKeepsAddressesAndResumeRestoresContents) {
  Allocator a(api_);
  const CUdeviceptr model = Alloc(a, 8 * kMiB, "");
  const CUdeviceptr kv = Alloc(a, 32 * kMiB, "kv");
  const CUdeviceptr small = Alloc(a, 4096, "kv");  // packed, in a granule of the tag
  Fill(model, 8 * kMiB, 1);
  Fill(kv, 32 * kMiB, 2);
  Fill(small, 4096, 3);
  const size_t free_before = FreeMemory();

  absl::StatusOr<size_t> released = a.PauseMemory("kv", /*keep_contents=*/true);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_GE(*released, 32 * kMiB + 2 * kMiB);
  EXPECT_EQ(FreeMemory(), free_before + *released);  // the driver has it back
  char c;
  EXPECT_NE(sim::DeviceRead(0, &c, kv, 1), CUDA_SUCCESS);     // faults while paused
  EXPECT_NE(sim::DeviceRead(0, &c, small, 1), CUDA_SUCCESS);
  EXPECT_TRUE(Holds(model, 8 * kMiB, 1));                      // other memory untouched
  EXPECT_TRUE(a.Find(kv).ok());                                // the pointer is still known
  EXPECT_EQ(a.GetStats().paused_bytes, *released);

  // The freed memory serves other allocations meanwhile.
  const CUdeviceptr other = Alloc(a, 32 * kMiB, "");
  Fill(other, 32 * kMiB, 9);
  ASSERT_TRUE(a.Free(other).ok());

  absl::StatusOr<size_t> restored = a.ResumeMemory("kv");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, *released);
  EXPECT_TRUE(Holds(kv, 32 * kMiB, 2));
  EXPECT_TRUE(Holds(small, 4096, 3));
  EXPECT_TRUE(Holds(model, 8 * kMiB, 1));
  const AllocatorStats s = a.GetStats();
  EXPECT_EQ(s.paused_bytes, 0u);
  EXPECT_EQ(s.peak_paused_bytes, *released);
  EXPECT_EQ(sim::LiveHostAllocations(), 0u);  // the staging ring lives for one call
  for (CUdeviceptr p : {model, kv, small}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(a.ReleaseAll().ok());
  EXPECT_EQ(sim::GetUsage().handles, 0u);
}

}  // namespace
}  // namespace vmmshim
