// The per-thread front end: heap arenas (core/heap/device_heap.h) and
// frees' combined synchronizes (core/sync/context_sync.h).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/sync/context_sync.h"
#include "core/sync/shared_gate.h"
#include "core/sync/thread_slot.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

CUcontext Ctx(uintptr_t v) { return reinterpret_cast<CUcontext>(v); }

// ---- SyncCombiner ----

TEST(SyncCombinerTest, OneThreadRunsOneSynchronizePerCall) {
  int calls = 0;
  SyncCombiner c([&](CUcontext) {
    ++calls;
    return absl::OkStatus();
  });
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.Synchronize(Ctx(0x100)).ok());
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(c.synchronizes(), 5u);
  EXPECT_EQ(c.shared(), 0u);
}

TEST(SyncCombinerTest, ACallDuringARunningSynchronizeWaitsForTheNextOne) {
  // The running synchronize began before the second call, so it does not
  // cover the work that call must wait for.
  std::atomic<int> started{0}, finished{0};
  std::atomic<bool> release_first{false};
  SyncCombiner c([&](CUcontext) {
    const int n = ++started;
    if (n == 1) {
      while (!release_first) std::this_thread::yield();
    }
    ++finished;
    return absl::OkStatus();
  });
  std::thread first([&] { EXPECT_TRUE(c.Synchronize(Ctx(0x100)).ok()); });
  while (started < 1) std::this_thread::yield();
  std::atomic<bool> second_done{false};
  int finished_when_second_returned = -1;
  std::thread second([&] {
    EXPECT_TRUE(c.Synchronize(Ctx(0x100)).ok());
    finished_when_second_returned = finished.load();
    second_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(second_done.load());  // still waiting behind the first
  release_first = true;
  first.join();
  second.join();
  EXPECT_EQ(started.load(), 2);
  EXPECT_EQ(finished_when_second_returned, 2);
}

TEST(SyncCombinerTest, ConcurrentCallsShareSynchronizesAndEachIsCovered) {
  // Each call must return only after a synchronize that started after the
  // call did has completed. Synchronizes of one context never overlap, so
  // "completed > started-before-the-call" says exactly that.
  std::atomic<uint64_t> started{0}, completed{0};
  std::atomic<int> running{0};
  std::atomic<bool> overlap{false};
  SyncCombiner c([&](CUcontext) {
    if (running.fetch_add(1) != 0) overlap = true;
    ++started;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (std::chrono::steady_clock::now() < until) {
    }
    ++completed;
    running.fetch_sub(1);
    return absl::OkStatus();
  });
  constexpr int kThreads = 8, kCalls = 300;
  std::atomic<int> uncovered{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        const uint64_t before = started.load();
        if (!c.Synchronize(Ctx(0x200)).ok()) ++uncovered;
        if (completed.load() <= before) ++uncovered;
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(uncovered.load(), 0);
  EXPECT_FALSE(overlap.load());
  EXPECT_EQ(c.synchronizes() + c.shared(), uint64_t{kThreads} * kCalls);
  EXPECT_GT(c.shared(), 0u);  // eight threads: callers shared synchronizes
  EXPECT_LT(c.synchronizes(), uint64_t{kThreads} * kCalls);
}

TEST(SyncCombinerTest, TheSynchronizesErrorReachesTheCallsItCovered) {
  SyncCombiner c([](CUcontext) { return DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, "sync"); });
  EXPECT_EQ(ToCuResult(c.Synchronize(Ctx(0x100))), CUDA_ERROR_ILLEGAL_ADDRESS);
}

TEST(SyncCombinerTest, ContextsDoNotWaitForEachOther) {
  std::atomic<bool> release{false};
  std::atomic<int> a_started{0};
  SyncCombiner c([&](CUcontext ctx) {
    if (ctx == Ctx(0xA0)) {
      ++a_started;
      while (!release) std::this_thread::yield();
    }
    return absl::OkStatus();
  });
  std::thread a([&] { EXPECT_TRUE(c.Synchronize(Ctx(0xA0)).ok()); });
  while (a_started < 1) std::this_thread::yield();
  EXPECT_TRUE(c.Synchronize(Ctx(0xB0)).ok());  // returns while A's runs
  release = true;
  a.join();
}

TEST(SyncCombinerTest, MoreContextsThanSlotsStillSynchronize) {
  int calls = 0;
  SyncCombiner c([&](CUcontext) {
    ++calls;
    return absl::OkStatus();
  });
  for (uintptr_t i = 1; i <= SyncCombiner::kSlots + 10; ++i) {
    ASSERT_TRUE(c.Synchronize(Ctx(i << 8)).ok());
  }
  EXPECT_EQ(calls, SyncCombiner::kSlots + 10);
}

// ---- SharedGate (the capture gate's lock) ----

TEST(SharedGateTest, AWriterNeverRunsWithReaders) {
  SharedGate gate;
  std::atomic<int> readers_inside{0};
  std::atomic<bool> writer_inside{false}, stop{false};
  std::atomic<int> violations{0}, reads{0}, writes{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 6; ++t) {
    pool.emplace_back([&] {
      while (!stop) {
        GateReaderLock lock(&gate);
        readers_inside.fetch_add(1);
        if (writer_inside) ++violations;
        readers_inside.fetch_sub(1);
        ++reads;
      }
    });
  }
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i) {
      GateWriterLock lock(&gate);
      writer_inside = true;
      if (readers_inside.load() != 0) ++violations;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (readers_inside.load() != 0) ++violations;
      writer_inside = false;
      ++writes;
    }
  });
  writer.join();
  stop = true;
  for (auto& t : pool) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(writes.load(), 200);
  EXPECT_GT(reads.load(), 0);
}

