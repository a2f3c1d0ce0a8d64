// IPC on shim memory (core/ipc/ipc.h), on the simulated driver: the handle codec,
// export and import over the real Unix-socket protocol (exporter and
// importer are two Ipc objects of this process, so the whole path runs,
// listener thread included), every bad-handle case, lifetimes, the socket
// directory's checks, another user's request, and a fault sweep over the
// export and import entry points.
#include "core/ipc/ipc.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "core/ipc/ipc_handle.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

IpcHandleFields SampleFields() {
  IpcHandleFields f;
  f.pid = 1234;
  f.instance = 0x0123456789abcdefULL;
  for (size_t i = 0; i < f.token.size(); ++i) f.token[i] = static_cast<uint8_t>(i + 1);
  f.offset = 4096;
  f.size = 1000;
  return f;
}

TEST(IpcHandleTest, RoundTripsAndZeroesPadding) {
  uint8_t bytes[kIpcHandleBytes];
  std::memset(bytes, 0xff, sizeof bytes);
  const IpcHandleFields f = SampleFields();
  EncodeIpcHandle(f, bytes);
  EXPECT_EQ(std::memcmp(bytes, "VMSH", 4), 0);
  for (int i : {6, 7, 12, 13, 14, 15, 56, 57, 58, 59, 60, 61, 62, 63}) EXPECT_EQ(bytes[i], 0) << i;
  IpcHandleFields back;
  ASSERT_EQ(DecodeIpcHandle(bytes, &back), IpcHandleKind::kShim);
  EXPECT_EQ(back.pid, f.pid);
  EXPECT_EQ(back.instance, f.instance);
  EXPECT_EQ(back.token, f.token);
  EXPECT_EQ(back.offset, f.offset);
  EXPECT_EQ(back.size, f.size);
}

TEST(IpcHandleTest, DriverHandlesAreForeign) {
  uint8_t bytes[kIpcHandleBytes] = {};
  IpcHandleFields f;
  EXPECT_EQ(DecodeIpcHandle(bytes, &f), IpcHandleKind::kForeign);
  bytes[0] = 'V';
  bytes[1] = 'M';
  EXPECT_EQ(DecodeIpcHandle(bytes, &f), IpcHandleKind::kForeign);
}

TEST(IpcHandleTest, EveryCorruptionIsMalformed) {
  uint8_t good[kIpcHandleBytes];
  EncodeIpcHandle(SampleFields(), good);
  IpcHandleFields f;
  // A non-zero byte where the format has zeros, or a wrong version.
  for (int i : {4, 5, 6, 7, 12, 13, 14, 15, 56, 60, 63}) {
    uint8_t bad[kIpcHandleBytes];
    std::memcpy(bad, good, sizeof bad);
    bad[i] ^= 0x40;
    EXPECT_EQ(DecodeIpcHandle(bad, &f), IpcHandleKind::kMalformed) << "byte " << i;
  }
  // Truncated: everything after the magic and version lost.
  uint8_t truncated[kIpcHandleBytes] = {};
  std::memcpy(truncated, good, 8);
  EXPECT_EQ(DecodeIpcHandle(truncated, &f), IpcHandleKind::kMalformed);
  // Fields that no export has: zero pid, instance, token or size; an offset
  // whose end overflows.
  auto with = [&](auto change) {
    IpcHandleFields x = SampleFields();
    change(x);
    uint8_t b[kIpcHandleBytes];
    EncodeIpcHandle(x, b);
    return DecodeIpcHandle(b, &f);
  };
  EXPECT_EQ(with([](IpcHandleFields& x) { x.pid = 0; }), IpcHandleKind::kMalformed);
  EXPECT_EQ(with([](IpcHandleFields& x) { x.instance = 0; }), IpcHandleKind::kMalformed);
  EXPECT_EQ(with([](IpcHandleFields& x) { x.token = {}; }), IpcHandleKind::kMalformed);
  EXPECT_EQ(with([](IpcHandleFields& x) { x.size = 0; }), IpcHandleKind::kMalformed);
  EXPECT_EQ(with([](IpcHandleFields& x) { x.offset = UINT64_MAX; }), IpcHandleKind::kMalformed);
}

class IpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim::SimOptions o;
    o.device_count = 2;
    o.memory_per_device = 1024 * kMiB;
    sim::Reset(o);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    CUcontext ctx;
    ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    api_ = sim::Api();
    char tmpl[] = "/tmp/vmmshim-ipc-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    // Removing the sockets leaves the (leaked) listeners unreachable.
    std::filesystem::remove_all(dir_);
  }

  // Exporter and importer: Ipc objects live as long as their listener
  // thread, so they are never destroyed (as in the shim); kept reachable.
  Ipc& NewIpc(ShimCore& shim, const std::string& dir = "") {
    static auto* kept = new std::vector<std::unique_ptr<Ipc>>;
    kept->push_back(std::make_unique<Ipc>(api_, shim.control(), dir.empty() ? dir_ : dir));
    return *kept->back();
  }

  CUdeviceptr MustAllocate(Allocator& a, size_t bytes) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }

  // An exporter, an importer and a 4 MiB allocation exported by the first.
  struct Shared {
    Ipc& exporter;
    Ipc& importer;
    CUdeviceptr ptr;
    uint8_t handle[kIpcHandleBytes];
  };
  Shared ExportOne(ShimCore& shim) {
    Shared s{NewIpc(shim), NewIpc(shim), MustAllocate(shim.allocator(), 4 * kMiB), {}};
    EXPECT_TRUE(s.exporter.Export(s.ptr, s.handle).ok());
    return s;
  }

  static IpcHandleFields Decode(const uint8_t* handle) {
    IpcHandleFields f;
    EXPECT_EQ(DecodeIpcHandle(handle, &f), IpcHandleKind::kShim);
    return f;
  }

  DriverApi api_;
  std::string dir_;
};

TEST_F(IpcTest, ImporterSeesAndWritesTheExportersMemory) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Ipc& exporter = NewIpc(shim);
  Ipc& importer = NewIpc(shim);
  const CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  const char message[] = "written by the exporter";
  ASSERT_EQ(sim::DeviceWrite(0, p + 100, message, sizeof message), CUDA_SUCCESS);
  uint8_t handle[kIpcHandleBytes];
  ASSERT_TRUE(exporter.Export(p, handle).ok());
  // Same allocation, same handle.
  uint8_t again[kIpcHandleBytes];
  ASSERT_TRUE(exporter.Export(p, again).ok());
  EXPECT_EQ(std::memcmp(handle, again, sizeof handle), 0);

  absl::StatusOr<CUdeviceptr> q = importer.Open(Decode(handle), 0);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_NE(*q, p);  // its own mapping of the same physical memory
  char got[sizeof message];
  ASSERT_EQ(sim::DeviceRead(0, got, *q + 100, sizeof got), CUDA_SUCCESS);
  EXPECT_STREQ(got, message);
  const char reply[] = "written by the importer";
  ASSERT_EQ(sim::DeviceWrite(0, *q, reply, sizeof reply), CUDA_SUCCESS);
  ASSERT_EQ(sim::DeviceRead(0, got, p, sizeof reply), CUDA_SUCCESS);
  EXPECT_STREQ(got, reply);

  // Opening again in the same context: the same pointer, one more reference.
  absl::StatusOr<CUdeviceptr> q2 = importer.Open(Decode(handle), CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  ASSERT_TRUE(q2.ok());
  EXPECT_EQ(*q2, *q);
  EXPECT_TRUE(importer.Close(*q).value());
  ASSERT_EQ(sim::DeviceRead(0, got, *q, 1), CUDA_SUCCESS);  // still mapped
  EXPECT_TRUE(importer.Close(*q).value());
  EXPECT_EQ(sim::DeviceRead(0, got, *q, 1), CUDA_ERROR_ILLEGAL_ADDRESS);  // gone
  EXPECT_FALSE(importer.Close(*q).value());  // not ours any more: the driver's
  ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(IpcTest, PackedAllocationsOpenAtTheirOffset) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Ipc& exporter = NewIpc(shim);
  Ipc& importer = NewIpc(shim);
  const CUdeviceptr first = MustAllocate(a, 1000);
  const CUdeviceptr second = MustAllocate(a, 3000);
  ASSERT_EQ(a.Find(second)->range_base, a.Find(first)->range_base);  // one granule
  const int v = 0x5eed;
  ASSERT_EQ(sim::DeviceWrite(0, second, &v, sizeof v), CUDA_SUCCESS);
  uint8_t handle[kIpcHandleBytes];
  ASSERT_TRUE(exporter.Export(second, handle).ok());
  const IpcHandleFields f = Decode(handle);
  EXPECT_EQ(f.offset, second - a.Find(second)->range_base);
  EXPECT_EQ(f.size, 3000u);
  absl::StatusOr<CUdeviceptr> q = importer.Open(f, 0);
  ASSERT_TRUE(q.ok()) << q.status();
  int got = 0;
  ASSERT_EQ(sim::DeviceRead(0, &got, *q, sizeof got), CUDA_SUCCESS);
  EXPECT_EQ(got, v);
  // The exported granule takes no new allocations (another process maps it).
  const CUdeviceptr third = MustAllocate(a, 1000);
  EXPECT_NE(a.Find(third)->range_base, a.Find(second)->range_base);
  EXPECT_TRUE(importer.Close(*q).value());
  for (CUdeviceptr x : {first, second, third}) ASSERT_TRUE(a.Free(x).ok());
}

