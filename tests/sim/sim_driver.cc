#include "tests/sim/sim_driver.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/driver/cu_status.h"

namespace vmmshim::sim {
namespace {

constexpr CUdeviceptr kLegacyBase = 0x100000000000ull;
// Host memory's CPU view (Mapping::cpu_view) is mapped at its VA: under
// ThreadSanitizer, whose shadow lies where kReserveBase is otherwise (an mmap
// there ends the process), reservations start in the application range it
// allows (below 0x008000000000).
#if defined(__SANITIZE_THREAD__) || defined(VMMSHIM_TSAN)
constexpr CUdeviceptr kReserveBase = 0x001000000000ull;
#else
constexpr CUdeviceptr kReserveBase = 0x200000000000ull;
#endif
constexpr size_t kLegacyAlign = 512;
constexpr CUdeviceptr kAsyncBase = 0x300000000000ull;  // stream-ordered allocations
constexpr CUdeviceptr kGraphBase = 0x380000000000ull;  // graph memory nodes (never backed)

// Simulated memory is anonymous, lazily committed host memory.
char* MapHostMemory(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

struct Context {
  int device;
  bool primary = true;
  // CU_LIMIT_STACK_SIZE (bytes per thread): the driver's default is 1 KiB;
  // the local memory it reserves for all resident threads scales with it
  // (measured on H200: 1 KiB reserves 264 MiB, 0 none; docs/deep-sleep-design.md).
  size_t stack_limit = kSimDefaultStackBytes;
};

struct PhysicalHandle {
  int device = 0;
  size_t size = 0;
  char* memory = nullptr;
  int mappings = 0;
  int references = 1;       // cuMemCreate/import + cuMemRetainAllocationHandle - cuMemRelease
  bool released() const { return references <= 0; }
  int fd = -1;              // memfd: exportable (POSIX-fd handle type) or imported
  bool imported = false;    // memory owned by another process's handle
  bool compressed = false;
  // Host memory (CU_MEM_LOCATION_TYPE_HOST_NUMA): a memfd, counted against
  // the host's memory, not `device`'s (device is -1).
  bool host = false;
};

struct Mapping {
  size_t size = 0;
  size_t offset = 0;
  CUmemGenericAllocationHandle handle = 0;
  std::vector<CUmemAccess_flags> access;  // per device
  // Host memory with CPU access granted (cuMemSetAccess, a host location):
  // the memfd mapped at the very address, so that the CPU reads and writes
  // it through the VA as on the GPU host; unmapped with the mapping.
  bool cpu_view = false;
};

struct LegacyAllocation {
  int device = 0;
  size_t size = 0;
  char* memory = nullptr;
};

struct Device {
  CUmemoryPool default_pool = nullptr;
  CUmemoryPool current_pool = nullptr;
  size_t used = 0;
  bool vmm = true;
  std::unique_ptr<Context> primary;
  int primary_refs = 0;  // cuDevicePrimaryCtxRetain minus Release
  uint64_t syncs = 0;
};

struct Failure {
  std::string entry;
  int remaining;
  CUresult code;
};

struct State {
  std::mutex mu;
  SimOptions options;
  bool initialized = false;
  std::vector<Device> devices;
  std::map<CUmemGenericAllocationHandle, PhysicalHandle> handles;
  CUmemGenericAllocationHandle next_handle = 1;
  std::vector<CUmemGenericAllocationHandle> free_handle_values;  // reuse_handle_values
  std::map<CUdeviceptr, Mapping> mappings;          // by start address
  std::map<CUdeviceptr, size_t> reservations;       // start -> size
  CUdeviceptr next_reserve = kReserveBase;
  std::map<CUdeviceptr, LegacyAllocation> legacy;   // by start address
  size_t host_used = 0;  // host-located handles' bytes (SimOptions::host_memory)
  CUdeviceptr next_legacy = kLegacyBase;
  std::map<std::string, uint64_t> calls;
  std::vector<Failure> failures;
  std::set<void*> host_allocations;  // cuMemHostAlloc
  // cuMemHostRegister: start -> (bytes, the context current at the call).
  std::map<void*, std::pair<size_t, CUcontext>> host_registrations;
  // cuCtxEnablePeerAccess state: (current context, peer context) pairs.
  std::set<std::pair<CUcontext, CUcontext>> peer_enabled;
  // Legacy IPC: pointers opened with cuIpcOpenMemHandle (never in practice:
  // legacy memory is process-private here, so opening fails; kept to give
  // cuIpcCloseMemHandle its driver codes).
  std::set<CUdeviceptr> ipc_opened;
  std::set<Context*> created_contexts;  // cuCtxCreate, not yet destroyed
  // Stream captures in progress (any non-null stream value is a stream).
  struct Capture {
    CUstreamCaptureMode mode;
    std::thread::id thread;
    bool invalidated = false;
  };
  std::map<CUstream, Capture> captures;
  // Streams, events and stream-ordered memory pools (docs/stream-ordered.md
  // has what they follow, measured on H200). Work completes at once unless
  // a test holds the stream (HoldStream); an event recorded on a held stream
  // completes when the stream is released or synchronized.
  struct Stream {
    CUcontext context = nullptr;  // current at cuStreamCreate
    bool held = false;
    std::vector<CUstream> waiters;  // streams held until this one's work is done
  };
  std::map<CUstream, Stream> streams;
  uintptr_t next_stream = 0x10000;
  struct Event {
    CUstream stream = nullptr;
    bool ready = true;
  };
  std::map<CUevent, Event> events;
  uintptr_t next_event = 0x20000;
  struct Pool {
    int device = 0;
    bool is_default = false;
    std::map<int, CUmemAccess_flags> access;  // peers given access (cuMemPoolSetAccess)
    cuuint64_t release_threshold = 0;
    int reuse[3] = {1, 1, 1};  // follow event dependencies, opportunistic, internal
    cuuint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
    struct FreeBlock {
      CUdeviceptr ptr;
      size_t size;
      CUstream stream;
      bool ready;  // the work queued on `stream` before the free is done
    };
    std::vector<FreeBlock> free;
  };
  std::map<CUmemoryPool, Pool> pools;
  uintptr_t next_pool = 0x30000;
  struct AsyncAllocation {
    CUmemoryPool pool;
    size_t size;
    char* memory;
  };
  std::map<CUdeviceptr, AsyncAllocation> async;  // live and pooled (freed) blocks
  CUdeviceptr next_async = kAsyncBase;
  std::set<CUdeviceptr> graph_allocations;
  CUdeviceptr next_graph = kGraphBase;
};

State& S() {
  static State* state = [] {
    auto* s = new State;
    s->options = OptionsFromEnv();
    // Like a driver that survives fork(): a child never inherits the lock
    // held by a parent thread that was inside a call.
    pthread_atfork([] { S().mu.lock(); }, [] { S().mu.unlock(); }, [] { S().mu.unlock(); });
    return s;
  }();
  return *state;
}

thread_local std::vector<CUcontext> tls_context_stack;

CUcontext Current() {
  return tls_context_stack.empty() ? nullptr : tls_context_stack.back();
}

// The value the driver gives a new handle: the most recently freed one
// where SimOptions::reuse_handle_values says so.
CUmemGenericAllocationHandle NewHandleValue(State& s) {
  if (s.free_handle_values.empty()) return s.next_handle++;
  const CUmemGenericAllocationHandle h = s.free_handle_values.back();
  s.free_handle_values.pop_back();
  return h;
}

void FreeHandleMemory(State& s, CUmemGenericAllocationHandle h) {
  auto it = s.handles.find(h);
  munmap(it->second.memory, it->second.size);
  if (it->second.fd >= 0) close(it->second.fd);
  if (it->second.host) {
    s.host_used -= it->second.size;
  } else if (!it->second.imported) {
    s.devices[it->second.device].used -= it->second.size;
  }
  if (s.options.reuse_handle_values) s.free_handle_values.push_back(h);
  s.handles.erase(it);
}

// Exportable physical memory: a memfd whose name records the device, so that
// an importing process (another simulation) knows where it lives.
char* MapSharedMemory(size_t bytes, int device, int* fd_out) {
  const std::string name = "simcuda-dev" + std::to_string(device);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  *fd_out = fd;
  return static_cast<char*>(p);
}

// The device recorded in a memfd's name, or -1.
int MemfdDevice(int fd) {
  char link[64], target[256];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return -1;
  target[n] = 0;
  const char* at = std::strstr(target, "simcuda-dev");
  return at == nullptr ? -1 : std::atoi(at + std::strlen("simcuda-dev"));
}

void ResetLocked(State& s, const SimOptions& options) {
  for (auto& [va, m] : s.mappings) {
    if (m.cpu_view) munmap(reinterpret_cast<void*>(va), m.size);
  }
  s.host_used = 0;
  for (auto& [h, ph] : s.handles) {
    munmap(ph.memory, ph.size);
    if (ph.fd >= 0) close(ph.fd);
  }
  for (auto& [p, la] : s.legacy) munmap(la.memory, la.size);
  for (void* p : s.host_allocations) std::free(p);
  s.host_allocations.clear();
  s.host_registrations.clear();
  s.handles.clear();
  s.mappings.clear();
  s.reservations.clear();
  s.legacy.clear();
  s.calls.clear();
  s.failures.clear();
  s.peer_enabled.clear();
  s.ipc_opened.clear();
  s.captures.clear();
  for (auto& [ptr, a] : s.async) munmap(a.memory, a.size);
  s.async.clear();
  s.pools.clear();
  s.streams.clear();
  s.events.clear();
  s.graph_allocations.clear();
  s.next_async = kAsyncBase;
  s.next_graph = kGraphBase;
  s.options = options;
  s.initialized = false;
  s.devices.clear();
  s.devices.resize(options.device_count);
  for (int d = 0; d < options.device_count; ++d) {
    s.devices[d].primary = std::make_unique<Context>(Context{d});
    s.devices[d].vmm = std::find(options.devices_without_vmm.begin(),
                                 options.devices_without_vmm.end(),
                                 d) == options.devices_without_vmm.end();
    const auto pool = reinterpret_cast<CUmemoryPool>(s.next_pool++);
    s.pools[pool].device = d;
    s.pools[pool].is_default = true;
    s.devices[d].default_pool = s.devices[d].current_pool = pool;
  }
  s.next_handle = 1;
  s.free_handle_values.clear();
  s.next_reserve = kReserveBase;
  s.next_legacy = kLegacyBase;
  tls_context_stack.clear();
}

// Counts the call and applies injected failures; returns CUDA_SUCCESS to go on.
CUresult Enter(State& s, const char* entry, bool needs_init = true) {
  ++s.calls[entry];
  for (auto it = s.failures.begin(); it != s.failures.end(); ++it) {
    if (it->entry == entry && --it->remaining == 0) {
      CUresult code = it->code;
      s.failures.erase(it);
      return code;
    }
  }
  if (s.devices.empty()) ResetLocked(s, s.options);
  if (needs_init && !s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

// HoldCalls: a call of the held entry parks here, before the driver's mutex,
// until ReleaseHeldCalls.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> armed{false};
  std::string entry;
  int passing = 0;  // calls of `entry` still let through before the holding starts
  int parked = 0;
  bool open = true;
};
Gate& TheGate() {
  static Gate* gate = new Gate;
  return *gate;
}
void PassGate(const char* entry) {
  WaitWhileCheckpointLocked();
  Gate& g = TheGate();
  if (!g.armed.load(std::memory_order_acquire)) return;
  std::unique_lock<std::mutex> lock(g.mu);
  if (g.open || g.entry != entry) return;
  if (g.passing > 0) {
    --g.passing;
    return;
  }
  ++g.parked;
  g.cv.notify_all();
  g.cv.wait(lock, [&] { return g.open; });
  --g.parked;
}

// Host functions the driver's threads run now (cuLaunchHostFunc); a
// synchronize waits for them, before it takes the driver's lock (they may
// call the driver themselves).
std::atomic<int> g_host_functions_running{0};
void WaitForHostFunctions() {
  while (g_host_functions_running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

#define SIM_ENTER(entry)                            \
  PassGate(entry);                                  \
  State& s = S();                                   \
  std::lock_guard<std::mutex> lock(s.mu);           \
  if (CUresult r = Enter(s, entry); r != CUDA_SUCCESS) return r

// The driver's rule for "potentially unsafe" calls during a capture
// (measured on H200, core/sync/capture.h): prohibited while a global-mode capture
// runs in any thread or a thread-local one in this thread; the call returns
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those captures.
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
CUresult CheckUnsafeCallLocked(State& s) {
  if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  bool prohibited = false;
  for (auto& [stream, c] : s.captures) {
    if (c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
        (c.mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && c.thread == std::this_thread::get_id())) {
      c.invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// SimOptions::vmm_calls_unsafe_during_capture.
CUresult CheckUnsafeVmmCallLocked(State& s) {
  return s.options.vmm_calls_unsafe_during_capture ? CheckUnsafeCallLocked(s) : CUDA_SUCCESS;
}

// Synchronizing work that includes a capturing stream is illegal in every
// mode: it fails and invalidates the capture.
CUresult CheckSyncLocked(State& s, CUstream only) {
  if (CUresult r = CheckUnsafeCallLocked(s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  for (auto& [stream, c] : s.captures) {
    if (only == nullptr || stream == only) {
      c.invalidated = true;
      capturing = true;
    }
  }
  return capturing ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

bool ValidDevice(const State& s, int d) {
  return d >= 0 && d < static_cast<int>(s.devices.size());
}

int CurrentDevice() {
  CUcontext c = Current();
  return c == nullptr ? -1 : reinterpret_cast<Context*>(c)->device;
}

// The allocation (legacy or mapping) containing `p`, as a host address and
// the bytes available from `p` to its end; checks `device`'s access.
// Returns nullptr on a fault.
char* Resolve(State& s, int device, CUdeviceptr p, bool write, size_t* avail) {
  auto lit = s.legacy.upper_bound(p);
  if (lit != s.legacy.begin()) {
    --lit;
    if (p < lit->first + lit->second.size) {
      // Ordinary allocations: the owner, or a device whose context enabled
      // peer access to the owner's primary context (cuCtxEnablePeerAccess).
      if (lit->second.device != device) {
        bool enabled = false;
        for (const auto& [from, to] : s.peer_enabled) {
          enabled |= reinterpret_cast<Context*>(from)->device == device &&
                     reinterpret_cast<Context*>(to)->device == lit->second.device;
        }
        if (!enabled) return nullptr;
      }
      *avail = lit->first + lit->second.size - p;
      return lit->second.memory + (p - lit->first);
    }
  }
  auto mit = s.mappings.upper_bound(p);
  if (mit == s.mappings.begin()) return nullptr;
  --mit;
  const Mapping& m = mit->second;
  if (p >= mit->first + m.size) return nullptr;
  if (!ValidDevice(s, device)) return nullptr;
  CUmemAccess_flags a = m.access[device];
  if (a == CU_MEM_ACCESS_FLAGS_PROT_NONE ||
      (write && a != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
    return nullptr;
  }
  *avail = mit->first + m.size - p;
  return s.handles[m.handle].memory + m.offset + (p - mit->first);
}

CUresult AccessLocked(State& s, int device, CUdeviceptr p, char* host, size_t n,
                      bool write) {
  while (n > 0) {
    size_t avail = 0;
    char* mem = Resolve(s, device, p, write, &avail);
    if (mem == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    size_t chunk = std::min(avail, n);
    if (write) {
      std::memcpy(mem, host, chunk);
    } else {
      std::memcpy(host, mem, chunk);
    }
    p += chunk;
    host += chunk;
    n -= chunk;
  }
  return CUDA_SUCCESS;
}

CUresult LegacyAllocate(State& s, CUdeviceptr* dptr, size_t bytes) {
  int d = CurrentDevice();
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  size_t rounded = (bytes + kLegacyAlign - 1) / kLegacyAlign * kLegacyAlign;
  if (s.devices[d].used + rounded > s.options.memory_per_device) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  char* mem = MapHostMemory(rounded);
  if (mem == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  CUdeviceptr p = s.next_legacy;
  s.next_legacy += rounded;
  s.legacy[p] = LegacyAllocation{d, rounded, mem};
  s.devices[d].used += rounded;
  *dptr = p;
  return CUDA_SUCCESS;
}

// Host memory made by cuMemCreate (CU_MEM_LOCATION_TYPE_HOST_NUMA): the
// H100's driver 580 supports it on NUMA node 0 of a device reporting
// CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
// (../shared/DESIGN.md section 8); another node is refused here.
bool HostVmmSupported(const State& s) { return s.options.host_numa_vmm && !s.devices.empty(); }

CUresult CheckProp(const State& s, const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
    if (!HostVmmSupported(s)) return CUDA_ERROR_NOT_SUPPORTED;
    if (prop->location.id != 0) return CUDA_ERROR_INVALID_VALUE;
    if (prop->allocFlags.compressionType != 0) return CUDA_ERROR_INVALID_VALUE;
    if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if (!s.devices[prop->location.id].vmm) return CUDA_ERROR_NOT_SUPPORTED;
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

bool Aligned(size_t v, size_t a) { return v % a == 0; }

CUresult SyncLocked(State& s, CUcontext ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  ++s.devices[reinterpret_cast<Context*>(ctx)->device].syncs;
  return CUDA_SUCCESS;
}


// Gives back the pool's free blocks whose freeing work is done until it
// reserves at most `keep` bytes.
void TrimPoolLocked(State& s, State::Pool& pool, cuuint64_t keep) {
  for (auto b = pool.free.begin(); b != pool.free.end() && pool.reserved > keep;) {
    if (!b->ready) {
      ++b;
      continue;
    }
    auto a = s.async.find(b->ptr);
    munmap(a->second.memory, a->second.size);
    s.devices[pool.device].used -= a->second.size;
    pool.reserved -= a->second.size;
    s.async.erase(a);
    b = pool.free.erase(b);
  }
}

// The work queued on `stream` is done: its events complete, blocks it freed
// become reusable anywhere, streams waiting on it go on. At a synchronize
// (`synchronized`) the pools also give back what they hold above their
// release threshold (measured: threshold 0, nothing kept after a
// synchronize; a block freed without one is reused at once).
void CompleteStreamLocked(State& s, CUstream stream, bool synchronized = false) {
  auto it = s.streams.find(stream);
  std::vector<CUstream> waiters;
  if (it != s.streams.end()) {
    it->second.held = false;
    waiters.swap(it->second.waiters);
  }
  for (auto& [e, ev] : s.events) {
    if (ev.stream == stream) ev.ready = true;
  }
  for (auto& [handle, pool] : s.pools) {
    for (auto& b : pool.free) {
      if (b.stream == stream) b.ready = true;
    }
    if (synchronized) TrimPoolLocked(s, pool, pool.release_threshold);
  }
  for (CUstream w : waiters) CompleteStreamLocked(s, w);
}

bool StreamHeldLocked(const State& s, CUstream stream) {
  auto it = s.streams.find(stream);
  return it != s.streams.end() && it->second.held;
}

// The stream-ordered allocation containing `ptr` that is live (not in a
// pool's free list), or end().
std::map<CUdeviceptr, State::AsyncAllocation>::iterator LiveAsyncLocked(State& s,
                                                                      CUdeviceptr ptr) {
  auto it = s.async.upper_bound(ptr);
  if (it == s.async.begin()) return s.async.end();
  --it;
  if (ptr >= it->first + it->second.size) return s.async.end();
  for (const auto& b : s.pools[it->second.pool].free) {
    if (b.ptr == it->first) return s.async.end();
  }
  return it;
}

CUresult AllocFromPoolLocked(State& s, CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                             CUstream stream) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto pit = s.pools.find(pool);
  if (pit == s.pools.end()) return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0) {
    *dptr = 0;  // measured: success, the pointer 0
    return CUDA_SUCCESS;
  }
  if (s.captures.count(stream) > 0) {
    // A graph memory node: an address valid when the graph runs.
    *dptr = s.next_graph;
    s.next_graph += (bytes + 511) / 512 * 512;
    s.graph_allocations.insert(*dptr);
    return CUDA_SUCCESS;
  }
  State::Pool& p = pit->second;
  const size_t rounded = (bytes + 511) / 512 * 512;
  // Reuse (measured): a block freed on this stream at once; one freed on
  // another stream once the work queued there before the free is done.
  for (auto b = p.free.begin(); b != p.free.end(); ++b) {
    if (b->size == rounded && (b->stream == stream || b->ready)) {
      *dptr = b->ptr;
      p.free.erase(b);
      p.used += rounded;
      p.used_high = std::max(p.used_high, p.used);
      return CUDA_SUCCESS;
    }
  }
  Device& d = s.devices[p.device];
  if (rounded > s.options.memory_per_device || d.used + rounded > s.options.memory_per_device) {
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  char* mem = MapHostMemory(rounded);
  if (mem == nullptr) {
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Each block at an address aligned as cuMemAlloc's (the lowest set bit of
  // the rounded size, at most 2 MiB).
  const size_t align = std::min<size_t>(rounded & (~rounded + 1), size_t{2} << 20);
  s.next_async = (s.next_async + align - 1) / align * align;
  *dptr = s.next_async;
  s.next_async += rounded;
  s.async[*dptr] = State::AsyncAllocation{pool, rounded, mem};
  d.used += rounded;
  p.used += rounded;
  p.reserved += rounded;
  p.used_high = std::max(p.used_high, p.used);
  p.reserved_high = std::max(p.reserved_high, p.reserved);
  return CUDA_SUCCESS;
}
}  // namespace

size_t LiveHostRegistrations() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.host_registrations.size();
}

size_t LiveHostAllocations() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.host_allocations.size();
}

SimOptions OptionsFromEnv(std::string* error) {
  SimOptions o;
  auto bad = [error](const char* name, const char* value, const char* expected) {
    if (error != nullptr && error->empty()) {
      *error = absl::StrCat(name, "='", value, "': expected ", expected);
    }
  };
  if (const char* v = std::getenv("SIMCUDA_COMPRESSION")) {
    o.generic_compression = std::string(v) == "1";
  }
  if (const char* v = std::getenv("SIMCUDA_DEVICES")) {
    int n;
    if (absl::SimpleAtoi(v, &n) && n > 0 && n <= kMaxSimDevices) {
      o.device_count = n;
    } else {
      bad("SIMCUDA_DEVICES", v, "a device count from 1 to 64");
    }
  }
  if (const char* v = std::getenv("SIMCUDA_MEMORY_MIB")) {
    size_t mib;
    if (absl::SimpleAtoi(v, &mib) && mib > 0 && mib <= (size_t{1} << 24)) {
      o.memory_per_device = mib << 20;
    } else {
      bad("SIMCUDA_MEMORY_MIB", v, "MiB per device, from 1 to 16777216");
    }
  }
  if (const char* v = std::getenv("SIMCUDA_NO_P2P")) {  // "0-3,1-2"
    for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> ab = absl::StrSplit(part, '-');
      int a, b;
      if (absl::SimpleAtoi(ab.first, &a) && absl::SimpleAtoi(ab.second, &b)) {
        o.pairs_without_p2p.push_back({a, b});
      }
    }
  }
  if (const char* v = std::getenv("SIMCUDA_NO_HOST_VMM")) {
    o.host_numa_vmm = std::string(v) != "1";
  }
  if (const char* v = std::getenv("SIMCUDA_HOST_MEMORY_MIB")) {
    size_t mib;
    if (absl::SimpleAtoi(v, &mib) && mib > 0 && mib <= (size_t{1} << 24)) {
      o.host_memory = mib << 20;
    } else {
      bad("SIMCUDA_HOST_MEMORY_MIB", v, "MiB of host memory for host VMM handles, from 1 to 16777216");
    }
  }
  if (const char* v = std::getenv("SIMCUDA_NO_VMM")) {
    for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      int d;
      if (absl::SimpleAtoi(part, &d)) o.devices_without_vmm.push_back(d);
    }
  }
  return o;
}

void Reset(const SimOptions& options) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  ResetLocked(s, options);
}

void HoldCalls(const std::string& entry, int nth) {
  Gate& g = TheGate();
  std::lock_guard<std::mutex> lock(g.mu);
  g.entry = entry;
  g.passing = nth > 1 ? nth - 1 : 0;
  g.open = false;
  g.armed.store(true, std::memory_order_release);
}

bool WaitForHeldCall(int timeout_ms) {
  Gate& g = TheGate();
  std::unique_lock<std::mutex> lock(g.mu);
  return g.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return g.parked > 0; });
}

void ReleaseHeldCalls() {
  Gate& g = TheGate();
  std::lock_guard<std::mutex> lock(g.mu);
  g.open = true;
  g.armed.store(false, std::memory_order_release);
  g.cv.notify_all();
}

void FailCall(const std::string& entry, int nth, CUresult code) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.failures.push_back(Failure{entry, nth, code});
}

void ClearFailures() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.failures.clear();
}

uint64_t CallCount(const std::string& entry) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.calls.find(entry);
  return it == s.calls.end() ? 0 : it->second;
}

void ResetCallCounts() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.calls.clear();
}

Usage GetUsage() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  Usage u;
  for (auto& [h, ph] : s.handles) {
    (ph.host ? u.host_handles : u.handles) += 1;
    (ph.host ? u.host_handle_bytes : u.handle_bytes) += ph.size;
  }
  u.mappings = s.mappings.size();
  u.reservations = s.reservations.size();
  for (auto& [p, n] : s.reservations) u.reserved_bytes += n;
  u.legacy_allocations = s.legacy.size();
  for (auto& [p, la] : s.legacy) u.legacy_bytes += la.size;
  return u;
}

void HoldStream(CUstream stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  s.streams[stream].held = true;
}

void ReleaseStream(CUstream stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  CompleteStreamLocked(s, stream);
}

size_t DeviceBytesInUse(int device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return ValidDevice(s, device) ? s.devices[device].used : 0;
}

size_t PeerMappedBytes(int peer) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t bytes = 0;
  for (const auto& [va, m] : s.mappings) {
    if (ValidDevice(s, peer) && !s.handles[m.handle].host && s.handles[m.handle].device != peer &&
        m.access[peer] != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      bytes += m.size;
    }
  }
  return bytes;
}

size_t MappingsOwnedBy(int device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  size_t n = 0;
  for (const auto& [va, m] : s.mappings) n += s.handles[m.handle].device == device;
  return n;
}

uint64_t SyncCount(int device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return ValidDevice(s, device) ? s.devices[device].syncs : 0;
}

CUresult DeviceWrite(int device, CUdeviceptr dst, const void* src, size_t bytes) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return AccessLocked(s, device, dst, static_cast<char*>(const_cast<void*>(src)),
                      bytes, /*write=*/true);
}

CUresult DeviceRead(int device, void* dst, CUdeviceptr src, size_t bytes) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return AccessLocked(s, device, src, static_cast<char*>(dst), bytes,
                      /*write=*/false);
}

