// core/sync/submission_gate.h: threads submitting while the gate closes wait
// and go on after it opens; the closer waits for the calls inside; no
// submission runs between a close and the open (the pause sees none); the
// closer and exempt threads pass; a fork()ed child finds the gate open.
#include "core/sync/submission_gate.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace vmmshim {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// What a gated hook does (interpose/hooks_submission.cc), around `submit`.
template <typename Submit>
void Gated(SubmissionGate& gate, uint32_t entry, Submit submit) {
  SubmissionGate::Ticket ticket;
  while (!gate.TryEnter(entry, &ticket)) gate.WaitWhileClosed();
  submit();
  gate.Exit(ticket);
}

bool WaitFor(const std::function<bool()>& done, milliseconds limit = milliseconds(5000)) {
  const auto deadline = steady_clock::now() + limit;
  while (!done()) {
    if (steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(SubmissionGateTest, AnOpenGatePassesAndLeavesNoCallInside) {
  SubmissionGate gate;
  int submitted = 0;
  Gated(gate, 7, [&] { ++submitted; });
  EXPECT_EQ(submitted, 1);
  gate.Close();
  EXPECT_TRUE(gate.WaitForCallsInside(steady_clock::now()).empty());
  gate.Open();
}

TEST(SubmissionGateTest, AThreadThatArrivesWhileClosedWaitsAndGoesOnAfterTheOpen) {
  SubmissionGate gate;
  gate.Close();
  std::atomic<bool> submitted{false};
  std::thread t([&] { Gated(gate, 3, [&] { submitted = true; }); });
  ASSERT_TRUE(WaitFor([&] { return gate.waiting() == 1; }));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(submitted.load());
  // The closing thread itself passes.
  bool mine = false;
  Gated(gate, 3, [&] { mine = true; });
  EXPECT_TRUE(mine);
  gate.Open();
  t.join();
  EXPECT_TRUE(submitted.load());
  EXPECT_EQ(gate.waiting(), 0);
}

TEST(SubmissionGateTest, TheCloserWaitsForACallInsideAndNamesItAtTheDeadline) {
  SubmissionGate gate;
  std::atomic<bool> inside{false}, leave{false};
  std::thread t([&] {
    Gated(gate, 42, [&] {
      inside = true;
      while (!leave) std::this_thread::sleep_for(milliseconds(1));
    });
  });
  ASSERT_TRUE(WaitFor([&] { return inside.load(); }));
  gate.Close();
  std::vector<SubmissionGate::Inside> still = gate.WaitForCallsInside(steady_clock::now() +
                                                                      milliseconds(50));
  ASSERT_EQ(still.size(), 1u);
  EXPECT_EQ(still[0].entry, 42u);
  EXPECT_GT(still[0].tid, 0);
  leave = true;
  EXPECT_TRUE(gate.WaitForCallsInside(steady_clock::now() + milliseconds(5000)).empty());
  gate.Open();
  t.join();
}

TEST(SubmissionGateTest, NoSubmissionRunsBetweenACloseAndItsOpen) {
  SubmissionGate gate;
  std::atomic<bool> paused{false}, stop{false};
  std::atomic<int> violations{0};
  std::atomic<long> submissions{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      while (!stop) {
        Gated(gate, 1 + i, [&] {
          if (paused) ++violations;
          ++submissions;
        });
      }
    });
  }
  for (int round = 0; round < 200; ++round) {
    gate.Close();
    ASSERT_TRUE(gate.WaitForCallsInside(steady_clock::now() + milliseconds(5000)).empty());
    paused = true;  // what the pause would unmap now
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    paused = false;
    gate.Open();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(submissions.load(), 200);
}

TEST(SubmissionGateTest, AThreadGivenTheRecordOfAnExitedCloserIsHeld) {
  // The closer is a claim, not a record: the record an exited closer gave
  // back makes no later thread the closer.
  SubmissionGate gate;
  std::thread closer([&] { gate.Close(); });
  closer.join();
  std::atomic<bool> submitted{false};
  std::thread later([&] { Gated(gate, 4, [&] { submitted = true; }); });
  ASSERT_TRUE(WaitFor([&] { return gate.waiting() == 1; }));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(submitted.load());
  gate.Open();
  later.join();
  EXPECT_TRUE(submitted.load());
}

TEST(SubmissionGateTest, AWaitWithALimitSaysWhetherTheThreadMayPass) {
  SubmissionGate gate;
  gate.Close();
  bool passed = true;
  std::thread t([&] { passed = gate.WaitWhileClosed(milliseconds(30)); });
  t.join();
  EXPECT_FALSE(passed);
  gate.Open();
  EXPECT_TRUE(gate.WaitWhileClosed(milliseconds(30)));
}

TEST(SubmissionGateTest, AnExemptThreadPassesAndIsCounted) {
  SubmissionGate gate;
  gate.Close();
  std::atomic<bool> submitted{false};
  std::thread t([&] {
    SubmissionGate::ExemptScope exempt;
    Gated(gate, 5, [&] { submitted = true; });
  });
  t.join();
  EXPECT_TRUE(submitted.load());
  EXPECT_EQ(gate.exempt_passes(), 1u);
  gate.Open();
}

TEST(SubmissionGateTest, ASignalHandlerThatSubmitsOnAWaitingThreadWaitsToo) {
  // The wait takes no lock: a nested wait from a handler cannot deadlock.
  static SubmissionGate* gate = nullptr;
  static std::atomic<int> handled{0};
  SubmissionGate g;
  gate = &g;
  handled = 0;
  struct sigaction sa = {};
  sa.sa_handler = [](int) {
    Gated(*gate, 9, [] {});
    ++handled;
  };
  struct sigaction old;
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  g.Close();
  std::atomic<bool> done{false};
  std::atomic<pthread_t> id{};
  std::thread t([&] {
    id = pthread_self();
    Gated(g, 8, [] {});
    done = true;
  });
  ASSERT_TRUE(WaitFor([&] { return g.waiting() == 1; }));
  pthread_kill(id.load(), SIGUSR1);
  ASSERT_TRUE(WaitFor([&] { return g.waiting() == 2; }));  // the handler waits, nested
  g.Open();
  t.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(handled.load(), 1);
  sigaction(SIGUSR1, &old, nullptr);
}

TEST(SubmissionGateTest, AForkedChildFindsTheGateOpen) {
  SubmissionGate gate;
  std::atomic<bool> inside{false}, leave{false};
  std::thread t([&] {
    Gated(gate, 2, [&] {
      inside = true;
      while (!leave) std::this_thread::sleep_for(milliseconds(1));
    });
  });
  ASSERT_TRUE(WaitFor([&] { return inside.load(); }));
  std::thread closer([&] { gate.Close(); });  // closed by a thread the child lacks
  closer.join();
  const pid_t child = fork();
  if (child == 0) {
    gate.AfterForkChild();
    // Open, nobody inside, and this thread's submission passes at once.
    bool ok = !gate.closed() && gate.WaitForCallsInside(steady_clock::now()).empty();
    SubmissionGate::Ticket ticket;
    const bool passed = gate.TryEnter(2, &ticket);
    if (passed) gate.Exit(ticket);
    _exit(ok && passed ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  leave = true;
  t.join();
  gate.Open();
}

}  // namespace
}  // namespace vmmshim
