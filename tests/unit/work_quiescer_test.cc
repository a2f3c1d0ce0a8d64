// core/sleep/work_quiescer.h and core/sleep/sleep_coordinator.h on the
// simulated driver: threads that launch work on the shim's memory while a
// pause arrives wait and go on after the resume with no fault; a call that
// stays inside the driver, or a host function that calls a gated entry
// point, makes the quiesce time out, undone; a capture refuses it; a pause
// of tags lets the threads go on at once; a sole submitter's pause closes
// nothing; a sleep holds everything until the wake.
#include "core/sleep/sleep_coordinator.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "core/sleep/work_quiescer.h"
#include "core/sync/submission_gate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

using std::chrono::milliseconds;

constexpr size_t kBytes = 4 * kTestMiB;

template <typename Done>
bool WaitFor(Done done, milliseconds limit = milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

class WorkQuiescerTest : public SimTest {
 public:
  // A gated memset of `p`, as interpose/hooks_submission.cc makes it.
  CUresult GatedMemset(CUdeviceptr p, unsigned char value) {
    SubmissionGate::Ticket ticket;
    while (!gate_.TryEnter(1, &ticket)) gate_.WaitWhileClosed();
    CUresult r = api_.cuMemsetD8Async(p, value, kBytes, nullptr);
    gate_.Exit(ticket);
    return r;
  }
  CUcontext context() const { return context_; }
  SubmissionGate& gate() { return gate_; }
  void ExpectSleepRefusedWhileAnOrphanedViewStays(bool keep_contents, int failed_unmaps);

 protected:
  void SetUp() override {
    StartSim(2, 256 * kTestMiB);
    context_ = MakeCurrent(0);
  }
  void TearDown() override { sim::ReleaseHeldCalls(); }

  // Threads that keep writing `p` until `stop`, counting what failed.
  void StartLaunching(CUdeviceptr p, int threads) {
    for (int i = 0; i < threads; ++i) {
      launchers_.emplace_back([this, p, i] {
        sim::cuCtxSetCurrent(context_);
        while (!stop_) {
          if (GatedMemset(p, static_cast<unsigned char>(i + 1)) != CUDA_SUCCESS) ++faults_;
          ++launches_;
        }
      });
    }
  }
  void StopLaunching() {
    stop_ = true;
    for (std::thread& t : launchers_) t.join();
    launchers_.clear();
  }

  CUcontext context_ = nullptr;
  SubmissionGate gate_;
  std::vector<std::thread> launchers_;
  std::atomic<bool> stop_{false};
  std::atomic<int> faults_{0};
  std::atomic<long> launches_{0};
};

TEST_F(WorkQuiescerTest, LaunchingThreadsWaitThroughAPauseOfEverythingAndGoOnAfterTheResume) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  ASSERT_TRUE(kv.ok() && kv->served);
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  StartLaunching(kv->ptr, 2);
  for (int cycle = 0; cycle < 20; ++cycle) {
    std::this_thread::sleep_for(milliseconds(2));
    absl::StatusOr<size_t> paused = sleeper.Pause(TagSelection::All(), true, BackupKind(), false);
    ASSERT_TRUE(paused.ok()) << paused.status();
    EXPECT_GT(*paused, 0u);
    EXPECT_TRUE(gate_.closed());
    EXPECT_TRUE(sleeper.holding());
    const long held_at = launches_.load();
    std::this_thread::sleep_for(milliseconds(5));
    EXPECT_EQ(launches_.load(), held_at) << "a thread launched while everything was paused";
    absl::StatusOr<size_t> resumed = sleeper.Resume(TagSelection::All(), false);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_FALSE(gate_.closed());
  }
  StopLaunching();
  EXPECT_EQ(faults_.load(), 0);
  EXPECT_GT(launches_.load(), 20);
}

TEST_F(WorkQuiescerTest, WithoutTheGateTheSameLaunchesFault) {
  // The test above would catch a gate that held nothing: launches that do
  // not pass it meet the paused memory (faulting where nothing is mapped
  // there: VMMSHIM_PAUSED_ACCESS=fault).
  ShimCore shim(api_, FaultingPauses());
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  ASSERT_TRUE(kv.ok() && kv->served);
  std::atomic<int> faults{0};
  std::thread t([&] {
    sim::cuCtxSetCurrent(context_);
    while (!stop_) {
      if (api_.cuMemsetD8Async(kv->ptr, 1, kBytes, nullptr) != CUDA_SUCCESS) ++faults;
    }
  });
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  std::this_thread::sleep_for(milliseconds(20));
  stop_ = true;
  t.join();
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_GT(faults.load(), 0);
}

