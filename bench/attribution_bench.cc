// CPU cost of caller attribution (core/history/caller_library.h), in process:
// CallerLibraries::Resolve as the allocation hooks call it, per call, on the
// two paths an allocation takes, each less the same call without Resolve:
//   direct       the hook's return address names the caller (static cudart:
//                a plain nvcc program, libcublas, libnccl): a cache lookup;
//   through      the hook is called from a shared libcudart (PyTorch, CuPy,
//   libcudart    JAX; here a stand-in, libcudart.so.97): the caller's return
//                address is checked at the stack offset the first scan found.
// The rest of attribution on an allocation is one 16-bit store, so these are
// its cost per allocation. (The whole scan that the remembered offset avoids
// cost 370-710 ns per allocation on the H200: docs/memory-snapshots.md.)
// bench/observability_bench.sh measures whole allocations under the shim,
// where a GPU host's noise (hundreds of ns between rounds) hides figures of
// this size.
//
//   attribution_bench [--iterations N] [--rounds R]
//     -> table: path, ns per call (median of R rounds of N calls)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/history/caller_library.h"

extern "C" unsigned runtime_call(unsigned (*fn)(void));

namespace {

vmmshim::CallerLibraries* g_callers = nullptr;

// A hook without attribution, for the baseline.
__attribute__((noinline)) unsigned PlainHook() {
  __asm__ volatile("" ::: "memory");
  return 1;
}

// What a hook does: its own return address and frame.
__attribute__((noinline)) unsigned Hook() {
  unsigned id = g_callers->Resolve(__builtin_return_address(0), __builtin_frame_address(0));
  __asm__ volatile("" ::: "memory");
  return id;
}

// The same hook called through the stand-in runtime, from a frame of
// `depth` extra bytes, so that the caller's return address moves.
__attribute__((noinline)) unsigned ThroughRuntime(unsigned (*hook)(void)) {
  unsigned id = runtime_call(hook);
  __asm__ volatile("" ::: "memory");
  return id;
}

using Clock = std::chrono::steady_clock;

template <typename F>
double NsPerCall(int iterations, int rounds, F f) {
  std::vector<double> per_round;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) f(i);
    per_round.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                        iterations);
  }
  std::sort(per_round.begin(), per_round.end());
  return per_round[per_round.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000000, rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: attribution_bench [--iterations N] [--rounds R]\n");
      return 0;
    }
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[++i]);
  }
  vmmshim::CallerLibraries callers;
  g_callers = &callers;
  // Each path once, so that its names are known and the offset remembered.
  const unsigned direct_id = Hook();
  const unsigned through_id = ThroughRuntime(&Hook);
  if (callers.Name(direct_id) != "attribution_bench" ||
      callers.Name(through_id) != "attribution_bench") {
    std::fprintf(stderr, "attribution_bench: callers %s and %s, expected attribution_bench\n",
                 callers.Name(direct_id).c_str(), callers.Name(through_id).c_str());
    return 1;
  }
  volatile unsigned sink = 0;
  const double direct = NsPerCall(iterations, rounds, [&](int) { sink = sink + Hook(); });
  const double direct_base =
      NsPerCall(iterations, rounds, [&](int) { sink = sink + PlainHook(); });
  const double through =
      NsPerCall(iterations, rounds, [&](int) { sink = sink + ThroughRuntime(&Hook); });
  const double through_base =
      NsPerCall(iterations, rounds, [&](int) { sink = sink + ThroughRuntime(&PlainHook); });
  std::printf("caller attribution, ns per call (median of %d rounds of %d calls)\n", rounds,
              iterations);
  std::printf("  %-48s %8s %10s %8s\n", "path", "with", "without", "cost");
  std::printf("  %-48s %8.1f %10.1f %8.1f\n", "direct (static cudart): cache lookup", direct,
              direct_base, direct - direct_base);
  std::printf("  %-48s %8.1f %10.1f %8.1f\n",
              "through a shared libcudart: remembered offset", through, through_base,
              through - through_base);
  return 0;
}