TEST_F(IpcTest, BadHandlesGetInvalidValue) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Shared shared = ExportOne(shim);
  Ipc& exporter = shared.exporter;
  Ipc& importer = shared.importer;
  const CUdeviceptr p = shared.ptr;
  uint8_t* handle = shared.handle;
  const IpcHandleFields good = Decode(handle);
  sim::Usage before = sim::GetUsage();
  auto expect_invalid = [&](IpcHandleFields f, const char* what) {
    absl::StatusOr<CUdeviceptr> q = importer.Open(f, 0);
    EXPECT_EQ(ToCuResult(q.status()), CUDA_ERROR_INVALID_VALUE) << what;
    const sim::Usage now = sim::GetUsage();
    EXPECT_EQ(now.handles, before.handles) << what;  // nothing left behind
    EXPECT_EQ(now.mappings, before.mappings) << what;
    EXPECT_EQ(now.reservations, before.reservations) << what;
  };
  IpcHandleFields f = good;
  f.token[7] ^= 1;
  expect_invalid(f, "corrupted token");
  f = good;
  for (auto& b : f.token) b = static_cast<uint8_t>(rand());
  expect_invalid(f, "guessed token");
  f = good;
  f.offset += 256;
  expect_invalid(f, "corrupted offset");
  f = good;
  f.size += 1;
  expect_invalid(f, "corrupted size");
  f = good;
  f.instance ^= 0x10;
  expect_invalid(f, "exporter that does not exist");
  f = good;
  f.pid = 999999;
  expect_invalid(f, "another pid");
  // Flags other than lazy peer access, as the driver.
  EXPECT_EQ(ToCuResult(importer.Open(good, 0x8).status()), CUDA_ERROR_INVALID_VALUE);
  // The exporter opening its own handle: the driver's code for that.
  EXPECT_EQ(ToCuResult(exporter.Open(good, 0).status()), CUDA_ERROR_INVALID_CONTEXT);
  // Stale: the allocation was freed.
  ASSERT_TRUE(a.Free(p).ok());
  before = sim::GetUsage();
  expect_invalid(good, "stale handle");
  // Not shim memory, or not a live allocation.
  EXPECT_EQ(ToCuResult(exporter.Export(0x1000, handle)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(ToCuResult(exporter.Export(p, handle)), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(IpcTest, NoCurrentContextIsInvalidContext) {
  ShimCore shim(api_);
  Ipc& importer = NewIpc(shim);
  CUcontext none = nullptr;
  ASSERT_EQ(sim::cuCtxSetCurrent(none), CUDA_SUCCESS);
  EXPECT_EQ(ToCuResult(importer.Open(SampleFields(), 0).status()), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(IpcTest, MemoryLivesUntilTheLastMappingGoes) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Ipc& exporter = NewIpc(shim);
  Ipc& importer = NewIpc(shim);
  const CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  const int v = 77;
  ASSERT_EQ(sim::DeviceWrite(0, p, &v, sizeof v), CUDA_SUCCESS);
  uint8_t handle[kIpcHandleBytes];
  ASSERT_TRUE(exporter.Export(p, handle).ok());
  absl::StatusOr<CUdeviceptr> q = importer.Open(Decode(handle), 0);
  ASSERT_TRUE(q.ok());
  // The exporter frees: an exported block is released, never cached for
  // reuse by another allocation, but the importer's mapping keeps it alive.
  ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(shim.control().IdleBytes(0), 0u);
  int got = 0;
  ASSERT_EQ(sim::DeviceRead(0, &got, *q, sizeof got), CUDA_SUCCESS);
  EXPECT_EQ(got, v);
  EXPECT_TRUE(importer.Close(*q).value());
  EXPECT_EQ(sim::GetUsage().handles, 0u);
}

TEST_F(IpcTest, UnshareableMemoryIsNotExported) {
  AllocatorOptions o;
  o.exportable = false;
  ShimCore shim(api_, o);
  Allocator& a = shim.allocator();
  Ipc& exporter = NewIpc(shim);
  const CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  uint8_t handle[kIpcHandleBytes];
  EXPECT_EQ(ToCuResult(exporter.Export(p, handle)), CUDA_ERROR_INVALID_VALUE);
  ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(IpcTest, SocketDirectoryMustBePrivate) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  uint8_t handle[kIpcHandleBytes];
  // Open to others.
  const std::string open_dir = dir_ + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  Ipc& in_open = NewIpc(shim, open_dir);
  EXPECT_EQ(ToCuResult(in_open.Export(p, handle)), CUDA_ERROR_OPERATING_SYSTEM);
  // A symbolic link (which another user could have pointed anywhere).
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(dir_.c_str(), link.c_str()), 0);
  Ipc& via_link = NewIpc(shim, link);
  EXPECT_EQ(ToCuResult(via_link.Export(p, handle)), CUDA_ERROR_OPERATING_SYSTEM);
  // Missing: created 0700.
  const std::string fresh = dir_ + "/fresh";
  Ipc& in_fresh = NewIpc(shim, fresh);
  EXPECT_TRUE(in_fresh.Export(p, handle).ok());
  struct stat st;
  ASSERT_EQ(lstat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_TRUE(a.Free(p).ok());
}

// The socket path of the exporter that made `handle`.
std::string ExporterSocket(const std::string& dir, const IpcHandleFields& f) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f.instance));
  return dir + "/ipc-" + std::to_string(f.pid) + "-" + hex + ".sock";
}

int Connect(const std::string& path) {
  const int s = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(s);
    return -1;
  }
  return s;
}