TEST_F(WorkQuiescerTest, APauseOfATagLetsTheThreadsGoOnOnceItIsDone) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  absl::StatusOr<Allocator::Allocation> weights = a.Allocate(kBytes, "weights");
  ASSERT_TRUE(kv.ok() && weights.ok());
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  StartLaunching(weights->ptr, 2);
  absl::StatusOr<size_t> paused =
      sleeper.Pause(TagSelection::Only("kv"), true, BackupKind(), false);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_FALSE(gate_.closed());
  EXPECT_FALSE(sleeper.holding());
  const long at = launches_.load();
  EXPECT_TRUE(WaitFor([&] { return launches_.load() > at + 10; }));
  StopLaunching();
  EXPECT_EQ(faults_.load(), 0);
  ASSERT_TRUE(sleeper.Resume(TagSelection::Only("kv"), false).ok());
}

TEST_F(WorkQuiescerTest, AHoldEndsWhenResumesOfTagsLeaveNothingPausedAndRefusesASleep) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  absl::StatusOr<Allocator::Allocation> weights = a.Allocate(kBytes, "weights");
  ASSERT_TRUE(kv.ok() && weights.ok());
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  ASSERT_TRUE(sleeper.Pause(TagSelection::All(), true, BackupKind(), false).ok());
  EXPECT_TRUE(sleeper.holding());
  absl::StatusOr<size_t> slept = sleeper.Sleep({});
  EXPECT_EQ(ToCuResult(slept.status()), CUDA_ERROR_ILLEGAL_STATE) << slept.status();
  ASSERT_TRUE(sleeper.Resume(TagSelection::Only("kv"), false).ok());
  EXPECT_TRUE(sleeper.holding());  // the weights are still paused
  ASSERT_TRUE(sleeper.Resume(TagSelection::Only("weights"), false).ok());
  EXPECT_FALSE(sleeper.holding());
  EXPECT_FALSE(gate_.closed());
}

TEST_F(WorkQuiescerTest, ASoleSubmittersPauseClosesNothing) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  ASSERT_TRUE(kv.ok());
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  // The synchronizes of the pause alone, as the coordinator runs it.
  uint64_t syncs = sim::SyncCount(0);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  const uint64_t pause_alone = sim::SyncCount(0) - syncs;
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  syncs = sim::SyncCount(0);
  ASSERT_TRUE(sleeper.Pause(TagSelection::All(), true, BackupKind(), true).ok());
  EXPECT_FALSE(gate_.closed());
  EXPECT_FALSE(sleeper.holding());
  // The pause's own synchronizes only, no quiesce's.
  EXPECT_EQ(sim::SyncCount(0) - syncs, pause_alone);
  ASSERT_TRUE(sleeper.Resume(TagSelection::All(), false).ok());
}

TEST_F(WorkQuiescerTest, ACallThatStaysInsideTheDriverTimesOutNamedAndUndone) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  ASSERT_TRUE(kv.ok());
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(100));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  sim::HoldCalls("cuMemsetD8Async");
  std::thread t([&] {
    sim::cuCtxSetCurrent(context_);
    GatedMemset(kv->ptr, 7);
  });
  ASSERT_TRUE(sim::WaitForHeldCall(5000));
  absl::StatusOr<size_t> paused = sleeper.Pause(TagSelection::All(), true, BackupKind(), false);
  ASSERT_FALSE(paused.ok());
  EXPECT_EQ(ToCuResult(paused.status()), CUDA_ERROR_TIMEOUT);
  // Named by the gate's entry number (1 here: the list's first entry).
  EXPECT_NE(paused.status().message().find(std::string("in ") + kWorkSubmissionNames[0]),
            std::string::npos)
      << paused.status();
  EXPECT_FALSE(gate_.closed());
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
  sim::ReleaseHeldCalls();
  t.join();
}

