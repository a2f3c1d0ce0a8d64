// Whether the staging ring (pageable host memory reached through two
// page-locked 64 MiB slots that CPU threads fill or empty) adds to the copy
// engine's direct copies into page-locked memory when both run at once, so
// that a pause could keep part of its contents in memory that is never
// pinned. Why: a deep sleep must give back every pinned page before the
// driver's checkpoint (about 21 ms per GiB on the H200, serial with the
// copies: bench/registration_behind_copies), and its wake pins them again
// (about 27 ms per GiB); what goes through the ring needs neither. The ring
// alone moved a pause's 18 GiB at 17-18 GiB/s, the copy engine 51 GiB/s
// (docs/deep-sleep.md): the question is what the two reach together.
//
// Natively: a device buffer of SIZE bytes (default 16 GiB), SIZE bytes of
// MADV_HUGEPAGE host memory written first and registered in 1 GiB ranges
// (the pinned pool's way), SIZE bytes of the same memory never registered,
// two registered 64 MiB slots, and a resident set of 1,000 device
// allocations. The ring works as the shim's (core/heap/host_backup.cc):
// a synchronous copy into one slot while the process's CPUs (at most 16)
// copy the other slot's bytes out. Ways, by the share of the bytes that go
// through the ring (the rest by the copy engine, 1 GiB asynchronous copies on
// a stream of their own, queued from another thread):
//   engine (0%), ring (100%), ring25, ring33, ring50
// Each way copies the whole buffer to the host ("out") and back ("in"),
// alternated, ROUNDS rounds after a warm-up round; the contents are checked
// after "in". Rows: way,step,round,seconds,gib_per_s
// usage: ring_beside_copy_engine [SIZE_GIB] [ROUNDS]
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "host_copy_setup.h"