TEST_F(IpcTest, IdleClientsDelayNoImport) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Shared s = ExportOne(shim);
  const std::string path = ExporterSocket(dir_, Decode(s.handle));
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(Connect(path));
  const auto t = std::chrono::steady_clock::now();
  absl::StatusOr<CUdeviceptr> q = s.importer.Open(Decode(s.handle), 0);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(), 0.5)
      << "an import waited behind idle clients";
  EXPECT_TRUE(s.importer.Close(*q).value());
  for (int fd : idle) close(fd);
  ASSERT_TRUE(a.Free(s.ptr).ok());
}

TEST_F(IpcTest, AListenerOfAnotherProcessAtTheExportersPathIsRefused) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Shared s = ExportOne(shim);
  const std::string path = ExporterSocket(dir_, Decode(s.handle));
  // An impostor of the same user (a forked child) takes the exporter's name.
  ASSERT_EQ(unlink(path.c_str()), 0);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    const int l = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    if (bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(l, 4) != 0) {
      _exit(1);
    }
    (void)!write(ready[1], "x", 1);
    for (;;) {  // accepts and says nothing, until killed
      const int c = accept(l, nullptr, nullptr);
      if (c >= 0) sleep(10);
    }
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  absl::StatusOr<CUdeviceptr> q = s.importer.Open(Decode(s.handle), 0);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_FALSE(q.ok());
  // (The log line names the impostor's pid: "... is served by pid P uid U,
  // not by the exporter".)
  EXPECT_EQ(ToCuResult(q.status()), CUDA_ERROR_INVALID_VALUE);
  ASSERT_TRUE(a.Free(s.ptr).ok());
}

