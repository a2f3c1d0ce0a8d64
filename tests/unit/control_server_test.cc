// The control socket's requests (ControlServer::Answer,
// core/control/control_server.h) with handlers of the test's own: the
// sleep's state machine, a status while asleep that makes no driver call,
// and the refusals that come before anything is paused.
#include "core/control/control_server.h"
#include "core/driver/cu_status.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace vmmshim {
namespace {

constexpr char kResidency[] =
    R"({"devices":[{"device":0,"other_libraries_vmm":{"left_alone":)"
    R"({"exported_bytes":EXPORTED,"imported_bytes":0}}}]})";

struct Calls {
  int residency = 0, sleeps = 0, wakes = 0;
  size_t paused = 0;
  int sleep_code = 0;
  std::string exported = "0";
  std::string shared;  // the shared_memory handler's answer
};

ControlServer Server(Calls& calls) {
  ControlServer::Handlers h;
  h.residency_json = [&calls] {
    ++calls.residency;
    std::string r = kResidency;
    r.replace(r.find("EXPORTED"), 8, calls.exported);
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
  return ControlServer("/tmp/unused", std::move(h));
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
  calls.paused = 0;
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

}  // namespace
}  // namespace vmmshim
