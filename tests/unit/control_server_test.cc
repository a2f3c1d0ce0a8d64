// The control socket's requests (ControlServer::Answer,
// core/control/control_server.h) with a ControlTarget of the test's own: the
// sleep's state machine, a status while asleep that makes no driver call,
// and the refusals that come before anything is paused; and its listener:
// idle and trickling clients delay no other request, a status during a
// sleep answers at once, a connection over the bound is told busy, a
// stranger is refused naming both uids.
#include "core/control/control_server.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/base/unix_socket.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"

namespace vmmshim {
namespace {

// A ControlTarget whose answers are the test's functions (an unset one: an
// empty document, nothing paused, nothing shared; a sleep or wake of 1 byte).
struct TestTarget : ControlTarget {
  std::function<std::string()> residency_json;
  std::function<absl::StatusOr<size_t>(const std::vector<std::string>&)> sleep;
  std::function<absl::StatusOr<size_t>()> wake;
  std::function<size_t()> paused_bytes;
  std::function<std::string()> shared_memory;

  std::string ResidencyJson() const override {
    return residency_json ? residency_json() : R"({"devices":[]})";
  }
  absl::StatusOr<size_t> Sleep(const std::vector<std::string>& drop) override {
    return sleep ? sleep(drop) : absl::StatusOr<size_t>(1);
  }
  absl::StatusOr<size_t> Wake() override { return wake ? wake() : absl::StatusOr<size_t>(1); }
  size_t PausedBytes() const override { return paused_bytes ? paused_bytes() : 0; }
  std::string SharedMemory() const override { return shared_memory ? shared_memory() : ""; }
};

// A server holds a reference to its target, and the listener's servers are
// never destroyed (as in the shim): the targets are kept, reachable.
TestTarget& Kept(TestTarget target) {
  static auto* kept = new std::vector<std::unique_ptr<TestTarget>>;
  kept->push_back(std::make_unique<TestTarget>(std::move(target)));
  return *kept->back();
}

constexpr char kResidency[] =
    R"({"devices":[{"device":0,"other_libraries_vmm":{"paused_by_tag":{"kv":OTHER_PAUSED},)"
    R"("left_alone":{"exported_bytes":EXPORTED,"imported_bytes":0}}}]})";

struct Calls {
  int residency = 0, sleeps = 0, wakes = 0;
  size_t paused = 0;
  int sleep_code = 0;
  std::string exported = "0";
  std::string other_paused = "0";  // other libraries' VMM memory the program paused
  std::string shared;  // the shared_memory handler's answer
};

ControlServer Server(Calls& calls) {
  TestTarget h;
  h.residency_json = [&calls] {
    ++calls.residency;
    std::string r = kResidency;
    r.replace(r.find("EXPORTED"), 8, calls.exported);
    r.replace(r.find("OTHER_PAUSED"), 12, calls.other_paused);
    return r;
  };
  h.sleep = [&calls](const std::vector<std::string>& drop) -> absl::StatusOr<size_t> {
    ++calls.sleeps;
    if (calls.sleep_code != 0) {
      return DriverError(static_cast<CUresult>(calls.sleep_code), "the test's pause");
    }
    return 100 + drop.size();
  };
  h.wake = [&calls]() -> absl::StatusOr<size_t> {
    ++calls.wakes;
    return size_t{100};
  };
  h.paused_bytes = [&calls] { return calls.paused; };
  h.shared_memory = [&calls] { return calls.shared; };
  return ControlServer("/tmp/unused", Kept(std::move(h)));
}

bool Has(const std::string& reply, const std::string& part) {
  return reply.find(part) != std::string::npos;
}

TEST(ControlServerTest, ASleepGoesRunningSleepingAsleepRunning) {
  Calls calls;
  const ControlServer server = Server(calls);
  EXPECT_TRUE(Has(server.Answer(R"({"op":"status"})"), R"("state":"running")"));
  const std::string slept = server.Answer(R"({"op":"sleep","drop":["kv"]})");
  EXPECT_TRUE(Has(slept, R"("ok":true)")) << slept;
  EXPECT_TRUE(Has(slept, R"("released_bytes":101)")) << slept;
  EXPECT_EQ(calls.sleeps, 1);
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep"})"), "the process is sleeping already"));
  EXPECT_TRUE(Has(server.Answer(R"({"op":"slept"})"), R"("ok":true)"));
  // Asleep: the residency recorded at the sleep, no new driver call.
  const int before = calls.residency;
  EXPECT_TRUE(Has(server.Answer(R"({"op":"status"})"), R"("state":"asleep")"));
  EXPECT_EQ(calls.residency, before);
  EXPECT_TRUE(Has(server.Answer(R"({"op":"wake"})"), R"("restored_bytes":100)"));
  EXPECT_EQ(calls.wakes, 1);
  EXPECT_TRUE(Has(server.Answer(R"({"op":"wake"})"), "the process is running, not asleep"));
}

