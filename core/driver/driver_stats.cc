#include "core/driver/driver_stats.h"

#include <atomic>
#include <chrono>

namespace vmmshim {
namespace {

enum Entry : int {
#define VMMSHIM_ENTRY_INDEX(member, symbol, type, required) k_##member,
  VMMSHIM_DRIVER_ENTRY_POINTS(VMMSHIM_ENTRY_INDEX)
#undef VMMSHIM_ENTRY_INDEX
  kEntryCount
};

struct Counter {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> nanoseconds{0};
};

Counter g_counters[kEntryCount];
void* g_targets[kEntryCount];  // the entries the thunks forward to
const char* const kNames[kEntryCount] = {
#define VMMSHIM_ENTRY_NAME(member, symbol, type, required) symbol,
    VMMSHIM_DRIVER_ENTRY_POINTS(VMMSHIM_ENTRY_NAME)
#undef VMMSHIM_ENTRY_NAME
};

template <int I, typename F>
struct Thunk;

template <int I, typename R, typename... A>
struct Thunk<I, R(CUDAAPI*)(A...)> {
  static R CUDAAPI Call(A... args) {
    const auto start = std::chrono::steady_clock::now();
    R r = reinterpret_cast<R(CUDAAPI*)(A...)>(g_targets[I])(args...);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    g_counters[I].calls.fetch_add(1, std::memory_order_relaxed);
    g_counters[I].nanoseconds.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
    return r;
  }
};

}  // namespace

DriverApi InstrumentDriverApi(const DriverApi& real) {
  DriverApi api = real;
#define VMMSHIM_INSTRUMENT(member, symbol, type, required)      \
  g_targets[k_##member] = reinterpret_cast<void*>(real.member); \
  if (real.member != nullptr) api.member = &Thunk<k_##member, type>::Call;
  VMMSHIM_DRIVER_ENTRY_POINTS(VMMSHIM_INSTRUMENT)
#undef VMMSHIM_INSTRUMENT
  return api;
}

std::vector<DriverCallCount> DriverCallCounts() {
  std::vector<DriverCallCount> out;
  for (int i = 0; i < kEntryCount; ++i) {
    const uint64_t calls = g_counters[i].calls.load(std::memory_order_relaxed);
    if (calls == 0) continue;
    out.push_back({kNames[i], calls,
                   g_counters[i].nanoseconds.load(std::memory_order_relaxed) * 1e-9});
  }
  return out;
}

}  // namespace vmmshim