TEST(SharedGateTest, AWriterWaitsForAHeldReadLock) {
  SharedGate gate;
  std::atomic<bool> written{false};
  gate.ReaderLock();
  std::thread writer([&] {
    GateWriterLock lock(&gate);
    written = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(written.load());
  gate.ReaderUnlock();
  writer.join();
  EXPECT_TRUE(written.load());
}

// ---- Heap arenas ----

// Threads that stay alive, so that each keeps its slot (and arena) while
// the others run: Run(i, fn) runs `fn` on thread i with the test's context
// current and waits for it.
class Workers {
 public:
  Workers(int n, CUcontext ctx) : tasks_(n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, i, ctx] {
        sim::cuCtxSetCurrent(ctx);
        std::unique_lock<std::mutex> lock(mu_);
        while (true) {
          cv_.wait(lock, [&] { return stop_ || tasks_[i] != nullptr; });
          if (tasks_[i] == nullptr) return;
          std::function<void()> task = std::move(tasks_[i]);
          tasks_[i] = nullptr;
          lock.unlock();
          task();
          lock.lock();
          ++done_;
          cv_.notify_all();
        }
      });
    }
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Run(int i, std::function<void()> fn) {
    std::unique_lock<std::mutex> lock(mu_);
    const int target = done_ + 1;
    tasks_[i] = std::move(fn);
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int done_ = 0;
  bool stop_ = false;
};

class ArenaTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kTestMiB);
    ctx_ = MakeCurrent(0);
  }
  // Runs `fn` on a new thread with this test's context current, and waits
  // for the thread to exit (its slot is free again afterwards).
  template <typename Fn>
  void OnNewThread(Fn fn) {
    std::thread t([&] {
      ASSERT_EQ(sim::cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
      fn();
    });
    t.join();
  }
  // As many arenas as slots: distinct live threads never share one, and an
  // arena is idle exactly when its one slot is free.
  static AllocatorOptions OneArenaPerSlot() {
    AllocatorOptions o;
    o.arenas = 64;
    return o;
  }

  CUcontext ctx_ = nullptr;
};