// ---- Driver entry points ----

CUresult cuInit(unsigned int flags) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = Enter(s, "cuInit", /*needs_init=*/false); r != CUDA_SUCCESS) {
    return r;
  }
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = Enter(s, "cuDriverGetVersion", false); r != CUDA_SUCCESS) return r;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *str = KnownCuResultName(error);
  return *str == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char** str) {
  return vmmshim::sim::cuGetErrorName(error, str);
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  SIM_ENTER("cuDeviceGet");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  SIM_ENTER("cuDeviceGetCount");
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(s.devices.size());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  SIM_ENTER("cuDeviceGetAttribute");
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = s.devices[device].vmm ? 1 : 0;
      break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      *value = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED:
      *value = s.options.generic_compression ? 1 : 0;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = s.options.host_numa_vmm ? 1 : 0;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
      *value = 0;
      break;
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  SIM_ENTER("cuDeviceTotalMem_v2");
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = s.options.memory_per_device;
  return CUDA_SUCCESS;
}

namespace {
bool CanAccessPeer(const State& s, int device, int peer) {
  if (device == peer || !ValidDevice(s, device) || !ValidDevice(s, peer)) return false;
  for (const auto& [a, b] : s.options.pairs_without_p2p) {
    if ((a == device && b == peer) || (a == peer && b == device)) return false;
  }
  return true;
}
// The peer connections `device` would have with `joining` connected too:
// the distinct other devices of its enabled pairs, in either direction.
int PeerConnections(const State& s, int device, int joining) {
  std::set<int> peers = {joining};
  for (const auto& [from, to] : s.peer_enabled) {
    const int a = reinterpret_cast<const Context*>(from)->device;
    const int b = reinterpret_cast<const Context*>(to)->device;
    if (a == device) peers.insert(b);
    if (b == device) peers.insert(a);
  }
  peers.erase(device);
  return static_cast<int>(peers.size());
}
}  // namespace

