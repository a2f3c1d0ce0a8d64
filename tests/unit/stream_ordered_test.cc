// The shim's stream-ordered path (core/stream_ordered/stream_ordered_cache.h, Allocator::
// AllocateAsync) against the simulated driver, whose streams keep the
// driver's reuse rule: a block freed on a stream is reused on it at once,
// on another stream only once the work queued before the free is done.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

class StreamOrderedTest : public SimTest {
 protected:
  void SetUp() override { Start(2); }
  void Start(int devices, size_t memory = 1024 * kTestMiB, PeerPolicy policy = {}) {
    StartSim(devices, memory);
    ctx_ = MakeCurrent(0);
    ASSERT_EQ(sim::cuDeviceGetDefaultMemPool(&pool_, 0), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuStreamCreate(&s1_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuStreamCreate(&s2_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    AllocatorOptions o;
    o.peer_policy = std::move(policy);
    // The simulated streams change state between calls: ask at every miss
    // (QueryIntervalLimitsDriverCalls covers the interval).
    o.stream_query_interval_ns = query_interval_ns_;
    core_ = std::make_unique<ShimCore>(api_, o);
  }
  CUdeviceptr AllocAsync(size_t bytes, CUstream stream, CUmemoryPool pool = nullptr) {
    absl::StatusOr<Allocator::Allocation> r = core_->stream_ordered().AllocateAsync(bytes, stream, false, pool);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  CUresult FreeAsync(CUdeviceptr p, CUstream stream) {
    return ToCuResult(core_->allocator().FreeAsync(p, stream, false));
  }
  StreamOrderedFigures Figures() {
    std::optional<StreamOrderedFigures> f = core_->stream_ordered().PoolFigures(pool_);
    EXPECT_TRUE(f.has_value());
    return f.value_or(StreamOrderedFigures{});
  }
  static PeerPolicy Policy(PeerPolicy::Kind kind, size_t min_bytes = 0) {
    PeerPolicy p;
    p.kind = kind;
    p.min_bytes = min_bytes;
    return p;
  }
  // cuMemPoolSetAccess as the hook does it: the driver first, then the shim.
  void SetPoolAccess(int owner, int peer, CUmemAccess_flags flags) {
    CUmemoryPool pool = nullptr;
    ASSERT_EQ(sim::cuDeviceGetDefaultMemPool(&pool, owner), CUDA_SUCCESS);
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = peer;
    desc.flags = flags;
    ASSERT_EQ(sim::cuMemPoolSetAccess(pool, &desc, 1), CUDA_SUCCESS);
    ASSERT_TRUE(core_->stream_ordered().PoolAccessChanged(pool, &desc, 1).ok());
  }
  static bool CanRead(int device, CUdeviceptr p) {
    char c;
    return sim::DeviceRead(device, &c, p, 1) == CUDA_SUCCESS;
  }

  int64_t query_interval_ns_ = 0;
  CUcontext ctx_ = nullptr;
  CUmemoryPool pool_ = nullptr;
  CUstream s1_ = nullptr, s2_ = nullptr;
  std::unique_ptr<ShimCore> core_;
};

TEST_F(StreamOrderedTest, ServedFromVmmAndNamedByTheDefaultPool) {
  const CUdeviceptr p = AllocAsync(kTestMiB, s1_);
  absl::StatusOr<PointerInfo> info = core_->allocator().Find(p);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->stream_ordered);
  EXPECT_EQ(info->allocation_size, kTestMiB);
  EXPECT_EQ(core_->stream_ordered().DefaultPool(0), pool_);
  EXPECT_EQ(sim::CallCount("cuMemAllocAsync"), 0u);  // not the driver's pool
  EXPECT_TRUE(CanRead(0, p));
  StreamOrderedFigures f = Figures();
  EXPECT_EQ(f.used, kTestMiB);
  EXPECT_EQ(f.reserved, 2 * kTestMiB);  // its packed block: one granule
  EXPECT_EQ(f.live_allocations, 1u);
  EXPECT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(core_->control().GetStats().stream_ordered_allocations, 1u);
}

TEST_F(StreamOrderedTest, SameStreamReuseIsImmediateAndMakesNoDriverCall) {
  for (size_t bytes : {size_t{256}, size_t{100000}, 8 * kTestMiB}) {
    const CUdeviceptr p = AllocAsync(bytes, s1_);
    sim::HoldStream(s1_);  // the free's work is not done: same-stream reuse needs no wait
    ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
    sim::ResetCallCounts();
    EXPECT_EQ(AllocAsync(bytes, s1_), p) << bytes;
    EXPECT_EQ(sim::CallCount("cuMemCreate") + sim::CallCount("cuStreamQuery") +
                  sim::CallCount("cuEventRecord") + sim::CallCount("cuStreamSynchronize") +
                  sim::CallCount("cuStreamGetCtx"),
              0u);
    sim::ReleaseStream(s1_);
    ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  }
  EXPECT_EQ(core_->control().GetStats().stream_ordered_reuses, 3u);
}

TEST_F(StreamOrderedTest, OtherStreamsWaitForTheFreeingStreamsWork) {
  const CUdeviceptr p = AllocAsync(4 * kTestMiB, s1_);
  sim::HoldStream(s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  // s1's work before the free is not done: s2 gets other memory, and an
  // event now covers the free.
  const CUdeviceptr q = AllocAsync(4 * kTestMiB, s2_);
  EXPECT_NE(q, p);
  EXPECT_EQ(sim::CallCount("cuEventRecord"), 1u);
  sim::ReleaseStream(s1_);  // the event completes
  const CUdeviceptr r = AllocAsync(4 * kTestMiB, s2_);
  EXPECT_EQ(r, p);
  EXPECT_EQ(FreeAsync(q, s2_), CUDA_SUCCESS);
  EXPECT_EQ(FreeAsync(r, s2_), CUDA_SUCCESS);
}

TEST_F(StreamOrderedTest, AStreamThatStaysBusyIsCoveredByAnEvent) {
  const CUdeviceptr p = AllocAsync(2 * kTestMiB, s1_);
  sim::HoldStream(s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  const CUdeviceptr q = AllocAsync(2 * kTestMiB, s2_);  // records the event
  EXPECT_NE(q, p);
  // The event completes (the stream's work up to it is done) although the
  // stream gets new work, held again.
  sim::ReleaseStream(s1_);
  sim::HoldStream(s1_);
  EXPECT_EQ(AllocAsync(2 * kTestMiB, s2_), p);
  sim::ReleaseStream(s1_);
}

TEST_F(StreamOrderedTest, QueryIntervalLimitsDriverCalls) {
  query_interval_ns_ = int64_t{3600} * 1000000000;  // an hour: never again in this test
  Start(2);
  const CUdeviceptr p = AllocAsync(2 * kTestMiB, s1_);
  sim::HoldStream(s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  sim::ResetCallCounts();
  std::vector<CUdeviceptr> live;
  for (int i = 0; i < 10; ++i) live.push_back(AllocAsync(2 * kTestMiB, s2_));  // ten misses
  // s1 was asked once (found busy, an event recorded), then left alone.
  EXPECT_EQ(sim::CallCount("cuStreamQuery"), 1u);
  EXPECT_EQ(sim::CallCount("cuEventQuery"), 0u);
  EXPECT_EQ(sim::CallCount("cuEventRecord"), 1u);
  // What the program reads is asked about regardless (forced).
  sim::ReleaseStream(s1_);
  Figures();
  EXPECT_EQ(Figures().cached, 0u);  // ready, released (threshold 0)
  for (CUdeviceptr q : live) EXPECT_NE(q, p);
  for (CUdeviceptr q : live) ASSERT_EQ(FreeAsync(q, s2_), CUDA_SUCCESS);
}

// Regression (H200 benchmark): with the default query interval, blocks freed
// after a harvest must still make the next miss harvest; they did not, and
// every cross-stream 64 MiB allocation created new memory.
TEST_F(StreamOrderedTest, CrossStreamLoopReusesWithTheDefaultInterval) {
  query_interval_ns_ = AllocatorOptions{}.stream_query_interval_ns;
  Start(1);
  for (size_t bytes : {size_t{256}, kTestMiB, 64 * kTestMiB}) {
    const CUdeviceptr first = AllocAsync(bytes, s1_);
    ASSERT_EQ(FreeAsync(first, s2_), CUDA_SUCCESS);
    sim::ResetCallCounts();
    for (int i = 0; i < 1000; ++i) {
      const CUdeviceptr p = AllocAsync(bytes, s1_);
      ASSERT_EQ(FreeAsync(p, s2_), CUDA_SUCCESS);
    }
    EXPECT_EQ(sim::CallCount("cuMemCreate"), 0u) << bytes;
  }
  // A stream found busy is asked again once the interval has passed.
  const CUdeviceptr x = AllocAsync(4 * kTestMiB, s1_);
  sim::HoldStream(s1_);
  ASSERT_EQ(FreeAsync(x, s1_), CUDA_SUCCESS);
  const CUdeviceptr z = AllocAsync(4 * kTestMiB, s2_);
  EXPECT_NE(z, x);
  sim::ReleaseStream(s1_);
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  EXPECT_EQ(AllocAsync(4 * kTestMiB, s2_), x);
}

TEST_F(StreamOrderedTest, TheProgramsSynchronizeMakesBlocksReadyWithoutQueries) {
  cuuint64_t keep_all = ~cuuint64_t{0};
  core_->stream_ordered().PoolAttributeSet(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
  const CUdeviceptr p = AllocAsync(4 * kTestMiB, s1_);
  EXPECT_EQ(StreamOrderedFrontEnd::SynchronizeMark(), 0u);  // nothing waits: the hooks do nothing
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  const uint64_t mark = StreamOrderedFrontEnd::SynchronizeMark();
  EXPECT_NE(mark, 0u);
  const CUdeviceptr later = AllocAsync(2 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(later, s1_), CUDA_SUCCESS);  // after the mark: not covered
  ASSERT_EQ(sim::cuStreamSynchronize(s1_), CUDA_SUCCESS);
  sim::ResetCallCounts();
  core_->stream_ordered().StreamSynchronized(s1_, false, mark);
  // Another stream reuses p at once, asking the driver nothing; `later`
  // still waits (freed after the mark), so s1 is asked about it.
  absl::StatusOr<Allocator::Allocation> r = core_->stream_ordered().AllocateAsync(4 * kTestMiB, s2_, false, nullptr);
  ASSERT_TRUE(r.ok() && r->served);
  EXPECT_EQ(r->ptr, p);
  EXPECT_EQ(sim::CallCount("cuStreamQuery") + sim::CallCount("cuEventQuery"), 0u);
  // A context synchronize covers every stream of the context; with
  // threshold 0 the ready blocks leave the cache there, as natively.
  cuuint64_t zero = 0;
  core_->stream_ordered().PoolAttributeSet(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero);
  const uint64_t mark2 = StreamOrderedFrontEnd::SynchronizeMark();
  core_->stream_ordered().ContextSynchronized(nullptr, mark2);
  EXPECT_EQ(sim::CallCount("cuStreamQuery"), 0u);
  EXPECT_EQ(core_->control().GetStats().devices[0].stream_ordered.cached, 0u);
  ASSERT_EQ(FreeAsync(r->ptr, s2_), CUDA_SUCCESS);
}

TEST_F(StreamOrderedTest, AMissAsksOnlyStreamsHoldingAUsableBlock) {
  const CUdeviceptr p = AllocAsync(4 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  sim::ResetCallCounts();
  // s1 holds a 4 MiB block: a 64 KiB or a 16 MiB request on s2 cannot use
  // it, so s1 is not asked.
  const CUdeviceptr small = AllocAsync(64 * 1024, s2_);
  const CUdeviceptr big = AllocAsync(16 * kTestMiB, s2_);
  EXPECT_EQ(sim::CallCount("cuStreamQuery"), 0u);
  EXPECT_EQ(AllocAsync(4 * kTestMiB, s2_), p);  // this one can: asked, ready, reused
  EXPECT_EQ(sim::CallCount("cuStreamQuery"), 1u);
  for (CUdeviceptr q : {small, big, p}) ASSERT_EQ(FreeAsync(q, s2_), CUDA_SUCCESS);
}

TEST_F(StreamOrderedTest, ALargerCachedBlockServesUpToAQuarterMore) {
  const CUdeviceptr p = AllocAsync(10 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(AllocAsync(8 * kTestMiB, s1_), p);  // a 10 MiB block for 8 MiB
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_NE(AllocAsync(6 * kTestMiB, s1_), p);  // more than a quarter: other memory
}

TEST_F(StreamOrderedTest, AnotherSizeOfTheSameClassReusesTheBlock) {
  const CUdeviceptr small = AllocAsync(1000, s1_);
  ASSERT_EQ(FreeAsync(small, s1_), CUDA_SUCCESS);
  EXPECT_EQ(AllocAsync(900, s1_), small);  // two 512-byte units both
  EXPECT_EQ(core_->allocator().Find(small)->allocation_size, 900u);
  const CUdeviceptr large = AllocAsync(3 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(large, s1_), CUDA_SUCCESS);
  EXPECT_EQ(AllocAsync(3 * kTestMiB + kTestMiB / 2, s1_), large);  // a 4 MiB block both
  EXPECT_EQ(core_->allocator().Find(large)->allocation_size, 3 * kTestMiB + kTestMiB / 2);
  EXPECT_EQ(core_->control().GetStats().devices[0].live_bytes, 900 + 3 * kTestMiB + kTestMiB / 2);
  EXPECT_EQ(Figures().used, 900 + 3 * kTestMiB + kTestMiB / 2);
}

TEST_F(StreamOrderedTest, FreesGetTheDriversCodes) {
  const CUdeviceptr p = AllocAsync(4096, s1_);
  EXPECT_EQ(FreeAsync(p + 512, s1_), CUDA_ERROR_INVALID_VALUE);  // interior
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(FreeAsync(p, s1_), CUDA_ERROR_INVALID_VALUE);  // double free (measured: 1)
  EXPECT_EQ(ToCuResult(core_->allocator().Free(p)), CUDA_ERROR_INVALID_VALUE);
  // cudaFree of stream-ordered memory succeeds (measured), once.
  const CUdeviceptr q = AllocAsync(4096, s2_);
  EXPECT_EQ(ToCuResult(core_->allocator().Free(q)), CUDA_SUCCESS);
  EXPECT_EQ(ToCuResult(core_->allocator().Free(q)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(FreeAsync(q, s2_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Figures().used, 0u);
  // cudaFreeAsync of cudaMalloc memory frees it (measured); a second free: 1.
  const CUdeviceptr m = MustAllocate(core_->allocator(), 4096);
  EXPECT_EQ(FreeAsync(m, s1_), CUDA_SUCCESS);
  EXPECT_EQ(ToCuResult(core_->allocator().Free(m)), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(StreamOrderedTest, OnlyTheCurrentDefaultPoolIsServed) {
  // A pool the program created, explicitly or made current: the driver's.
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool mine = nullptr;
  ASSERT_EQ(sim::cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
  absl::StatusOr<Allocator::Allocation> r = core_->stream_ordered().AllocateAsync(256, s1_, false, mine);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->served);
  EXPECT_TRUE(core_->stream_ordered().AllocateAsync(256, s1_, false, pool_)->served);  // the default, explicitly
  ASSERT_EQ(sim::cuDeviceSetMemPool(0, mine), CUDA_SUCCESS);
  core_->stream_ordered().CurrentPoolChanged(0, mine);
  EXPECT_FALSE(core_->stream_ordered().AllocateAsync(256, s1_, false, nullptr)->served);
  ASSERT_EQ(sim::cuDeviceSetMemPool(0, pool_), CUDA_SUCCESS);
  core_->stream_ordered().CurrentPoolChanged(0, pool_);
  EXPECT_TRUE(core_->stream_ordered().AllocateAsync(256, s1_, false, nullptr)->served);
}

TEST_F(StreamOrderedTest, ACapturingStreamGetsGraphMemoryFromTheDriver) {
  ASSERT_EQ(core_->captures().BeginCapture(s1_, false,
                                        [&] {
                                          return sim::cuStreamBeginCapture_v2(
                                              s1_, CU_STREAM_CAPTURE_MODE_RELAXED);
                                        }),
            CUDA_SUCCESS);
  absl::StatusOr<Allocator::Allocation> r = core_->stream_ordered().AllocateAsync(256, s1_, false, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->served);
  EXPECT_TRUE(core_->stream_ordered().AllocateAsync(256, s2_, false, nullptr)->served);  // not capturing
  CUgraph graph = nullptr;
  ASSERT_EQ(sim::cuStreamEndCapture(s1_, &graph), CUDA_SUCCESS);
  core_->allocator().CaptureEnded(s1_, false);
}

TEST_F(StreamOrderedTest, ReleaseThresholdAndTrimActOnTheCache) {
  const CUdeviceptr p = AllocAsync(8 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  // Threshold 0 (the default): a ready block leaves the cache at the next
  // look, as the driver's pool gives it back at a synchronize.
  EXPECT_EQ(Figures().reserved, 0u);
  EXPECT_EQ(Figures().cached, 0u);
  // With a threshold it stays, and cuMemPoolTrimTo releases it.
  cuuint64_t keep_all = ~cuuint64_t{0};
  core_->stream_ordered().PoolAttributeSet(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
  const CUdeviceptr q = AllocAsync(8 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(q, s1_), CUDA_SUCCESS);
  EXPECT_EQ(Figures().reserved, 8 * kTestMiB);
  EXPECT_EQ(Figures().used, 0u);
  EXPECT_EQ(AllocAsync(8 * kTestMiB, s2_), q);  // ready: any stream
  ASSERT_EQ(FreeAsync(q, s2_), CUDA_SUCCESS);
  EXPECT_EQ(core_->stream_ordered().PoolTrimTo(pool_, 0), 8 * kTestMiB);
  EXPECT_EQ(Figures().reserved, 0u);
  EXPECT_GE(Figures().reserved_high, 8 * kTestMiB);
  core_->stream_ordered().PoolAttributeSet(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &keep_all);
  EXPECT_EQ(Figures().reserved_high, 0u);
}

// The pool's reserved bytes as the driver keeps them (docs/stream-ordered.md,
// measured on H200): the first small allocation reserves a chunk, and the
// next ones in it leave the reserved bytes as they are while the used bytes
// grow (CuPy's MemoryAsyncPool reads total_bytes() and free_bytes() from
// them); the reservation goes back at a free with threshold 0. The shim's
// chunk is the packed block (one 2 MiB granule), the driver's 32 MiB.
TEST_F(StreamOrderedTest, SmallAllocationsShareTheReservedChunk) {
  const CUdeviceptr a = AllocAsync(4096, s1_);
  EXPECT_EQ(Figures().reserved, 2 * kTestMiB);
  EXPECT_EQ(Figures().used, 4096u);
  const CUdeviceptr b = AllocAsync(64 * 1024, s1_);
  const CUdeviceptr c = AllocAsync(4096, s1_);
  EXPECT_EQ(Figures().reserved, 2 * kTestMiB);
  EXPECT_EQ(Figures().used, 2 * 4096u + 64 * 1024);
  const CUdeviceptr big = AllocAsync(64 * kTestMiB, s1_);
  EXPECT_EQ(Figures().reserved, 66 * kTestMiB);
  for (CUdeviceptr p : {a, b, c, big}) ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(Figures().reserved, 0u);  // threshold 0: given back
  EXPECT_EQ(Figures().used, 0u);
  EXPECT_EQ(Figures().reserved_high, 66 * kTestMiB);
  cuuint64_t zero = 0;
  core_->stream_ordered().PoolAttributeSet(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
  EXPECT_EQ(Figures().reserved_high, 0u);
  // Paused stream-ordered memory is not reserved; resumed, it is again.
  const CUdeviceptr d = AllocAsync(8 * kTestMiB, s1_);
  ASSERT_TRUE(core_->pause().Pause(TagSelection::All(), false).ok());
  EXPECT_EQ(Figures().reserved, 0u);
  ASSERT_TRUE(core_->pause().Resume(TagSelection::All()).ok());
  EXPECT_EQ(Figures().reserved, 8 * kTestMiB);
  ASSERT_EQ(FreeAsync(d, s1_), CUDA_SUCCESS);
  EXPECT_EQ(Figures().reserved, 0u);
}

TEST_F(StreamOrderedTest, AThresholdSetBeforeTheFirstAllocationIsKept) {
  // PyTorch's cudaMallocAsync backend raises the threshold at start-up.
  cuuint64_t keep_all = ~cuuint64_t{0};
  core_->stream_ordered().PoolAttributeSet(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
  const CUdeviceptr p = AllocAsync(8 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(Figures().reserved, 8 * kTestMiB);
  EXPECT_EQ(Figures().release_threshold, keep_all);
}

TEST_F(StreamOrderedTest, ADestroyedStreamsBlocksBecomeReadyWhenItsWorkIsDone) {
  CUstream s3 = nullptr;
  ASSERT_EQ(sim::cuStreamCreate(&s3, 0), CUDA_SUCCESS);
  const CUdeviceptr p = AllocAsync(2 * kTestMiB, s3);
  sim::HoldStream(s3);
  ASSERT_EQ(FreeAsync(p, s3), CUDA_SUCCESS);
  core_->stream_ordered().StreamDestroyed(s3);  // the hook's order: before the driver's destroy
  EXPECT_NE(AllocAsync(2 * kTestMiB, s2_), p);
  sim::ReleaseStream(s3);
  ASSERT_EQ(sim::cuStreamDestroy_v2(s3), CUDA_SUCCESS);
  EXPECT_EQ(AllocAsync(2 * kTestMiB, s2_), p);
}

TEST_F(StreamOrderedTest, OutOfMemoryWaitsForFreedBlocks) {
  Start(1, 64 * kTestMiB);
  const CUdeviceptr p = AllocAsync(40 * kTestMiB, s1_);
  sim::HoldStream(s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  // Not ready for s2, and no room for another 40 MiB: the shim synchronizes
  // and takes the freed block's memory, as the driver's pool does.
  const CUdeviceptr q = AllocAsync(40 * kTestMiB, s2_);
  EXPECT_NE(q, 0u);
  // The same for cudaMalloc.
  sim::HoldStream(s2_);
  ASSERT_EQ(FreeAsync(q, s2_), CUDA_SUCCESS);
  EXPECT_NE(MustAllocate(core_->allocator(), 40 * kTestMiB), 0u);
}

TEST_F(StreamOrderedTest, ReleaseContextForgetsEverything) {
  const CUdeviceptr p = AllocAsync(4 * kTestMiB, s1_);
  const CUdeviceptr q = AllocAsync(4096, s1_);
  AllocAsync(4096, s2_);
  sim::HoldStream(s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  ASSERT_EQ(FreeAsync(q, s1_), CUDA_SUCCESS);
  sim::ReleaseStream(s1_);
  core_->allocator().ReleaseContext(ctx_, true);
  StreamOrderedFigures f = Figures();
  EXPECT_EQ(f.used, 0u);
  EXPECT_EQ(f.reserved, 0u);
  EXPECT_EQ(f.live_allocations, 0u);
  core_->control().Trim();
  EXPECT_EQ(sim::GetUsage().handles, 0u);
}

TEST_F(StreamOrderedTest, PerThreadDefaultStreamsAreDistinct) {
  // Handle 0 through a _ptsz entry point: this thread's stream.
  absl::StatusOr<Allocator::Allocation> r = core_->stream_ordered().AllocateAsync(4096, nullptr, true, nullptr);
  ASSERT_TRUE(r.ok() && r->served);
  ASSERT_TRUE(core_->allocator().FreeAsync(r->ptr, nullptr, true).ok());
  std::thread other([&] {
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    sim::HoldStream(CU_STREAM_PER_THREAD);  // the sim keys streams by handle: not ready
    absl::StatusOr<Allocator::Allocation> mine = core_->stream_ordered().AllocateAsync(4096, nullptr, true, nullptr);
    ASSERT_TRUE(mine.ok() && mine->served);
    // The first thread's stream cannot be asked about from here: its block
    // is not known to be ready.
    EXPECT_NE(mine->ptr, r->ptr);
    sim::ReleaseStream(CU_STREAM_PER_THREAD);
    ASSERT_TRUE(core_->allocator().FreeAsync(mine->ptr, nullptr, true).ok());
  });
  other.join();
}

// A block that left the stream-ordered cache is freed in the heap after the
// cache's lock is released; a release of its context in between unmaps it,
// and its address may serve another context's allocation: the late free must
// not touch that one (review finding).
TEST_F(StreamOrderedTest, ALateReleaseDoesNotFreeAnotherContextsAllocation) {
  const VmmMapper mapper(api_);
  const PeerPolicy policy;
  PeerEnableTable peers, pool_peers;
  ExportRegistry exports;
  ReservationMap ranges;
  GlobalCounters global;
  DeviceHeap::Options o;
  o.device = 0;
  o.granularity = 2 * kTestMiB;
  o.reservation_bytes = 64 * kTestMiB;
  o.packing_threshold = kTestMiB;
  o.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  o.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  o.prop.location.id = 0;
  DeviceHeap heap(api_, mapper, policy, peers, pool_peers, exports, ranges, global, o);
  const Placement in_a{ctx_, DeviceSet::Of(0), "", /*stream_ordered=*/true};
  absl::StatusOr<CUdeviceptr> p = heap.AllocateSlow(in_a, 4 * kTestMiB);
  ASSERT_TRUE(p.ok());
  heap.ReleaseContext(ctx_);  // the block goes with its context
  CUcontext b = nullptr;
  ASSERT_EQ(sim::cuCtxCreate_v2(&b, 0, 0), CUDA_SUCCESS);
  const Placement in_b{b, DeviceSet::Of(0), "", /*stream_ordered=*/true};
  absl::StatusOr<CUdeviceptr> q = heap.AllocateSlow(in_b, 4 * kTestMiB);
  ASSERT_TRUE(q.ok());
  ASSERT_EQ(*q, *p);  // the address serves B now
  EXPECT_EQ(ToCuResult(heap.arena(0)->FreeStreamOrdered(*p, ctx_)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(heap.arena(0)->Find(*q).has_value());
  EXPECT_TRUE(heap.arena(0)->FreeStreamOrdered(*q, b).ok());
  heap.ReleaseAll().IgnoreError();
}

// ---- Pool access is the peer event ----

class StreamOrderedPeerTest : public StreamOrderedTest {
 protected:
  void SetUp() override {}
};

TEST_F(StreamOrderedPeerTest, PoolAccessGrantsStreamOrderedMemoryOnly) {
  Start(4, 1024 * kTestMiB, Policy(PeerPolicy::Kind::kAll));
  const CUdeviceptr so = AllocAsync(4 * kTestMiB, s1_);
  const CUdeviceptr m = MustAllocate(core_->allocator(), 4 * kTestMiB);
  SetPoolAccess(0, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_TRUE(CanRead(1, so));
  EXPECT_FALSE(CanRead(1, m));  // cudaMalloc memory waits for cuCtxEnablePeerAccess
  EXPECT_EQ(sim::PeerMappedBytes(1), 4 * kTestMiB);
  // Later stream-ordered allocations are mapped too; a context enable maps
  // cudaMalloc memory and leaves the pool's peers alone.
  const CUdeviceptr later = AllocAsync(64 * 1024, s2_);
  EXPECT_TRUE(CanRead(1, later));
  ASSERT_TRUE(core_->peers().EnablePeer(2, 0).ok());
  EXPECT_TRUE(CanRead(2, m));
  EXPECT_FALSE(CanRead(2, so));
  // Access NONE takes it away.
  SetPoolAccess(0, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  EXPECT_FALSE(CanRead(1, so));
  EXPECT_FALSE(CanRead(1, later));
}

TEST_F(StreamOrderedPeerTest, PolicyDecidesPerStreamOrderedAllocation) {
  Start(4, 1024 * kTestMiB, Policy(PeerPolicy::Kind::kMinSize, kTestMiB));
  const CUdeviceptr small = AllocAsync(4096, s1_);
  const CUdeviceptr big = AllocAsync(8 * kTestMiB, s1_);
  for (int peer : {1, 2, 3}) SetPoolAccess(0, peer, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (int peer : {1, 2, 3}) {
    EXPECT_FALSE(CanRead(peer, small));
    EXPECT_TRUE(CanRead(peer, big));
    EXPECT_EQ(sim::PeerMappedBytes(peer), 8 * kTestMiB);
  }
  // The explicit C API works on stream-ordered memory too.
  ASSERT_TRUE(core_->peers().SetPeerAccess(big, 1, true).ok());
  ASSERT_TRUE(core_->peers().SetPeerAccess(big, 2, false).ok());
  EXPECT_FALSE(CanRead(2, big));
  EXPECT_TRUE(CanRead(3, big));
}

TEST_F(StreamOrderedPeerTest, PolicyNoneMapsNothingIntoPeers) {
  Start(4, 1024 * kTestMiB, Policy(PeerPolicy::Kind::kNone));
  const CUdeviceptr p = AllocAsync(8 * kTestMiB, s1_);
  for (int peer : {1, 2, 3}) SetPoolAccess(0, peer, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (int peer : {1, 2, 3}) EXPECT_EQ(sim::PeerMappedBytes(peer), 0u);
  EXPECT_TRUE(CanRead(0, p));
  EXPECT_EQ(core_->control().GetStats().devices[0].peers[1].denials, 1u);
}

// ---- Stress: many threads and streams ----

TEST_F(StreamOrderedTest, ManyThreadsAndStreamsNeverShareLiveMemory) {
  constexpr int kThreads = 6, kStreams = 5, kOps = 1500;
  std::vector<CUstream> streams(kStreams);
  for (CUstream& s : streams) ASSERT_EQ(sim::cuStreamCreate(&s, 0), CUDA_SUCCESS);
  std::mutex mu;
  std::map<CUdeviceptr, size_t> live;  // every live allocation, to check overlaps
  std::atomic<int> failures{0};
  auto worker = [&](int seed) {
    sim::cuCtxSetCurrent(ctx_);
    std::mt19937 rng(seed);
    std::vector<std::pair<CUdeviceptr, size_t>> mine;
    const size_t sizes[] = {256, 1000, 4096, 70000, 3 * kTestMiB};
    for (int i = 0; i < kOps; ++i) {
      CUstream s = streams[rng() % kStreams];
      if (mine.size() < 8 && (mine.empty() || rng() % 2 == 0)) {
        const size_t bytes = sizes[rng() % 5];
        absl::StatusOr<Allocator::Allocation> r = core_->stream_ordered().AllocateAsync(bytes, s, false, nullptr);
        if (!r.ok() || !r->served) {
          ++failures;
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        auto next = live.lower_bound(r->ptr);
        if ((next != live.end() && next->first < r->ptr + bytes) ||
            (next != live.begin() && std::prev(next)->first + std::prev(next)->second > r->ptr)) {
          ++failures;  // overlaps a live allocation
        }
        live[r->ptr] = bytes;
        mine.push_back({r->ptr, bytes});
      } else {
        const size_t k = rng() % mine.size();
        {
          std::lock_guard<std::mutex> lock(mu);
          live.erase(mine[k].first);
        }
        if (rng() % 7 == 0) sim::HoldStream(s);
        if (!core_->allocator().FreeAsync(mine[k].first, s, false).ok()) ++failures;
        if (rng() % 5 == 0) sim::ReleaseStream(s);
        mine.erase(mine.begin() + k);
      }
      if (rng() % 200 == 0) core_->stream_ordered().PoolFigures(pool_);
    }
    for (auto& [p, bytes] : mine) {
      {
        std::lock_guard<std::mutex> lock(mu);
        live.erase(p);
      }
      if (!core_->allocator().FreeAsync(p, streams[0], false).ok()) ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t + 1);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (CUstream s : streams) sim::ReleaseStream(s);
  StreamOrderedFigures f = Figures();
  EXPECT_EQ(f.used, 0u);
  EXPECT_EQ(f.live_allocations, 0u);
  core_->stream_ordered().PoolTrimTo(pool_, 0);
  EXPECT_EQ(Figures().reserved, 0u);
  EXPECT_EQ(core_->control().GetStats().devices[0].live_allocations, 0u);
}


// ---- Races and edge cases: blocks that leave with contexts, streams and captures ----

// A ready block of one context is handed to an allocation of another
// context on the same device; releasing the first context then destroys
// memory that is live in the second.
// ---- Regressions from a review of the stream-ordered path (each failed
// before its fix) ----

// A freed block belongs to its placement (context, allowed peers, tag): a
// reuse in another context made the block's release with its old context
// unmap live memory.
TEST_F(StreamOrderedTest, ABlockIsNotReusedInAnotherContext) {
  const CUdeviceptr p = AllocAsync(4 * kTestMiB, s1_);  // primary context (A)
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  CUcontext b = nullptr;
  ASSERT_EQ(sim::cuCtxCreate_v2(&b, 0, 0), CUDA_SUCCESS);  // device 0 again, now current
  CUstream sb = nullptr;
  ASSERT_EQ(sim::cuStreamCreate(&sb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const CUdeviceptr q = AllocAsync(4 * kTestMiB, sb);  // live in context B
  ASSERT_EQ(sim::cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  core_->allocator().ReleaseContext(ctx_, true);  // context A goes (cuCtxDestroy / primary reset)
  EXPECT_TRUE(core_->allocator().Find(q).ok()) << "B's live allocation was released with A (q == p: "
                                << (q == p) << ")";
  EXPECT_TRUE(CanRead(0, q));
}

// The same cross-context reuse: the free is charged to the block's old
// context, and releasing the new one makes the pool figures wrap.
TEST_F(StreamOrderedTest, ReuseAcrossContextsKeepsTheFiguresRight) {
  const CUdeviceptr p = AllocAsync(4 * kTestMiB, s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  CUcontext b = nullptr;
  ASSERT_EQ(sim::cuCtxCreate_v2(&b, 0, 0), CUDA_SUCCESS);
  CUstream sb = nullptr;
  ASSERT_EQ(sim::cuStreamCreate(&sb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const CUdeviceptr r = AllocAsync(64 * 1024, sb);  // B's own (new) allocation, kept live
  const CUdeviceptr q = AllocAsync(4 * kTestMiB, sb);  // not A's ready block any more
  EXPECT_NE(q, p);
  EXPECT_NE(r, 0u);
  ASSERT_EQ(FreeAsync(q, sb), CUDA_SUCCESS);  // charged to A (the heap's placement)
  core_->allocator().ReleaseContext(b, true);  // r goes with B
  ASSERT_EQ(sim::cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  StreamOrderedFigures f = Figures();
  EXPECT_EQ(f.live_allocations, 0u);
  EXPECT_EQ(f.used, 0u);
  EXPECT_EQ(f.reserved, 0u);
}

// The stream-ordered cache ignores the placement: a block the policy kept
// from the peer (15 MiB < min-size 16 MiB) serves a 16 MiB request, which
// the policy grants, and the peer cannot read it.
TEST_F(StreamOrderedPeerTest, AReusedBlockHasTheRequestsPeerAccess) {
  Start(4, 1024 * kTestMiB, Policy(PeerPolicy::Kind::kMinSize, 16 * kTestMiB));
  SetPoolAccess(0, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  const CUdeviceptr p = AllocAsync(15 * kTestMiB, s1_);
  EXPECT_FALSE(CanRead(1, p));  // denied by the policy: right
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  const CUdeviceptr q = AllocAsync(16 * kTestMiB, s1_);  // granted by the policy
  EXPECT_TRUE(CanRead(1, q)) << "q == p: " << (q == p);
}

// cudaFree of stream-ordered memory during a relaxed capture (on another
// stream) is deferred by the heap, but the cache never hears of it.
TEST_F(StreamOrderedTest, CudaFreeDuringACaptureLeavesTheFigures) {
  const CUdeviceptr p = AllocAsync(4096, s2_);
  const CUdeviceptr m = MustAllocate(core_->allocator(), 4096);
  ASSERT_EQ(core_->captures().BeginCapture(s1_, false,
                                        [&] {
                                          return sim::cuStreamBeginCapture_v2(
                                              s1_, CU_STREAM_CAPTURE_MODE_RELAXED);
                                        }),
            CUDA_SUCCESS);
  EXPECT_TRUE(core_->allocator().Free(p).ok());
  CUgraph graph = nullptr;
  ASSERT_EQ(sim::cuStreamEndCapture(s1_, &graph), CUDA_SUCCESS);
  core_->allocator().CaptureEnded(s1_, false);
  EXPECT_TRUE(core_->allocator().Free(m).ok());  // completes the deferred free
  StreamOrderedFigures f = Figures();
  EXPECT_EQ(f.used, 0u);
  EXPECT_EQ(f.live_allocations, 0u);
}

// cudaFree of a block already freed with cudaFreeAsync, during a relaxed
// capture: natively CUDA_ERROR_INVALID_VALUE (a double free); here it
// succeeds and is deferred, the heap frees the block later while the
// stream-ordered cache still holds it, and both hand the address out.
TEST_F(StreamOrderedTest, DoubleFreeDuringACaptureIsRefused) {
  const CUdeviceptr p = AllocAsync(4096, s2_);
  const CUdeviceptr m = MustAllocate(core_->allocator(), 4096);
  ASSERT_EQ(FreeAsync(p, s2_), CUDA_SUCCESS);
  ASSERT_EQ(core_->captures().BeginCapture(s1_, false,
                                        [&] {
                                          return sim::cuStreamBeginCapture_v2(
                                              s1_, CU_STREAM_CAPTURE_MODE_RELAXED);
                                        }),
            CUDA_SUCCESS);
  EXPECT_EQ(ToCuResult(core_->allocator().Free(p)), CUDA_ERROR_INVALID_VALUE);  // measured natively: 1
  CUgraph graph = nullptr;
  ASSERT_EQ(sim::cuStreamEndCapture(s1_, &graph), CUDA_SUCCESS);
  core_->allocator().CaptureEnded(s1_, false);
  EXPECT_TRUE(core_->allocator().Free(m).ok());  // completes whatever was deferred
  const CUdeviceptr q1 = AllocAsync(4096, s2_);  // from the stream-ordered cache
  const CUdeviceptr q2 = AllocAsync(4096, s1_);  // from the heap
  EXPECT_TRUE(core_->allocator().Find(q1).ok());
  EXPECT_NE(q1, q2) << "two live allocations at one address";
}


// Device 0's block freed on a stream of device 1, whose context has no shim
// allocation of its own: releasing that context (cudaDeviceReset on device
// 1, cuCtxDestroy) returns early at `if (!any)`, so DropContext never runs
// and the block stays cached, keyed by a stream that no longer exists.
TEST_F(StreamOrderedTest, ReleasingAContextThatOnlyFreedReleasesItsStreamsBlocks) {
  const CUcontext ctx1 = MakeCurrent(1);
  CUstream t = nullptr;
  ASSERT_EQ(sim::cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);  // device 1's
  ASSERT_EQ(sim::cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  const CUdeviceptr p = AllocAsync(4 * kTestMiB, s1_);  // device 0's memory
  sim::HoldStream(t);
  ASSERT_EQ(FreeAsync(p, t), CUDA_SUCCESS);
  core_->allocator().ReleaseContext(ctx1, true);  // what the cuDevicePrimaryCtxReset(1) hook does
  EXPECT_EQ(core_->control().GetStats().devices[0].stream_ordered.cached, 0u);
  sim::ReleaseStream(t);
}


// The out-of-memory reclaim synchronizes contexts without the capture gate
// (ReclaimDeferred takes it): a global capture begun by another thread after
// the captures_.any() check is invalidated by the reclaim's cuCtxSynchronize.
TEST_F(StreamOrderedTest, OutOfMemoryReclaimDoesNotBreakACaptureBegunMeanwhile) {
  Start(1, 64 * kTestMiB);
  const CUdeviceptr p = AllocAsync(40 * kTestMiB, s1_);
  sim::HoldStream(s1_);
  ASSERT_EQ(FreeAsync(p, s1_), CUDA_SUCCESS);
  sim::HoldCalls("cuCtxSynchronize_v2");
  std::thread alloc([&] {
    sim::cuCtxSetCurrent(ctx_);
    (void)core_->stream_ordered().AllocateAsync(40 * kTestMiB, s2_, false, nullptr);  // OOM: reclaim
  });
  ASSERT_TRUE(sim::WaitForHeldCall(5000));
  const CUstream cap = reinterpret_cast<CUstream>(0x7777);
  std::atomic<bool> begun{false};
  std::thread begin([&] {
    sim::cuCtxSetCurrent(ctx_);
    EXPECT_EQ(core_->captures().BeginCapture(cap, false,
                                          [&] {
                                            return sim::cuStreamBeginCapture_v2(
                                                cap, CU_STREAM_CAPTURE_MODE_GLOBAL);
                                          }),
              CUDA_SUCCESS);
    begun = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool begun_during_sync = begun.load();
  sim::ReleaseHeldCalls();
  alloc.join();
  begin.join();
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_EQ(sim::cuStreamIsCapturing(cap, &st), CUDA_SUCCESS);
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE) << "began during the reclaim's synchronize: "
                                                 << begun_during_sync;
  CUgraph graph = nullptr;
  sim::cuStreamEndCapture(cap, &graph);
  core_->allocator().CaptureEnded(cap, false);
}

}  // namespace
}  // namespace vmmshim