TEST(ControlServerTest, RefusalsComeBeforeAnythingIsPaused) {
  Calls calls;
  const ControlServer server = Server(calls);
  calls.paused = 4096;
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep"})"), "4096 bytes paused of its own"));
  // Other libraries' memory the program paused counts too (its views would
  // hold host VMM memory through the checkpoint).
  calls.other_paused = "2048";
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep"})"),
                  "6144 bytes paused of its own (2048 of them other libraries' VMM memory)"));
  calls.paused = 0;
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep"})"), "2048 bytes paused of its own"));
  calls.other_paused = "0";
  calls.exported = "8192";
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep"})"),
                  "shares device memory with other processes (8192 bytes exported"));
  EXPECT_EQ(calls.sleeps, 0);
  calls.exported = "0";
  calls.shared = "the process maps 4096 bytes of device memory that process 7 exported";
  const std::string mapped = server.Answer(R"({"op":"sleep"})");
  EXPECT_TRUE(Has(mapped, "4096 bytes of device memory that process 7 exported; the driver's "
                          "checkpoint cannot take memory shared between processes; nothing is "
                          "paused")) << mapped;
  EXPECT_TRUE(Has(mapped, R"("code":800)")) << mapped;
  // The status says so too, for a job's sleep to refuse before any pauses.
  const std::string status = server.Answer(R"({"op":"status"})");
  EXPECT_TRUE(Has(status, R"("sleep_refusal":"the process maps 4096 bytes)")) << status;
  EXPECT_EQ(calls.sleeps, 0);
  calls.shared.clear();
  EXPECT_FALSE(Has(server.Answer(R"({"op":"status"})"), "sleep_refusal"));
  calls.sleep_code = 800;  // CUDA_ERROR_NOT_PERMITTED: the shim's memory is exported
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep"})"), "exported to another process"));
  calls.sleep_code = 2;
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep"})"), "host memory is short"));
  EXPECT_TRUE(Has(server.Answer(R"({"op":"status"})"), R"("state":"running")"));
  EXPECT_TRUE(Has(server.Answer(R"({"op":"sleep","drop":[1]})"),
                  "must hold tags: strings of at most 255 bytes"));
  EXPECT_TRUE(Has(server.Answer("[1,2]"), "not a JSON object"));
}

// A listening server in a directory of its own (leaked with its threads, as
// in the shim).
class ControlListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vmmshim-control-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  const ControlServer& Start(TestTarget h) {
    auto* server = new ControlServer(dir_, Kept(std::move(h)));
    EXPECT_TRUE(server->Start().ok());
    path_ = ControlServer::SocketPath(dir_, getpid());
    return *server;
  }

  // The reply line to `request` (without the newline), "" when none came.
  std::string Ask(const std::string& request, int seconds = 5) {
    const int fd = ConnectTo(path_, seconds);
    if (fd < 0) return "";
    const std::string line = request + "\n";
    WriteAll(fd, line.data(), line.size());
    std::string reply;
    char c;
    while (ReadAll(fd, &c, 1) && c != '\n') reply.push_back(c);
    close(fd);
    return reply;
  }

  static double Since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  std::string dir_, path_;
};

TestTarget Quick() {
  TestTarget h;
  h.residency_json = [] { return std::string(R"({"devices":[]})"); };
  h.sleep = [](const std::vector<std::string>&) -> absl::StatusOr<size_t> { return 1; };
  h.wake = []() -> absl::StatusOr<size_t> { return 1; };
  return h;
}