CUresult cuDeviceCanAccessPeer(int* can, CUdevice device, CUdevice peer) {
  SIM_ENTER("cuDeviceCanAccessPeer");
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device) || !ValidDevice(s, peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = CanAccessPeer(s, device, peer) ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  SIM_ENTER("cuCtxEnablePeerAccess");
  CUcontext current = Current();
  if (current == nullptr || peer == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!CanAccessPeer(s, reinterpret_cast<Context*>(current)->device,
                     reinterpret_cast<Context*>(peer)->device)) {
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  }
  if (s.peer_enabled.count({current, peer}) > 0) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  const int from = reinterpret_cast<Context*>(current)->device;
  const int to = reinterpret_cast<Context*>(peer)->device;
  if (PeerConnections(s, from, to) > s.options.max_peer_connections ||
      PeerConnections(s, to, from) > s.options.max_peer_connections) {
    return CUDA_ERROR_TOO_MANY_PEERS;
  }
  s.peer_enabled.insert({current, peer});
  return CUDA_SUCCESS;
}

CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  SIM_ENTER("cuCtxDisablePeerAccess");
  CUcontext current = Current();
  if (current == nullptr || peer == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (s.peer_enabled.erase({current, peer}) == 0) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return CUDA_SUCCESS;
}