TEST_F(IpcTest, AnotherUsersRequestIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (setuid)";
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Ipc& exporter = NewIpc(shim);
  const CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  uint8_t handle[kIpcHandleBytes];
  ASSERT_TRUE(exporter.Export(p, handle).ok());
  const IpcHandleFields f = Decode(handle);
  const std::string path = dir_ + "/ipc-" + std::to_string(f.pid) + "-" +
                           [&] {
                             char hex[17];
                             std::snprintf(hex, sizeof hex, "%016llx",
                                           static_cast<unsigned long long>(f.instance));
                             return std::string(hex);
                           }() +
                           ".sock";
  // Let another user reach the socket, to test the listener's own check
  // (normally the 0700 directory already keeps them out).
  ASSERT_EQ(chmod(dir_.c_str(), 0711), 0);
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  pid_t child = fork();
  if (child == 0) {
    if (setuid(65534) != 0) _exit(10);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) _exit(11);
    // The listener may answer and close before reading the request.
    send(s, handle, sizeof handle, MSG_NOSIGNAL);
    char reply[16] = {};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov = {reply, sizeof reply};
    msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (recvmsg(s, &msg, MSG_WAITALL) != 16) _exit(13);
    int32_t status;
    std::memcpy(&status, reply + 4, sizeof status);
    // Refused, and no descriptor came.
    _exit(status == CUDA_ERROR_INVALID_VALUE && CMSG_FIRSTHDR(&msg) == nullptr ? 0 : 14);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(IpcTest, ReleasedContextClosesItsImports) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Shared shared = ExportOne(shim);
  Ipc& importer = shared.importer;
  const CUdeviceptr p = shared.ptr;
  const uint8_t* handle = shared.handle;
  CUcontext ctx;
  ASSERT_EQ(sim::cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  absl::StatusOr<CUdeviceptr> q = importer.Open(Decode(handle), 0);
  ASSERT_TRUE(q.ok());
  const size_t mappings = sim::GetUsage().mappings;
  importer.ReleaseContext(ctx);
  EXPECT_EQ(sim::GetUsage().mappings, mappings - 1);
  EXPECT_FALSE(importer.Close(*q).value());
  ASSERT_TRUE(a.Free(p).ok());
}

// Fault sweep of the export and import paths: every call of every entry
// point they make fails once; the error comes back, nothing stays mapped,
// reserved or held, and the next open works.
TEST_F(IpcTest, FaultSweepOverExportAndImport) {
  const std::vector<std::string> entries = {
      "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle",
      "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemMap",
      "cuMemSetAccess", "cuCtxGetCurrent", "cuCtxGetDevice"};
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Shared shared = ExportOne(shim);
  Ipc& importer = shared.importer;
  const CUdeviceptr p = shared.ptr;
  const IpcHandleFields f = Decode(shared.handle);
  const sim::Usage before = sim::GetUsage();
  constexpr CUresult kInjected = static_cast<CUresult>(999);
  int runs = 0;
  for (const std::string& entry : entries) {
    SCOPED_TRACE(entry);
    sim::FailCall(entry, 1, kInjected);
    absl::StatusOr<CUdeviceptr> q = importer.Open(f, 0);
    sim::ClearFailures();
    ASSERT_FALSE(q.ok());
    // Context queries that fail read as "no context", as the driver says.
    const CUresult want = entry.rfind("cuCtx", 0) == 0 ? CUDA_ERROR_INVALID_CONTEXT : kInjected;
    EXPECT_EQ(ToCuResult(q.status()), want) << q.status();
    const sim::Usage now = sim::GetUsage();
    EXPECT_EQ(now.handles, before.handles);
    EXPECT_EQ(now.mappings, before.mappings);
    EXPECT_EQ(now.reservations, before.reservations);
    absl::StatusOr<CUdeviceptr> ok = importer.Open(f, 0);
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_TRUE(importer.Close(*ok).value());
    ++runs;
  }
  EXPECT_EQ(runs, static_cast<int>(entries.size()));
  ASSERT_TRUE(a.Free(p).ok());
}

}  // namespace
}  // namespace vmmshim