namespace {

using host_copy_setup::Check;
using host_copy_setup::Clock;
using host_copy_setup::Since;

constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kSlot = size_t{64} << 20;

// memcpy of [src, src + n) to dst by `threads` threads, joined on return.
void ParallelCopy(char* dst, const char* src, size_t n, int threads) {
  std::vector<std::thread> pool;
  const size_t part = (n / threads + 4095) / 4096 * 4096;
  for (int t = 0; t < threads; ++t) {
    const size_t from = std::min(n, part * t), to = std::min(n, from + part);
    if (from < to) pool.emplace_back([=] { std::memcpy(dst + from, src + from, to - from); });
  }
  for (std::thread& th : pool) th.join();
}

char* HostMemory(size_t bytes, int threads) {
  char* host = host_copy_setup::Map(bytes, /*huge=*/true);
  host_copy_setup::Touch(host, bytes, threads);
  return host;
}

void Row(const char* way, const char* step, int round, double seconds, size_t bytes) {
  if (round < 0) return;  // warm-up
  std::printf("%s,%s,%d,%.4f,%.2f\n", way, step, round, seconds, bytes / double(kGiB) / seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16) * kGiB;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const int threads = host_copy_setup::CopyThreads();
  const CUcontext ctx = host_copy_setup::PrimaryContextWithResidentSet();
  CUdeviceptr buffer;
  Check(cuMemAlloc(&buffer, bytes), "cuMemAlloc (buffer)");
  CUstream stream;
  Check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");

  char* pinned = HostMemory(bytes, threads);
  for (size_t off = 0; off < bytes; off += kGiB) {
    Check(cuMemHostRegister(pinned + off, std::min(kGiB, bytes - off), CU_MEMHOSTREGISTER_PORTABLE),
          "cuMemHostRegister (pinned)");
  }
  char* pageable = HostMemory(bytes, threads);
  char* slots = HostMemory(2 * kSlot, 1);
  Check(cuMemHostRegister(slots, 2 * kSlot, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister (slots)");
  std::fprintf(stderr, "ring_beside_copy_engine: %zu GiB, %d copy threads\n", bytes / kGiB, threads);

  // Device [from, to) through the copy engine ([pinned + from, ...)) on the
  // stream, from the calling thread; the caller synchronizes.
  auto engine = [&](size_t from, size_t to, bool out) {
    for (size_t off = from; off < to; off += kGiB) {
      const size_t n = std::min(kGiB, to - off);
      Check(out ? cuMemcpyDtoHAsync(pinned + off, buffer + off, n, stream)
                : cuMemcpyHtoDAsync(buffer + off, pinned + off, n, stream),
            "async copy");
    }
  };
  // Device [from, to) through the ring, synchronously (as the shim's).
  auto ring = [&](size_t from, size_t to, bool out) {
    Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent (ring thread)");
    std::thread draining;
    if (out) {
      for (size_t off = from, c = 0; off < to; off += kSlot, ++c) {
        const size_t n = std::min(kSlot, to - off);
        char* slot = slots + (c % 2) * kSlot;
        Check(cuMemcpyDtoH(slot, buffer + off, n), "cuMemcpyDtoH (ring)");
        if (draining.joinable()) draining.join();
        draining = std::thread([=] { ParallelCopy(pageable + off, slot, n, threads); });
      }
      if (draining.joinable()) draining.join();
      return;
    }
    if (from >= to) return;
    std::thread filling([=] { ParallelCopy(slots, pageable + from, std::min(kSlot, to - from), threads); });
    for (size_t off = from, c = 0; off < to; off += kSlot, ++c) {
      const size_t n = std::min(kSlot, to - off);
      filling.join();
      const size_t next = off + kSlot;
      if (next < to) {
        char* nslot = slots + ((c + 1) % 2) * kSlot;
        filling = std::thread([=] { ParallelCopy(nslot, pageable + next, std::min(kSlot, to - next), threads); });
      }
      Check(cuMemcpyHtoD(buffer + off, slots + (c % 2) * kSlot, n), "cuMemcpyHtoD (ring)");
    }
    if (filling.joinable()) filling.join();
  };

  struct Way {
    const char* name;
    int ring_percent;
  };
  const Way ways[] = {{"engine", 0}, {"ring", 100}, {"ring25", 25}, {"ring33", 33}, {"ring50", 50}};
  const int n_ways = sizeof ways / sizeof ways[0];
  std::printf("way,step,round,seconds,gib_per_s\n");
  int failed = 0;
  for (int round = -1; round < rounds; ++round) {
    for (int i = 0; i < n_ways; ++i) {
      const Way& way = ways[(i + std::max(round, 0)) % n_ways];
      // The engine's share ends at a 1 GiB boundary; the ring takes the rest.
      const size_t split =
          std::min(bytes, (bytes * (100 - way.ring_percent) / 100 + kGiB / 2) / kGiB * kGiB);
      const unsigned char fill = static_cast<unsigned char>(0x21 + 7 * i + 3 * (round + 1));
      Check(cuMemsetD8(buffer, fill, bytes), "cuMemsetD8");
      Check(cuCtxSynchronize(), "cuCtxSynchronize");
      for (const bool out : {true, false}) {
        if (!out) {
          Check(cuMemsetD8(buffer, 0, bytes), "cuMemsetD8");
          Check(cuCtxSynchronize(), "cuCtxSynchronize");
        }
        const auto t = Clock::now();
        std::thread ring_thread([&] { ring(split, bytes, out); });
        engine(0, split, out);
        Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
        ring_thread.join();
        Row(way.name, out ? "out" : "in", round, Since(t), bytes);
      }
      for (int p = 0; p < 4; ++p) {
        unsigned char probe = 0;
        Check(cuMemcpyDtoH(&probe, buffer + (bytes - 1) * p / 3, 1), "cuMemcpyDtoH (probe)");
        if (probe != fill) {
          std::fprintf(stderr, "ring_beside_copy_engine: %s round %d: contents differ\n",
                       way.name, round);
          ++failed;
        }
      }
    }
  }
  return failed == 0 ? 0 : 1;
}