TEST_F(WorkQuiescerTest, AHostFunctionThatSubmitsWhileClosedTimesOutUnlessExempt) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  ASSERT_TRUE(kv.ok());
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(200));
  struct Call {
    WorkQuiescerTest* test;
    CUdeviceptr p;
    bool exempt;
    std::atomic<bool> start{false}, done{false};
    CUresult result = CUDA_ERROR_UNKNOWN;
  };
  auto host_fn = [](void* arg) {
    Call* c = static_cast<Call*>(arg);
    while (!c->start) std::this_thread::sleep_for(milliseconds(1));
    sim::cuCtxSetCurrent(c->test->context());
    if (c->exempt) {
      SubmissionGate::ExemptScope exempt;
      c->result = c->test->GatedMemset(c->p, 3);
    } else {
      c->result = c->test->GatedMemset(c->p, 3);
    }
    c->done = true;
  };
  for (bool exempt : {false, true}) {
    SCOPED_TRACE(exempt ? "exempt" : "not exempt");
    Call call{this, kv->ptr, exempt};
    ASSERT_EQ(api_.cuLaunchHostFunc(nullptr, host_fn, &call), CUDA_SUCCESS);
    std::thread starter([&] {
      std::this_thread::sleep_for(milliseconds(20));  // once the gate is closed
      call.start = true;
    });
    absl::Status quiet = quiescer.Quiesce();
    starter.join();
    if (exempt) {
      ASSERT_TRUE(quiet.ok()) << quiet;
      EXPECT_TRUE(call.done.load());
      EXPECT_GE(gate_.exempt_passes(), 1u);
      quiescer.Release();
    } else {
      ASSERT_FALSE(quiet.ok());
      EXPECT_EQ(ToCuResult(quiet), CUDA_ERROR_TIMEOUT);
      EXPECT_NE(quiet.message().find("device 0"), std::string::npos) << quiet;
      EXPECT_FALSE(gate_.closed());
    }
    EXPECT_TRUE(WaitFor([&] { return call.done.load(); }));
    EXPECT_EQ(call.result, CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);  // the host function's thread is done
  }
}

TEST_F(WorkQuiescerTest, AStreamCaptureRefusesTheQuiesceUntouched) {
  ShimCore shim(api_);
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(1000));
  const CUstream stream = reinterpret_cast<CUstream>(0x61);
  shim.captures().Began(stream, false);
  absl::Status quiet = quiescer.Quiesce();
  EXPECT_EQ(ToCuResult(quiet), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) << quiet;
  EXPECT_FALSE(gate_.closed());
}

TEST_F(WorkQuiescerTest, ASleepHoldsEveryThreadUntilTheWakeAndAFailedStepUndoesIt) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  absl::StatusOr<Allocator::Allocation> weights = a.Allocate(kBytes, "weights");
  ASSERT_TRUE(kv.ok() && weights.ok());
  Fill(weights->ptr, kBytes, 5);
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  StartLaunching(kv->ptr, 2);
  std::this_thread::sleep_for(milliseconds(5));
  absl::StatusOr<size_t> slept = sleeper.Sleep({"kv"});
  ASSERT_TRUE(slept.ok()) << slept.status();
  EXPECT_GE(*slept, 2 * kBytes);
  const long held_at = launches_.load();
  std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(launches_.load(), held_at);
  ASSERT_TRUE(sleeper.Wake().ok());
  EXPECT_TRUE(Holds(weights->ptr, kBytes, 5));
  EXPECT_TRUE(WaitFor([&] { return launches_.load() > held_at + 10; }));
  StopLaunching();
  EXPECT_EQ(faults_.load(), 0);

  // A pause that fails (the driver refuses a copy) resumes what the sleep
  // paused and opens the gate.
  sim::FailCall("cuMemcpyDtoH_v2", 1, CUDA_ERROR_UNKNOWN);
  sim::FailCall("cuMemcpyDtoHAsync_v2", 1, CUDA_ERROR_UNKNOWN);
  absl::StatusOr<size_t> failed = sleeper.Sleep({});
  sim::ClearFailures();
  ASSERT_FALSE(failed.ok());
  EXPECT_FALSE(gate_.closed());
  EXPECT_FALSE(sleeper.holding());
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
  EXPECT_TRUE(Holds(weights->ptr, kBytes, 5));
}

// The host memory kept for the next addressable pause is page-locked and
// unused while asleep: the sleep releases it before the checkpoint and
// maps no host memory of its own; the wake brings everything back.
TEST_F(WorkQuiescerTest, ASleepReleasesTheHostMemoryKeptForPausesAndMapsNone) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  ASSERT_TRUE(kv.ok());
  Fill(kv->ptr, kBytes, 6);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_EQ(sim::GetUsage().host_handle_bytes, kBytes);  // kept for the next pause
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  ASSERT_TRUE(sleeper.Sleep({}).ok());
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  EXPECT_EQ(sim::GetUsage().handles, 0u);
  ASSERT_TRUE(sleeper.Wake().ok());
  EXPECT_TRUE(Holds(kv->ptr, kBytes, 6));
  ASSERT_TRUE(a.Free(kv->ptr).ok());
}