TEST_F(ArenaTest, LiveThreadsPackIntoGranulesOfTheirOwn) {
  ShimCore shim(api_, OneArenaPerSlot());
  Allocator& a = shim.allocator();
  Workers w(2, ctx_);
  CUdeviceptr p = 0, q = 0;
  w.Run(0, [&] { p = MustAllocate(a, 512); });
  sim::ResetCallCounts();
  w.Run(1, [&] { q = MustAllocate(a, 512); });
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 1u);  // the second arena's own granule
  EXPECT_NE(a.Find(p)->range_base, a.Find(q)->range_base);
  ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(a.Free(q).ok());

  // With one arena both share the granule (the behaviour before arenas).
  AllocatorOptions one;
  one.arenas = 1;
  ShimCore shim_b(api_, one);
  Allocator& b = shim_b.allocator();
  w.Run(0, [&] { p = MustAllocate(b, 512); });
  w.Run(1, [&] { q = MustAllocate(b, 512); });
  EXPECT_EQ(b.Find(p)->range_base, b.Find(q)->range_base);
  ASSERT_TRUE(b.Free(p).ok());
  ASSERT_TRUE(b.Free(q).ok());
}

TEST_F(ArenaTest, ANewThreadTakesTheSlotAndCacheAnExitedThreadLeft) {
  ShimCore shim(api_, OneArenaPerSlot());
  Allocator& a = shim.allocator();
  int first_slot = -1, second_slot = -1;
  CUdeviceptr p = 0, q = 0, g = 0, h = 0;
  OnNewThread([&] {
    first_slot = ThreadSlot();
    p = MustAllocate(a, 4 * kTestMiB);
    g = MustAllocate(a, 512);
    ASSERT_TRUE(a.Free(p).ok());
    ASSERT_TRUE(a.Free(g).ok());
  });
  sim::ResetCallCounts();
  OnNewThread([&] {
    second_slot = ThreadSlot();
    q = MustAllocate(a, 4 * kTestMiB);
    h = MustAllocate(a, 512);
  });
  EXPECT_EQ(second_slot, first_slot);
  EXPECT_EQ(q, p);
  EXPECT_EQ(h, g);
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 0u);
  ASSERT_TRUE(a.Free(q).ok());
  ASSERT_TRUE(a.Free(h).ok());
}

TEST_F(ArenaTest, AMissTakesCachedMemoryOfAnIdleArenaButNotOfABusyOne) {
  ShimCore shim(api_, OneArenaPerSlot());
  Allocator& a = shim.allocator();
  Workers w(2, ctx_);
  CUdeviceptr busy = 0, idle = 0, got = 0;
  // Worker 0's arena caches a 4 MiB block; worker 0 stays alive.
  w.Run(0, [&] { ASSERT_TRUE(a.Free(busy = MustAllocate(a, 4 * kTestMiB)).ok()); });
  // Worker 1 misses in its own arena and does not reach into worker 0's.
  sim::ResetCallCounts();
  w.Run(1, [&] { got = MustAllocate(a, 4 * kTestMiB); });
  EXPECT_NE(got, busy);
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 1u);
  ASSERT_TRUE(a.Free(got).ok());
  // A thread that exited left a 6 MiB block in an arena no one works in now
  // (worker 0 and 1 hold theirs; the next new thread would take the exited
  // one's slot, so worker 1 asks instead).
  Workers keep(1, ctx_);  // holds the lowest free slot, so the next thread gets another
  OnNewThread([&] { ASSERT_TRUE(a.Free(idle = MustAllocate(a, 6 * kTestMiB)).ok()); });
  sim::ResetCallCounts();
  w.Run(1, [&] { got = MustAllocate(a, 6 * kTestMiB); });
  EXPECT_EQ(got, idle);
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 0u);
  ASSERT_TRUE(a.Free(got).ok());
}

TEST_F(ArenaTest, TheCacheLimitHoldsForAllArenasTogether) {
  AllocatorOptions o = OneArenaPerSlot();
  o.cache_limit_percent = -1;
  o.cache_limit_bytes = 8 * kTestMiB;
  ShimCore shim(api_, o);
  Allocator& a = shim.allocator();
  Workers w(2, ctx_);
  w.Run(0, [&] { ASSERT_TRUE(a.Free(MustAllocate(a, 4 * kTestMiB)).ok()); });
  EXPECT_EQ(shim.control().IdleBytes(0), 4 * kTestMiB);
  // 4 + 6 MiB would pass the limit: the second arena's block is released.
  w.Run(1, [&] { ASSERT_TRUE(a.Free(MustAllocate(a, 6 * kTestMiB)).ok()); });
  EXPECT_EQ(shim.control().IdleBytes(0), 4 * kTestMiB);
  EXPECT_EQ(shim.control().GetStats().devices[0].cached_bytes, 4 * kTestMiB);
  EXPECT_EQ(shim.control().GetStats().devices[0].handle_bytes, 4 * kTestMiB);
}