TEST_F(ControlListenerTest, IdleAndTricklingClientsDelayNoOtherRequest) {
  Start(Quick());
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(ConnectTo(path_, 5));
  // One that sends a byte every 300 ms and never a newline.
  const int trickle = ConnectTo(path_, 5);
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    while (!stop) {
      WriteAll(trickle, "{", 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  const auto t = std::chrono::steady_clock::now();
  EXPECT_TRUE(Has(Ask(R"({"op":"status"})"), R"("state":"running")"));
  EXPECT_LT(Since(t), 0.5) << "a status waited behind idle clients";
  EXPECT_TRUE(Has(Ask(R"({"op":"sleep"})"), R"("ok":true)"));
  EXPECT_TRUE(Has(Ask(R"({"op":"wake"})"), R"("ok":true)"));
  EXPECT_LT(Since(t), 1.0);
  // Each idle client is cut off at its own deadline, the trickler too.
  for (int fd : idle) {
    std::string reply;
    char c;
    while (ReadAll(fd, &c, 1) && c != '\n') reply.push_back(c);
    EXPECT_TRUE(Has(reply, "no request line within 2 s")) << reply;
    close(fd);
  }
  EXPECT_LT(Since(t), 3.0);
  stop = true;
  trickler.join();
  close(trickle);
}

TEST_F(ControlListenerTest, AStatusDuringASleepAnswersAtOnceAndASecondSleepIsRefused) {
  std::atomic<bool> release{false}, pausing{false};
  TestTarget h = Quick();
  h.sleep = [&](const std::vector<std::string>&) -> absl::StatusOr<size_t> {
    pausing = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return 7;
  };
  Start(std::move(h));
  std::string slept;
  std::thread sleeper([&] { slept = Ask(R"({"op":"sleep"})", 30); });
  while (!pausing) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t = std::chrono::steady_clock::now();
  EXPECT_TRUE(Has(Ask(R"({"op":"status"})"), R"("state":"pausing")"));
  EXPECT_TRUE(Has(Ask(R"({"op":"sleep"})"), "the process is pausing already"));
  EXPECT_TRUE(Has(Ask(R"({"op":"wake"})"), "the process is pausing, not asleep"));
  EXPECT_LT(Since(t), 0.5);
  release = true;
  sleeper.join();
  EXPECT_TRUE(Has(slept, R"("released_bytes":7)")) << slept;
  EXPECT_TRUE(Has(Ask(R"({"op":"status"})"), R"("state":"sleeping")"));
}

TEST_F(ControlListenerTest, AConnectionOverTheBoundIsToldBusyAndLaterOnesAreServed) {
  Start(Quick());
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) idle.push_back(ConnectTo(path_, 5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all accepted
  const std::string busy = Ask(R"({"op":"status"})");
  EXPECT_TRUE(Has(busy, "answering 16 other requests")) << busy;
  EXPECT_TRUE(Has(busy, R"("code":600)")) << busy;
  for (int fd : idle) close(fd);  // their handlers notice at once
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(Has(Ask(R"({"op":"status"})"), R"("state":"running")"));
}

TEST_F(ControlListenerTest, AnotherUserIsRefusedNamingBothUids) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (setuid)";
  Start(Quick());
  // Let another user reach the socket, to test the listener's own check
  // (the 0700 directory normally keeps them out).
  ASSERT_EQ(chmod(dir_.c_str(), 0711), 0);
  ASSERT_EQ(chmod(path_.c_str(), 0666), 0);
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  if (child == 0) {
    if (setuid(65534) != 0) _exit(10);
    const std::string reply = Ask(R"({"op":"sleep"})");
    (void)!write(out[1], reply.data(), reply.size());  // a pipe: not WriteAll (send)
    _exit(0);
  }
  close(out[1]);
  std::string reply;
  char buf[256];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) reply.append(buf, n);
  close(out[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(Has(reply, "only uid 0 (the process's user) or root may ask; the client is uid "
                         "65534")) << reply;
  EXPECT_TRUE(Has(reply, R"("code":800)")) << reply;
}

}  // namespace
}  // namespace vmmshim