// The scratch a pause without contents mapped is kept for the next such
// pause, and is host VMM memory too: the sleep releases it with the rest
// (Note [The driver's checkpoint and host VMM memory]; on an H100 one kept
// scratch granule made the driver's restore fail and the process never
// woke).
TEST_F(WorkQuiescerTest, ASleepReleasesTheScratchThatAPauseWithoutContentsKept) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  absl::StatusOr<Allocator::Allocation> weights = a.Allocate(kBytes, "weights");
  ASSERT_TRUE(kv.ok() && weights.ok());
  Fill(weights->ptr, kBytes, 3);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), false).ok());
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  ASSERT_EQ(sim::GetUsage().host_handles, 1u);  // the scratch, kept
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  ASSERT_TRUE(sleeper.Sleep({}).ok());
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  EXPECT_EQ(sim::GetUsage().handles, 0u);
  ASSERT_TRUE(sleeper.Wake().ok());
  EXPECT_TRUE(Holds(weights->ptr, kBytes, 3));
  // The next pause without contents makes its scratch again.
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), false).ok());
  EXPECT_EQ(sim::GetUsage().host_handles, 1u);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  for (CUdeviceptr p : {kv->ptr, weights->ptr}) ASSERT_TRUE(a.Free(p).ok());
}

// Host memory still mapped at a view the driver would not unmap (kept by
// OrphanedMemory until it does) cannot be released: the sleep is refused,
// naming it, and undone, rather than leaving a process the driver's restore
// cannot bring back. Once the view goes, the sleep goes through. Tag "tmp"
// is paused with or without its contents (a view of its backup, or of the
// pool's scratch, which the pool lets go while the view still holds it);
// `failed_unmaps` of the context release's cuMemUnmap calls fail.
void WorkQuiescerTest::ExpectSleepRefusedWhileAnOrphanedViewStays(bool keep_contents,
                                                                   int failed_unmaps) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> tmp = a.Allocate(kBytes, "tmp");
  ASSERT_TRUE(tmp.ok());
  Fill(tmp->ptr, kBytes, 1);
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("tmp"), keep_contents).ok());
  for (int i = 0; i < failed_unmaps; ++i) sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  a.ReleaseContext(context(), /*synchronize=*/true);
  sim::ClearFailures();
  absl::StatusOr<Allocator::Allocation> weights = a.Allocate(kBytes, "weights");
  ASSERT_TRUE(weights.ok());
  Fill(weights->ptr, kBytes, 2);
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  absl::StatusOr<size_t> refused = sleeper.Sleep({});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(ToCuResult(refused.status()), CUDA_ERROR_ILLEGAL_STATE);
  EXPECT_THAT(std::string(refused.status().message()),
              testing::HasSubstr("bytes of host VMM memory are still mapped"));
  EXPECT_FALSE(sleeper.holding());
  EXPECT_FALSE(gate_.closed());
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
  EXPECT_TRUE(Holds(weights->ptr, kBytes, 2));
  shim.control().Trim();  // the view unmaps now, and its host memory goes
  ASSERT_TRUE(sleeper.Sleep({}).ok());
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  ASSERT_TRUE(sleeper.Wake().ok());
  EXPECT_TRUE(Holds(weights->ptr, kBytes, 2));
  ASSERT_TRUE(a.Free(weights->ptr).ok());
}

TEST_F(WorkQuiescerTest, ASleepIsRefusedWhileHostMemoryStaysMappedAtAView) {
  ExpectSleepRefusedWhileAnOrphanedViewStays(/*keep_contents=*/true, /*failed_unmaps=*/1);
}

// A scratch view is unmapped piece by piece where its range fails: the
// range's unmap and the first piece's fail.
TEST_F(WorkQuiescerTest, ASleepIsRefusedWhileAViewStillMapsTheScratch) {
  ExpectSleepRefusedWhileAnOrphanedViewStays(/*keep_contents=*/false, /*failed_unmaps=*/2);
}

// A wake that fails leaves everything paused as the sleep paused it: no
// host memory mapped over what the sleep dropped (the sleep maps none).
TEST_F(WorkQuiescerTest, AFailedWakeMapsNoHostMemory) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(kBytes, "kv");
  absl::StatusOr<Allocator::Allocation> weights = a.Allocate(kBytes, "weights");
  ASSERT_TRUE(kv.ok() && weights.ok());
  Fill(weights->ptr, kBytes, 7);
  WorkQuiescer quiescer(api_, gate_, shim.captures(), milliseconds(5000));
  SleepCoordinator sleeper(shim.pause(), quiescer, nullptr, nullptr);
  ASSERT_TRUE(sleeper.Sleep({"kv"}).ok());
  sim::FailCall("cuMemMap", 2, CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(sleeper.Wake().ok());
  sim::ClearFailures();
  EXPECT_EQ(sim::GetUsage().host_handles, 0u);
  EXPECT_TRUE(sleeper.holding());
  ASSERT_TRUE(sleeper.Wake().ok());
  EXPECT_TRUE(Holds(weights->ptr, kBytes, 7));
  for (CUdeviceptr p : {kv->ptr, weights->ptr}) ASSERT_TRUE(a.Free(p).ok());
}

}  // namespace
}  // namespace vmmshim