namespace {
// A context went away: its legacy allocations go with it, as the driver
// frees a destroyed context's cuMemAlloc memory. VMM handles do not belong
// to a context and stay.
// Registrations made in `ctx` go with it (the driver's page-locking is
// per context; a reset or destruction drops it).
void DropRegistrationsLocked(State& s, CUcontext ctx) {
  for (auto it = s.host_registrations.begin(); it != s.host_registrations.end();) {
    it = it->second.second == ctx ? s.host_registrations.erase(it) : std::next(it);
  }
}

void DropContextLocked(State& s, int device) {
  DropRegistrationsLocked(s, reinterpret_cast<CUcontext>(s.devices[device].primary.get()));
  s.devices[device].primary->stack_limit = kSimDefaultStackBytes;  // a new context's default
  for (auto it = s.legacy.begin(); it != s.legacy.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    munmap(it->second.memory, it->second.size);
    s.devices[device].used -= it->second.size;
    it = s.legacy.erase(it);
  }
  // The primary context's peer access goes with it (both directions), as
  // for a destroyed context.
  const auto primary = reinterpret_cast<CUcontext>(s.devices[device].primary.get());
  for (auto it = s.peer_enabled.begin(); it != s.peer_enabled.end();) {
    it = it->first == primary || it->second == primary ? s.peer_enabled.erase(it) : std::next(it);
  }
}
}  // namespace

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  SIM_ENTER("cuDevicePrimaryCtxRetain");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  ++s.devices[device].primary_refs;
  *ctx = reinterpret_cast<CUcontext>(s.devices[device].primary.get());
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  SIM_ENTER("cuDevicePrimaryCtxRelease_v2");
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  Device& d = s.devices[device];
  if (d.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--d.primary_refs == 0) DropContextLocked(s, device);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  SIM_ENTER("cuDevicePrimaryCtxReset_v2");
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  s.devices[device].primary_refs = 0;
  DropContextLocked(s, device);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  SIM_ENTER("cuDevicePrimaryCtxGetState");
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = s.devices[device].primary_refs > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

namespace {
Context* CurrentContextLocked() {
  return reinterpret_cast<Context*>(Current());
}
}  // namespace

CUresult cuCtxGetLimit(size_t* value, CUlimit limit) {
  SIM_ENTER("cuCtxGetLimit");
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* c = CurrentContextLocked();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (limit != CU_LIMIT_STACK_SIZE) return CUDA_ERROR_UNSUPPORTED_LIMIT;
  *value = c->stack_limit;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  SIM_ENTER("cuCtxSetLimit");
  Context* c = CurrentContextLocked();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (limit != CU_LIMIT_STACK_SIZE) return CUDA_ERROR_UNSUPPORTED_LIMIT;
  c->stack_limit = value;
  return CUDA_SUCCESS;
}

size_t PrimaryStackLimit(int device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!ValidDevice(s, device)) return 0;
  return s.devices[device].primary->stack_limit;
}

CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice device) {
  SIM_ENTER("cuCtxCreate_v2");
  if (ctx == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  auto* c = new Context{device, /*primary=*/false};
  s.created_contexts.insert(c);
  tls_context_stack.push_back(reinterpret_cast<CUcontext>(c));  // made current
  *ctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  SIM_ENTER("cuCtxDestroy_v2");
  auto* c = reinterpret_cast<Context*>(ctx);
  if (s.created_contexts.erase(c) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  for (auto it = tls_context_stack.begin(); it != tls_context_stack.end();) {
    it = *it == ctx ? tls_context_stack.erase(it) : it + 1;
  }
  // Its peer access goes with it (both directions).
  for (auto it = s.peer_enabled.begin(); it != s.peer_enabled.end();) {
    it = it->first == ctx || it->second == ctx ? s.peer_enabled.erase(it) : std::next(it);
  }
  DropRegistrationsLocked(s, ctx);
  delete c;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  SIM_ENTER("cuCtxGetCurrent");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = Current();
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  SIM_ENTER("cuCtxSetCurrent");
  if (ctx == nullptr) {
    if (!tls_context_stack.empty()) tls_context_stack.pop_back();
  } else if (tls_context_stack.empty()) {
    tls_context_stack.push_back(ctx);
  } else {
    tls_context_stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  SIM_ENTER("cuCtxGetDevice");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int d = CurrentDevice();
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *device = d;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  SIM_ENTER("cuCtxPushCurrent_v2");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  tls_context_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  SIM_ENTER("cuCtxPopCurrent_v2");
  if (tls_context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx != nullptr) *ctx = tls_context_stack.back();
  tls_context_stack.pop_back();
  return CUDA_SUCCESS;
}

void CompleteAllStreamsLocked(State& s) {
  std::vector<CUstream> all;
  for (const auto& [stream, st] : s.streams) all.push_back(stream);
  all.push_back(nullptr);
  for (CUstream st : all) CompleteStreamLocked(s, st, /*synchronized=*/true);
}

CUresult cuCtxSynchronize() {
  WaitForHostFunctions();  // the work before the synchronize: host functions too
  SIM_ENTER("cuCtxSynchronize");
  if (CUresult r = CheckSyncLocked(s, nullptr); r != CUDA_SUCCESS) return r;
  CompleteAllStreamsLocked(s);
  return SyncLocked(s, Current());
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  WaitForHostFunctions();  // the work before the synchronize: host functions too
  SIM_ENTER("cuCtxSynchronize_v2");
  if (CUresult r = CheckSyncLocked(s, nullptr); r != CUDA_SUCCESS) return r;
  CompleteAllStreamsLocked(s);
  return SyncLocked(s, ctx == nullptr ? Current() : ctx);
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  SIM_ENTER("cuMemAlloc_v2");
  if (CUresult r = CheckUnsafeCallLocked(s); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0) {
    *dptr = 0;
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = LegacyAllocate(s, dptr, bytes);
  if (r != CUDA_SUCCESS) *dptr = 0;
  return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                            size_t height, unsigned int element_size) {
  SIM_ENTER("cuMemAllocPitch_v2");
  if (CUresult r = CheckUnsafeCallLocked(s); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || pitch == nullptr || width == 0 || height == 0 ||
      (element_size != 4 && element_size != 8 && element_size != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t p = (width + 511) / 512 * 512;
  CUresult r = LegacyAllocate(s, dptr, p * height);
  if (r == CUDA_SUCCESS) *pitch = p;
  return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  SIM_ENTER("cuMemFree_v2");
  if (CUresult r = CheckUnsafeCallLocked(s); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;  // as the driver (H200, driver 580)
  if (auto ait = LiveAsyncLocked(s, dptr); ait != s.async.end() && ait->first == dptr) {
    // cudaFree of stream-ordered memory: 0, and the memory goes, but the
    // pool still counts it as used (measured on H200).
    munmap(ait->second.memory, ait->second.size);
    State::Pool& pool = s.pools[ait->second.pool];
    s.devices[pool.device].used -= ait->second.size;
    pool.reserved -= ait->second.size;
    s.async.erase(ait);
    return CUDA_SUCCESS;
  }
  auto it = s.legacy.find(dptr);
  if (it == s.legacy.end()) return CUDA_ERROR_INVALID_VALUE;
  ++s.devices[it->second.device].syncs;  // cuMemFree synchronizes
  munmap(it->second.memory, it->second.size);
  s.devices[it->second.device].used -= it->second.size;
  s.legacy.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  {
    State& s = S();
    std::lock_guard<std::mutex> lock(s.mu);
    if (CUresult r = Enter(s, "cuMemFreeAsync"); r != CUDA_SUCCESS) return r;
  }
  if (dptr == 0) return CUDA_SUCCESS;  // measured on H200
  {
    State& s = S();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.captures.count(stream) > 0) {
      // A graph frees only graph allocations (H200: 1, the capture goes on).
      return s.graph_allocations.erase(dptr) > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    auto it = LiveAsyncLocked(s, dptr);
    if (it != s.async.end()) {
      if (it->first != dptr) return CUDA_ERROR_INVALID_VALUE;
      State::Pool& pool = s.pools[it->second.pool];
      pool.used -= it->second.size;
      pool.free.push_back({dptr, it->second.size, stream, !StreamHeldLocked(s, stream)});
      return CUDA_SUCCESS;
    }
    if (s.async.count(dptr) > 0) return CUDA_ERROR_INVALID_VALUE;  // freed already
  }
  // cudaFreeAsync of cudaMalloc memory frees it (measured: 0, and a later
  // cudaFree gives 1).
  return vmmshim::sim::cuMemFree_v2(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return vmmshim::sim::cuMemFreeAsync(dptr, stream);
}

CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  SIM_ENTER("cuStreamIsCapturing");
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.captures.find(stream);
  *status = it == s.captures.end() ? CU_STREAM_CAPTURE_STATUS_NONE
            : it->second.invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                     : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  SIM_ENTER("cuStreamBeginCapture_v2");
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s.captures.count(stream) > 0) return CUDA_ERROR_ILLEGAL_STATE;
  s.captures[stream] = State::Capture{mode, std::this_thread::get_id()};
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return vmmshim::sim::cuStreamBeginCapture_v2(stream, mode);
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  SIM_ENTER("cuStreamEndCapture");
  auto it = s.captures.find(stream);
  if (it == s.captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
  if (it->second.mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      it->second.thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  const bool invalidated = it->second.invalidated;
  s.captures.erase(it);
  if (graph != nullptr) *graph = invalidated ? nullptr : reinterpret_cast<CUgraph>(0x6a);
  return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  SIM_ENTER("cuThreadExchangeStreamCaptureMode");
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return vmmshim::sim::cuStreamEndCapture(stream, graph);
}

CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus* status) {
  return vmmshim::sim::cuStreamIsCapturing(stream, status);
}

CUresult cuStreamSynchronize(CUstream stream) {
  WaitForHostFunctions();  // the work before the synchronize: host functions too
  SIM_ENTER("cuStreamSynchronize");
  if (CUresult r = CheckSyncLocked(s, stream); r != CUDA_SUCCESS) return r;
  CompleteStreamLocked(s, stream, /*synchronized=*/true);
  return SyncLocked(s, Current());
}

CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  return vmmshim::sim::cuStreamSynchronize(stream);
}

// ---- Streams, events, stream-ordered pools ----

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  SIM_ENTER("cuStreamCreate");
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  *stream = reinterpret_cast<CUstream>(s.next_stream++);
  s.streams[*stream].context = Current();
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream stream) {
  SIM_ENTER("cuStreamQuery");
  return StreamHeldLocked(s, stream) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  SIM_ENTER("cuStreamGetCtx");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // A created stream's context; any other handle (tests name streams by
  // arbitrary values) belongs to the current context.
  auto it = s.streams.find(stream);
  *ctx = it != s.streams.end() && it->second.context != nullptr ? it->second.context : Current();
  return *ctx == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  SIM_ENTER("cuStreamDestroy_v2");
  if (s.streams.count(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  CompleteStreamLocked(s, stream);  // its work still completes
  s.streams.erase(stream);
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  SIM_ENTER("cuEventCreate");
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  *event = reinterpret_cast<CUevent>(s.next_event++);
  s.events[*event];
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  SIM_ENTER("cuEventRecord");
  auto it = s.events.find(event);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  it->second = State::Event{stream, !StreamHeldLocked(s, stream)};
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent event) {
  SIM_ENTER("cuEventQuery");
  auto it = s.events.find(event);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  return it->second.ready ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent event) {
  SIM_ENTER("cuEventSynchronize");
  auto it = s.events.find(event);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (!it->second.ready) CompleteStreamLocked(s, it->second.stream, /*synchronized=*/true);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent event) {
  SIM_ENTER("cuEventDestroy_v2");
  return s.events.erase(event) > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  SIM_ENTER("cuStreamWaitEvent");
  auto it = s.events.find(event);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  (void)flags;
  if (!it->second.ready) {
    // Later work on `stream` waits until the event's stream is done.
    s.streams[stream].held = true;
    s.streams[it->second.stream].waiters.push_back(stream);
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  SIM_ENTER("cuDeviceGetDefaultMemPool");
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = s.devices[device].default_pool;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
  SIM_ENTER("cuDeviceGetMemPool");
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = s.devices[device].current_pool;
  return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) {
  SIM_ENTER("cuDeviceSetMemPool");
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  auto it = s.pools.find(pool);
  if (it == s.pools.end() || it->second.device != device) return CUDA_ERROR_INVALID_VALUE;
  s.devices[device].current_pool = pool;
  return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  SIM_ENTER("cuMemPoolCreate");
  if (pool == nullptr || props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidDevice(s, props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(s.next_pool++);
  s.pools[*pool].device = props->location.id;
  return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  SIM_ENTER("cuMemPoolDestroy");
  auto it = s.pools.find(pool);
  if (it == s.pools.end() || it->second.is_default) return CUDA_ERROR_INVALID_VALUE;
  Device& d = s.devices[it->second.device];
  if (d.current_pool == pool) d.current_pool = d.default_pool;
  for (auto a = s.async.begin(); a != s.async.end();) {
    if (a->second.pool != pool) {
      ++a;
      continue;
    }
    munmap(a->second.memory, a->second.size);
    d.used -= a->second.size;
    a = s.async.erase(a);
  }
  s.pools.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  SIM_ENTER("cuMemAllocAsync");
  // The current pool of the stream's device.
  int d = CurrentDevice();
  if (auto it = s.streams.find(stream); it != s.streams.end() && it->second.context != nullptr) {
    d = reinterpret_cast<Context*>(it->second.context)->device;
  }
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return AllocFromPoolLocked(s, dptr, bytes, s.devices[d].current_pool, stream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return vmmshim::sim::cuMemAllocAsync(dptr, bytes, stream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                 CUstream stream) {
  SIM_ENTER("cuMemAllocFromPoolAsync");
  return AllocFromPoolLocked(s, dptr, bytes, pool, stream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                      CUstream stream) {
  return vmmshim::sim::cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}

CUresult cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  if (location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
      type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return vmmshim::sim::cuDeviceSetMemPool(location->id, pool);
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  SIM_ENTER("cuMemPoolGetAttribute");
  auto it = s.pools.find(pool);
  if (it == s.pools.end() || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const State::Pool& p = it->second;
  auto* u64 = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *static_cast<int*>(value) = p.reuse[0]; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *static_cast<int*>(value) = p.reuse[1]; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *static_cast<int*>(value) = p.reuse[2]; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *u64 = p.release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *u64 = p.reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *u64 = p.reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *u64 = p.used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *u64 = p.used_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  SIM_ENTER("cuMemPoolSetAttribute");
  auto it = s.pools.find(pool);
  if (it == s.pools.end() || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State::Pool& p = it->second;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p.reuse[0] = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p.reuse[1] = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p.reuse[2] = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p.release_threshold = *static_cast<cuuint64_t*>(value); break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      // Only a reset to 0 is allowed; it sets the high mark to the current.
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) p.used_high = p.used; else p.reserved_high = p.reserved;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  SIM_ENTER("cuMemPoolTrimTo");
  auto it = s.pools.find(pool);
  if (it == s.pools.end()) return CUDA_ERROR_INVALID_VALUE;
  TrimPoolLocked(s, it->second, keep);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  SIM_ENTER("cuMemPoolSetAccess");
  auto it = s.pools.find(pool);
  if (it == s.pools.end()) return CUDA_ERROR_INVALID_VALUE;
  if (count == 0) return CUDA_SUCCESS;   // measured
  if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    const int d = map[i].location.id;
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!ValidDevice(s, d)) return CUDA_ERROR_INVALID_DEVICE;  // measured: 101
    if (d == it->second.device) {
      // The owner keeps read-write; taking it away is refused (measured: 101).
      if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_DEVICE;
      continue;
    }
    if (!CanAccessPeer(s, d, it->second.device)) return CUDA_ERROR_INVALID_DEVICE;
  }
  for (size_t i = 0; i < count; ++i) {
    if (map[i].location.id != it->second.device) {
      it->second.access[map[i].location.id] = map[i].flags;
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  SIM_ENTER("cuMemPoolGetAccess");
  auto it = s.pools.find(pool);
  if (it == s.pools.end() || flags == nullptr || location == nullptr ||
      location->type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDevice(s, location->id)) {
    return CUDA_ERROR_INVALID_VALUE;  // measured: 1 for a device that does not exist
  }
  if (location->id == it->second.device) {
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
  }
  auto a = it->second.access.find(location->id);
  *flags = a == it->second.access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : a->second;
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  SIM_ENTER("cuIpcGetMemHandle");
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Only cuMemAlloc memory, as the driver (VMM memory: INVALID_VALUE).
  if (s.legacy.find(dptr) == s.legacy.end()) return CUDA_ERROR_INVALID_VALUE;
  std::memset(handle->reserved, 0, sizeof handle->reserved);
  std::memcpy(handle->reserved, "simcuda-legacy", 14);
  std::memcpy(handle->reserved + 16, &dptr, sizeof dptr);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  SIM_ENTER("cuIpcOpenMemHandle_v2");
  (void)handle;
  if (dptr == nullptr || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  // Legacy allocations are process-private in the simulation.
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  SIM_ENTER("cuIpcCloseMemHandle");
  if (s.ipc_opened.erase(dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  SIM_ENTER("cuMemGetInfo_v2");
  int d = CurrentDevice();
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  // NULL out-pointers are accepted and skipped, as by the driver.
  if (total != nullptr) *total = s.options.memory_per_device;
  if (free != nullptr) *free = s.options.memory_per_device - s.devices[d].used;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  SIM_ENTER("cuMemGetAddressRange_v2");
  auto lit = s.legacy.upper_bound(dptr);
  if (lit != s.legacy.begin() && dptr < std::prev(lit)->first + std::prev(lit)->second.size) {
    --lit;
    if (base) *base = lit->first;
    if (size) *size = lit->second.size;
    return CUDA_SUCCESS;
  }
  auto mit = s.mappings.upper_bound(dptr);
  if (mit != s.mappings.begin() && dptr < std::prev(mit)->first + std::prev(mit)->second.size) {
    --mit;
    if (base) *base = mit->first;
    if (size) *size = mit->second.size;
    return CUDA_SUCCESS;
  }
  if (auto ait = LiveAsyncLocked(s, dptr); ait != s.async.end()) {
    // Measured: the allocation itself (its size rounded to 512 here).
    if (base) *base = ait->first;
    if (size) *size = ait->second.size;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}

namespace {
// Fills one pointer attribute; returns false when `ptr` is not device memory.
CUresult PointerAttributeLocked(State& s, void* data, CUpointer_attribute attribute,
                                CUdeviceptr ptr, bool* known) {
  int device = -1;
  CUdeviceptr base = 0;
  size_t size = 0;
  bool vmm = false;
  auto lit = s.legacy.upper_bound(ptr);
  auto mit = s.mappings.upper_bound(ptr);
  if (lit != s.legacy.begin() && ptr < std::prev(lit)->first + std::prev(lit)->second.size) {
    --lit;
    device = lit->second.device;
    base = lit->first;
    size = lit->second.size;
  } else if (mit != s.mappings.begin() &&
             ptr < std::prev(mit)->first + std::prev(mit)->second.size) {
    --mit;
    device = s.handles[mit->second.handle].device;
    base = mit->first;
    size = mit->second.size;
    vmm = true;
  } else if (auto ait = LiveAsyncLocked(s, ptr); ait != s.async.end()) {
    device = s.pools[ait->second.pool].device;
    base = ait->first;
    size = ait->second.size;
    vmm = true;  // no context, as for VMM memory
    if (attribute == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
      *static_cast<CUmemoryPool*>(data) = ait->second.pool;
      *known = true;
      return CUDA_SUCCESS;
    }
  }
  *known = device >= 0;
  if (!*known) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) =
          vmm ? nullptr : reinterpret_cast<CUcontext>(s.devices[device].primary.get());
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) = CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = device;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = base;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = size;
      break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<int*>(data) = vmm ? 0 : 1;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  SIM_ENTER("cuPointerGetAttribute");
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool known;
  return PointerAttributeLocked(s, data, attribute, ptr, &known);
}

CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes,
                                void** data, CUdeviceptr ptr) {
  SIM_ENTER("cuPointerGetAttributes");
  if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < count; ++i) {
    if (data[i] == nullptr) continue;
    bool known;
    CUresult r = PointerAttributeLocked(s, data[i], attributes[i], ptr, &known);
    if (!known) {
      // The driver answers unknown pointers with NULL values and success.
      std::memset(data[i], 0, attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE ||
                                      attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
                                      attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
                                      attributes[i] == CU_POINTER_ATTRIBUTE_CONTEXT
                                  ? 8
                                  : 4);
    } else if (r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  SIM_ENTER("cuMemGetAllocationGranularity");
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckProp(s, prop); r != CUDA_SUCCESS) return r;
  (void)option;
  *granularity = s.options.granularity;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) {
  SIM_ENTER("cuMemAddressReserve");
  (void)addr;  // a hint; the simulation never honours it
  if (ptr == nullptr || size == 0 || flags != 0 || !Aligned(size, s.options.granularity)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t align = std::max(alignment, s.options.granularity);
  CUdeviceptr p = (s.next_reserve + align - 1) / align * align;
  s.next_reserve = p + size;
  s.reservations[p] = size;
  *ptr = p;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  SIM_ENTER("cuMemAddressFree");
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto mit = s.mappings.lower_bound(ptr);
  if (mit != s.mappings.end() && mit->first < ptr + size) {
    return CUDA_ERROR_INVALID_VALUE;  // still mapped: the guide's order is violated
  }
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  SIM_ENTER("cuMemCreate");
  if (CUresult r = CheckUnsafeVmmCallLocked(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckProp(s, prop); r != CUDA_SUCCESS) return r;
  if (size == 0 || !Aligned(size, s.options.granularity)) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
    if (s.host_used + size > s.options.host_memory) return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = -1;
    char* mem = MapSharedMemory(size, -1, &fd);
    if (mem == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    s.host_used += size;
    PhysicalHandle ph{-1, size, mem, 0, 1};
    ph.fd = fd;
    ph.host = true;
    const CUmemGenericAllocationHandle h = NewHandleValue(s);
    s.handles[h] = ph;
    *handle = h;
    return CUDA_SUCCESS;
  }
  Device& d = s.devices[prop->location.id];
  if (d.used + size > s.options.memory_per_device) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = -1;
  char* mem = prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                  ? MapSharedMemory(size, prop->location.id, &fd)
                  : MapHostMemory(size);
  if (mem == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  d.used += size;
  CUmemGenericAllocationHandle h = NewHandleValue(s);
  PhysicalHandle ph{prop->location.id, size, mem, 0, 1};
  ph.fd = fd;
  // Granted only where the device supports it, as the driver may refuse.
  ph.compressed = prop->allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC &&
                  s.options.generic_compression;
  s.handles[h] = ph;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type,
                                      unsigned long long flags) {
  SIM_ENTER("cuMemExportToShareableHandle");
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released()) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || it->second.fd < 0 ||
      it->second.imported || it->second.host) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                        CUmemAllocationHandleType type) {
  SIM_ENTER("cuMemImportFromShareableHandle");
  if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  struct stat st;
  const int device = MemfdDevice(fd);
  if (fstat(fd, &st) != 0 || st.st_size <= 0 || device < 0 || !ValidDevice(s, device) ||
      !Aligned(static_cast<size_t>(st.st_size), s.options.granularity)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  PhysicalHandle ph{device, size, static_cast<char*>(p), 0, 1};
  ph.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the caller keeps and closes its own
  ph.imported = true;
  CUmemGenericAllocationHandle h = NewHandleValue(s);
  s.handles[h] = ph;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                CUmemGenericAllocationHandle handle) {
  SIM_ENTER("cuMemGetAllocationPropertiesFromHandle");
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released()) return CUDA_ERROR_INVALID_VALUE;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type =
      it->second.host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = it->second.host ? 0 : it->second.device;
  if (it->second.fd >= 0 && !it->second.host) prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (it->second.compressed) prop->allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIM_ENTER("cuMemRelease");
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released()) return CUDA_ERROR_INVALID_VALUE;
  --it->second.references;
  if (it->second.released() && it->second.mappings == 0) FreeHandleMemory(s, handle);
  return CUDA_SUCCESS;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  SIM_ENTER("cuMemRetainAllocationHandle");
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(addr);
  auto it = s.mappings.upper_bound(p);
  if (it == s.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (p >= it->first + it->second.size) return CUDA_ERROR_INVALID_VALUE;
  ++s.handles[it->second.handle].references;
  *handle = it->second.handle;
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  SIM_ENTER("cuMemMap");
  if (CUresult r = CheckUnsafeVmmCallLocked(s); r != CUDA_SUCCESS) return r;
  const size_t g = s.options.granularity;
  auto hit = s.handles.find(handle);
  if (hit == s.handles.end() || hit->second.released()) return CUDA_ERROR_INVALID_HANDLE;
  if (flags != 0 || size == 0 || !Aligned(ptr, g) || !Aligned(size, g) ||
      !Aligned(offset, g) || offset + size > hit->second.size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Host memory maps only whole (map_part and map_offset of
  // bench/host_vmm_costs on an H100, driver 580).
  if (hit->second.host && (offset != 0 || size != hit->second.size)) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  auto rit = s.reservations.upper_bound(ptr);
  if (rit == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --rit;
  if (ptr + size > rit->first + rit->second) return CUDA_ERROR_INVALID_VALUE;
  auto mit = s.mappings.lower_bound(ptr);
  if (mit != s.mappings.end() && mit->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (mit != s.mappings.begin() && std::prev(mit)->first + std::prev(mit)->second.size > ptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Mapping m;
  m.size = size;
  m.offset = offset;
  m.handle = handle;
  m.access.assign(s.devices.size(), CU_MEM_ACCESS_FLAGS_PROT_NONE);
  s.mappings[ptr] = m;
  ++hit->second.mappings;
  return CUDA_SUCCESS;
}

namespace {
// The mappings exactly covering [ptr, ptr + size), or empty when the range
// has a hole or cuts a mapping.
std::vector<std::map<CUdeviceptr, Mapping>::iterator> WholeMappings(State& s, CUdeviceptr ptr,
                                                                     size_t size) {
  std::vector<std::map<CUdeviceptr, Mapping>::iterator> out;
  CUdeviceptr at = ptr;
  auto it = s.mappings.find(ptr);
  while (it != s.mappings.end() && it->first == at && at < ptr + size) {
    out.push_back(it);
    at += it->second.size;
    ++it;
  }
  if (at != ptr + size) out.clear();
  return out;
}
}  // namespace

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  SIM_ENTER("cuMemUnmap");
  auto whole = WholeMappings(s, ptr, size);
  if (whole.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (auto it : whole) {
    CUmemGenericAllocationHandle h = it->second.handle;
    if (it->second.cpu_view) munmap(reinterpret_cast<void*>(it->first), it->second.size);
    s.mappings.erase(it);
    PhysicalHandle& ph = s.handles[h];
    if (--ph.mappings == 0 && ph.released()) FreeHandleMemory(s, h);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                        size_t count) {
  SIM_ENTER("cuMemSetAccess");
  if (CUresult r = CheckUnsafeVmmCallLocked(s); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  bool cpu = false;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
      // The CPU's access: host memory only, on its own node, read-write.
      if (desc[i].location.id != 0 || desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      cpu = true;
      continue;
    }
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!ValidDevice(s, desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
  }
  auto whole = WholeMappings(s, ptr, size);
  if (whole.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (auto it : whole) {
    const PhysicalHandle& ph = s.handles[it->second.handle];
    if (cpu && !ph.host) return CUDA_ERROR_INVALID_VALUE;  // device memory: no CPU access
    // A device reaches host memory only where the driver supports it.
    if (ph.host && !s.options.host_numa_vmm) return CUDA_ERROR_NOT_SUPPORTED;
  }
  for (auto it : whole) {
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        it->second.access[desc[i].location.id] = desc[i].flags;
      }
    }
    if (cpu && !it->second.cpu_view) {
      const PhysicalHandle& ph = s.handles[it->second.handle];
      void* at = mmap(reinterpret_cast<void*>(it->first), it->second.size,
                      PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, ph.fd,
                      static_cast<off_t>(it->second.offset));
      if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
      it->second.cpu_view = true;
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  SIM_ENTER("cuMemcpyHtoD_v2");
  if (CurrentDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return AccessLocked(s, CurrentDevice(), dst, static_cast<char*>(const_cast<void*>(src)),
                      bytes, true);
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t bytes) {
  {
    State& s = S();
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.calls["cuMemcpyHtoD_v2_ptds"];
  }
  return vmmshim::sim::cuMemcpyHtoD_v2(dst, src, bytes);
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  SIM_ENTER("cuMemcpyDtoH_v2");
  if (CurrentDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return AccessLocked(s, CurrentDevice(), src, static_cast<char*>(dst), bytes, false);
}

namespace {
// As the H200's driver 580: a copy whose host memory spans two
// registrations is refused (CUDA_ERROR_INVALID_VALUE).
bool SpansRegistrations(const State& s, const void* host, size_t bytes) {
  const char* begin = static_cast<const char*>(host);
  int overlapped = 0;
  for (const auto& [start, reg] : s.host_registrations) {
    const char* at = static_cast<const char*>(start);
    overlapped += begin < at + reg.first && at < begin + bytes;
  }
  return overlapped > 1;
}
}  // namespace

// The copies are done at the call (the simulation has no copy engine); the
// stream must be one cuStreamCreate made, or 0.
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  SIM_ENTER("cuMemcpyDtoHAsync_v2");
  if (CurrentDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (stream != nullptr && s.streams.count(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (SpansRegistrations(s, dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
  return AccessLocked(s, CurrentDevice(), src, static_cast<char*>(dst), bytes, false);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  SIM_ENTER("cuMemcpyHtoDAsync_v2");
  if (CurrentDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (stream != nullptr && s.streams.count(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (SpansRegistrations(s, src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  return AccessLocked(s, CurrentDevice(), dst, static_cast<char*>(const_cast<void*>(src)),
                      bytes, true);
}

namespace {
// Device memory to device memory (either may be host memory mapped by VMM),
// as a device access of the current context's device on both sides.
CUresult CopyDtoDLocked(State& s, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  const int device = CurrentDevice();
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  std::vector<char> staging(std::min<size_t>(bytes, size_t{8} << 20));
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(staging.size(), bytes - done);
    if (CUresult r = AccessLocked(s, device, src + done, staging.data(), n, false);
        r != CUDA_SUCCESS) {
      return r;
    }
    if (CUresult r = AccessLocked(s, device, dst + done, staging.data(), n, true);
        r != CUDA_SUCCESS) {
      return r;
    }
    done += n;
  }
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  SIM_ENTER("cuMemcpyDtoD_v2");
  return CopyDtoDLocked(s, dst, src, bytes);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  SIM_ENTER("cuMemcpyDtoDAsync_v2");
  if (stream != nullptr && s.streams.count(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return CopyDtoDLocked(s, dst, src, bytes);
}

// Page-locked host memory: ordinary host memory here (the simulation's
// copies are memcpy); counted and fault-injectable like every entry.
CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  SIM_ENTER("cuMemHostAlloc");
  if (pp == nullptr || bytes == 0 || (flags & ~0xfu) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CurrentDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *pp = std::malloc(bytes);
  if (*pp == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  s.host_allocations.insert(*pp);
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void* p) {
  SIM_ENTER("cuMemFreeHost");
  if (s.host_allocations.erase(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  std::free(p);
  return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned int flags) {
  SIM_ENTER("cuMemHostRegister_v2");
  if (CUresult r = CheckUnsafeVmmCallLocked(s); r != CUDA_SUCCESS) return r;
  if (p == nullptr || bytes == 0 || (flags & ~0xfu) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CurrentDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  const char* begin = static_cast<char*>(p);
  for (const auto& [start, reg] : s.host_registrations) {
    const char* at = static_cast<char*>(start);
    if (begin < at + reg.first && at < begin + bytes) {
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  }
  s.host_registrations[p] = {bytes, Current()};
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void* p) {
  SIM_ENTER("cuMemHostUnregister");
  if (s.host_registrations.erase(p) == 0) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetFlags(unsigned int* flags, void* p) {
  SIM_ENTER("cuMemHostGetFlags");
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // As the H200's driver 580: nothing is answered without a current context.
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (s.host_allocations.count(p) == 0 && s.host_registrations.count(p) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *flags = CU_MEMHOSTALLOC_PORTABLE;
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  SIM_ENTER("cuMemsetD8_v2");
  int d = CurrentDevice();
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  std::vector<char> fill(count, static_cast<char>(value));
  return AccessLocked(s, d, dst, fill.data(), count, true);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  SIM_ENTER("cuMemsetD8Async");
  int d = CurrentDevice();
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (stream != nullptr && s.streams.count(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<char> fill(count, static_cast<char>(value));
  return AccessLocked(s, d, dst, fill.data(), count, true);
}

CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, CUstream stream, void** params,
                        void**) {
  SIM_ENTER("cuLaunchKernel");
  int d = CurrentDevice();
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (stream != nullptr && s.streams.count(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (params == nullptr || params[0] == nullptr || params[1] == nullptr || params[2] == nullptr) {
    return CUDA_SUCCESS;
  }
  const CUdeviceptr dst = *static_cast<CUdeviceptr*>(params[0]);
  const size_t bytes = *static_cast<size_t*>(params[1]);
  std::vector<char> fill(bytes, *static_cast<char*>(params[2]));
  return AccessLocked(s, d, dst, fill.data(), bytes, true);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz,
                             unsigned int shared, CUstream stream, void** params, void** extra) {
  return vmmshim::sim::cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* data) {
  {
    SIM_ENTER("cuLaunchHostFunc");
    if (CurrentDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (stream != nullptr && s.streams.count(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    g_host_functions_running.fetch_add(1);
  }
  std::thread([fn, data] {
    fn(data);
    g_host_functions_running.fetch_sub(1);
  }).detach();
  return CUDA_SUCCESS;
}


// ---- Resolver ----

namespace {
struct ProcEntry {
  const char* base;
  int min_version;  // CUDA version that introduced `versioned`
  const char* versioned;
  const char* per_thread;  // with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
};

// Newest first per base name: the resolver answers with the newest ABI not
// newer than the caller's cudaVersion, as the real driver does.
constexpr ProcEntry kProcTable[] = {
    {"cuInit", 2000, "cuInit", nullptr},
    {"cuDriverGetVersion", 2020, "cuDriverGetVersion", nullptr},
    {"cuGetErrorName", 6000, "cuGetErrorName", nullptr},
    {"cuGetErrorString", 6000, "cuGetErrorString", nullptr},
    {"cuDeviceGet", 2000, "cuDeviceGet", nullptr},
    {"cuDeviceGetCount", 2000, "cuDeviceGetCount", nullptr},
    {"cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute", nullptr},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", nullptr},
    {"cuDeviceCanAccessPeer", 4000, "cuDeviceCanAccessPeer", nullptr},
    {"cuCtxEnablePeerAccess", 4000, "cuCtxEnablePeerAccess", nullptr},
    {"cuCtxDisablePeerAccess", 4000, "cuCtxDisablePeerAccess", nullptr},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain", nullptr},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2", nullptr},
    {"cuCtxGetCurrent", 4000, "cuCtxGetCurrent", nullptr},
    {"cuCtxSetCurrent", 4000, "cuCtxSetCurrent", nullptr},
    {"cuCtxGetDevice", 2000, "cuCtxGetDevice", nullptr},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2", nullptr},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2", nullptr},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2", nullptr},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize", nullptr},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", nullptr},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", nullptr},
    {"cuMemFree", 3020, "cuMemFree_v2", nullptr},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2", nullptr},
    {"cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2", nullptr},
    {"cuPointerGetAttribute", 4000, "cuPointerGetAttribute", nullptr},
    {"cuPointerGetAttributes", 7000, "cuPointerGetAttributes", nullptr},
    {"cuMemGetAllocationGranularity", 10020, "cuMemGetAllocationGranularity", nullptr},
    {"cuMemAddressReserve", 10020, "cuMemAddressReserve", nullptr},
    {"cuMemAddressFree", 10020, "cuMemAddressFree", nullptr},
    {"cuMemCreate", 10020, "cuMemCreate", nullptr},
    {"cuMemRelease", 10020, "cuMemRelease", nullptr},
    {"cuMemRetainAllocationHandle", 11000, "cuMemRetainAllocationHandle", nullptr},
    {"cuMemMap", 10020, "cuMemMap", nullptr},
    {"cuMemUnmap", 10020, "cuMemUnmap", nullptr},
    {"cuMemSetAccess", 10020, "cuMemSetAccess", nullptr},
    {"cuMemExportToShareableHandle", 10020, "cuMemExportToShareableHandle", nullptr},
    {"cuMemImportFromShareableHandle", 10020, "cuMemImportFromShareableHandle", nullptr},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, "cuMemGetAllocationPropertiesFromHandle",
     nullptr},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2", nullptr},
    {"cuDevicePrimaryCtxGetState", 7000, "cuDevicePrimaryCtxGetState", nullptr},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2", nullptr},
    {"cuCtxGetLimit", 3010, "cuCtxGetLimit", nullptr},
    {"cuCtxSetLimit", 3010, "cuCtxSetLimit", nullptr},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
    {"cuStreamIsCapturing", 10000, "cuStreamIsCapturing", "cuStreamIsCapturing_ptsz"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz"},
    {"cuStreamEndCapture", 10000, "cuStreamEndCapture", "cuStreamEndCapture_ptsz"},
    {"cuThreadExchangeStreamCaptureMode", 10010, "cuThreadExchangeStreamCaptureMode", nullptr},
    {"cuStreamCreate", 2000, "cuStreamCreate", nullptr},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2", nullptr},
    {"cuEventCreate", 2000, "cuEventCreate", nullptr},
    {"cuEventRecord", 2000, "cuEventRecord", nullptr},
    {"cuEventQuery", 2000, "cuEventQuery", nullptr},
    {"cuEventSynchronize", 2000, "cuEventSynchronize", nullptr},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2", nullptr},
    {"cuStreamWaitEvent", 3020, "cuStreamWaitEvent", nullptr},
    {"cuDeviceGetDefaultMemPool", 11020, "cuDeviceGetDefaultMemPool", nullptr},
    {"cuDeviceGetMemPool", 11020, "cuDeviceGetMemPool", nullptr},
    {"cuDeviceSetMemPool", 11020, "cuDeviceSetMemPool", nullptr},
    {"cuMemPoolCreate", 11020, "cuMemPoolCreate", nullptr},
    {"cuMemPoolDestroy", 11020, "cuMemPoolDestroy", nullptr},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemSetMemPool", 13000, "cuMemSetMemPool", nullptr},
    {"cuStreamQuery", 2000, "cuStreamQuery", nullptr},
    {"cuStreamGetCtx", 9020, "cuStreamGetCtx", nullptr},
    {"cuMemPoolGetAttribute", 11020, "cuMemPoolGetAttribute", nullptr},
    {"cuMemPoolSetAttribute", 11020, "cuMemPoolSetAttribute", nullptr},
    {"cuMemPoolTrimTo", 11020, "cuMemPoolTrimTo", nullptr},
    {"cuMemPoolSetAccess", 11020, "cuMemPoolSetAccess", nullptr},
    {"cuMemPoolGetAccess", 11020, "cuMemPoolGetAccess", nullptr},
    {"cuStreamSynchronize", 2000, "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
    {"cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle", nullptr},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2", nullptr},
    {"cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle", nullptr},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"},
    {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2", nullptr},
    {"cuMemcpyDtoHAsync", 3020, "cuMemcpyDtoHAsync_v2", nullptr},
    {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2", nullptr},
    {"cuMemsetD8", 3020, "cuMemsetD8_v2", nullptr},
    {"cuMemsetD8Async", 3020, "cuMemsetD8Async", nullptr},
    {"cuLaunchKernel", 4000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
    {"cuLaunchHostFunc", 10000, "cuLaunchHostFunc", nullptr},
    {"cuMemHostAlloc", 2020, "cuMemHostAlloc", nullptr},
    {"cuMemHostRegister", 6050, "cuMemHostRegister_v2", nullptr},
    {"cuMemHostUnregister", 4000, "cuMemHostUnregister", nullptr},
    {"cuMemHostGetFlags", 2030, "cuMemHostGetFlags", nullptr},
    {"cuMemFreeHost", 2000, "cuMemFreeHost", nullptr},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", nullptr},
    {"cuGetProcAddress", 11030, "cuGetProcAddress", nullptr},
};
}  // namespace

CUresult GetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult* status, ExportLookup lookup) {
  {
    State& s = S();
    std::lock_guard<std::mutex> lock(s.mu);
    if (CUresult r = Enter(s, "cuGetProcAddress", false); r != CUDA_SUCCESS) return r;
  }
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  bool known = false;
  for (const ProcEntry& e : kProcTable) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    known = true;
    if (cuda_version < e.min_version) continue;
    const char* name = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && e.per_thread
                           ? e.per_thread
                           : e.versioned;
    *pfn = lookup(name);
    break;
  }
  if (status != nullptr) {
    *status = *pfn != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
              : known         ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                              : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  if (*pfn != nullptr) return CUDA_SUCCESS;
  // Seen on H200 (driver 580): cuGetProcAddress_v2 answers an unknown symbol
  // with CUDA_SUCCESS, *pfn = NULL and the status saying why. The
  // 4-argument resolver has no status to say it with.
  return status != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

namespace {
void* NamespaceLookup(const char* name) {
#define VMMSHIM_SIM_MATCH(fn, params, args) \
  if (std::strcmp(name, #fn) == 0) return reinterpret_cast<void*>(&fn);
  VMMSHIM_SIM_ENTRY_POINTS(VMMSHIM_SIM_MATCH)
#undef VMMSHIM_SIM_MATCH
  return nullptr;
}

CUresult ApiGetProcAddressV2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  if (symbol != nullptr && std::strcmp(symbol, "cuGetProcAddress") == 0 && pfn != nullptr) {
    *pfn = reinterpret_cast<void*>(&ApiGetProcAddressV2);
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  return GetProcAddress(symbol, pfn, version, flags, status, &NamespaceLookup);
}
}  // namespace

DriverApi Api() {
  DriverApi api = LoadDriverApi(nullptr, [](void*, const char* name) -> void* {
    return NamespaceLookup(name);
  });
  api.cuGetProcAddress_v2 = &ApiGetProcAddressV2;
  return api;
}

}  // namespace vmmshim::sim