TEST_F(ArenaTest, OutOfMemoryReleasesTheOtherArenasCaches) {
  AllocatorOptions o = OneArenaPerSlot();
  o.cache_limit_percent = 100;
  ShimCore shim(api_, o);  // 256 MiB devices
  Allocator& a = shim.allocator();
  Workers w(2, ctx_);
  w.Run(0, [&] { ASSERT_TRUE(a.Free(MustAllocate(a, 160 * kTestMiB)).ok()); });
  EXPECT_EQ(shim.control().IdleBytes(0), 160 * kTestMiB);
  CUdeviceptr q = 0;
  w.Run(1, [&] { q = MustAllocate(a, 200 * kTestMiB); });  // too big for the cached block
  EXPECT_NE(q, 0u);
  EXPECT_EQ(shim.control().IdleBytes(0), 0u);
  ASSERT_TRUE(a.Free(q).ok());
  // Trim (vmmshim_release_cached_memory) covers every arena.
  EXPECT_EQ(shim.control().Trim(-1), 200 * kTestMiB);
  EXPECT_EQ(shim.control().GetStats().devices[0].handle_bytes, 0u);
}

TEST_F(ArenaTest, FiguresAreSumsAndPeaksOfTheSum) {
  ShimCore shim(api_, OneArenaPerSlot());
  Allocator& a = shim.allocator();
  Workers w(2, ctx_);
  CUdeviceptr p = 0, q = 0;
  w.Run(0, [&] { p = MustAllocate(a, 4 * kTestMiB); });
  w.Run(1, [&] { q = MustAllocate(a, 6 * kTestMiB); });
  ASSERT_TRUE(a.Free(p).ok());  // freed by another thread: in p's arena
  EXPECT_FALSE(a.Find(p).ok());
  EXPECT_EQ(ToCuResult(a.Free(p)), CUDA_ERROR_INVALID_VALUE);  // double free
  ASSERT_TRUE(a.Free(q).ok());
  const DeviceStats s = shim.control().GetStats().devices[0];
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.frees, 2u);
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.peak_live_bytes, 10 * kTestMiB);
  EXPECT_EQ(s.peak_handle_bytes, 10 * kTestMiB);
  EXPECT_EQ(s.handles, 2u);  // both cached
  EXPECT_EQ(s.cached_bytes, 10 * kTestMiB);
}

TEST_F(ArenaTest, PeerChangesAndContextReleasesReachEveryArena) {
  ShimCore shim(api_, OneArenaPerSlot());
  Allocator& a = shim.allocator();
  Workers w(2, ctx_);
  CUdeviceptr p = 0, q = 0;
  w.Run(0, [&] { p = MustAllocate(a, 4 * kTestMiB); });
  w.Run(1, [&] { q = MustAllocate(a, 512); });
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());
  EXPECT_TRUE(*shim.peers().PeerHasAccess(p, 1));
  EXPECT_TRUE(*shim.peers().PeerHasAccess(q, 1));
  char c = 0;
  EXPECT_EQ(sim::DeviceRead(1, &c, q, 1), CUDA_SUCCESS);
  ASSERT_TRUE(shim.peers().DisablePeer(1, 0).ok());
  EXPECT_FALSE(*shim.peers().PeerHasAccess(p, 1));
  EXPECT_FALSE(*shim.peers().PeerHasAccess(q, 1));
  EXPECT_EQ(a.ReleaseContext(ctx_, /*synchronize=*/true), 4 * kTestMiB + 2 * kTestMiB);
  EXPECT_EQ(shim.control().GetStats().devices[0].context_releases, 1u);
  EXPECT_EQ(shim.control().GetStats().devices[0].handle_bytes, 0u);
}

}  // namespace
}  // namespace vmmshim
