// Whether a pinned pool can give its page-locking back behind the copies of
// a pause, and take it again ahead of the copies of a resume, at the copy
// engine's speed. Why: the driver's process checkpoint (cuCheckpointProcess*)
// unpins and re-pins every registered range it finds, which cost a deep sleep
// about 0.4 s per 20 GiB at each end (docs/deep-sleep.md, "Measured on the
// H200"); a pool with nothing registered at the checkpoint avoids that, if
// dropping and making the registrations can hide behind the copies.
//
// Natively: SIZE bytes (default 16 GiB) of MADV_HUGEPAGE memory written by
// the process's CPUs (at most 16) and registered as CHUNK-sized ranges
// (default 1 GiB); a device buffer of SIZE; a resident set of 1,000 device
// allocations. Ways, alternated, ROUNDS rounds after one warm-up round:
//   kept       copies only, the registrations kept (the pool as it is)
//   serial     copy everything to the host, then unregister every chunk;
//              register every chunk, then copy everything back
//   pipelined  copy chunk k to the host on a stream and record an event;
//              the host waits for each event in turn and unregisters that
//              chunk while later copies run; back: register chunk k, then
//              queue its copy, so the next registration runs beside it
// Rows: way,step,round,seconds,gib_per_s; steps "out" (to the host, and
// unregistered where the way does) and "in" (registered and back to the
// device). Every round checks the device buffer's contents after "in".
// usage: registration_behind_copies [SIZE_GIB] [ROUNDS] [CHUNK_MIB]
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "host_copy_setup.h"

namespace {

using host_copy_setup::Check;
using host_copy_setup::Clock;
using host_copy_setup::Since;

void Row(const char* way, const char* step, int round, double seconds, size_t bytes) {
  if (round < 0) return;  // warm-up
  std::printf("%s,%s,%d,%.4f,%.2f\n", way, step, round, seconds,
              bytes / double(size_t{1} << 30) / seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16) << 30;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const size_t chunk = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1024) << 20;
  const size_t chunks = (bytes + chunk - 1) / chunk;
  host_copy_setup::PrimaryContextWithResidentSet();
  CUdeviceptr buffer;
  Check(cuMemAlloc(&buffer, bytes), "cuMemAlloc (buffer)");
  CUstream stream;
  Check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  std::vector<CUevent> done(chunks);
  for (CUevent& e : done) Check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");

  char* host = host_copy_setup::Map(bytes, /*huge=*/true);
  host_copy_setup::Touch(host, bytes, host_copy_setup::CopyThreads());
  auto span = [&](size_t k) { return std::min(chunk, bytes - k * chunk); };
  auto reg = [&](size_t k) {
    Check(cuMemHostRegister(host + k * chunk, span(k), CU_MEMHOSTREGISTER_PORTABLE),
          "cuMemHostRegister");
  };
  auto unreg = [&](size_t k) { Check(cuMemHostUnregister(host + k * chunk), "cuMemHostUnregister"); };
  auto out = [&](size_t k) {
    Check(cuMemcpyDtoHAsync(host + k * chunk, buffer + k * chunk, span(k), stream),
          "cuMemcpyDtoHAsync");
  };
  auto in = [&](size_t k) {
    Check(cuMemcpyHtoDAsync(buffer + k * chunk, host + k * chunk, span(k), stream),
          "cuMemcpyHtoDAsync");
  };
  for (size_t k = 0; k < chunks; ++k) reg(k);  // every way starts and ends registered
  std::fprintf(stderr, "registration_behind_copies: %zu GiB in %zu chunks of %zu MiB\n",
               bytes >> 30, chunks, chunk >> 20);
  std::printf("way,step,round,seconds,gib_per_s\n");

  const char* ways[] = {"kept", "serial", "pipelined"};
  int failed = 0;
  for (int round = -1; round < rounds; ++round) {
    for (int i = 0; i < 3; ++i) {
      const std::string way = ways[(i + std::max(round, 0)) % 3];
      const unsigned char fill = static_cast<unsigned char>(0x11 * (1 + i + 3 * (round + 1)));
      Check(cuMemsetD8(buffer, fill, bytes), "cuMemsetD8");
      Check(cuCtxSynchronize(), "cuCtxSynchronize");
      auto t = Clock::now();
      if (way == "pipelined") {
        for (size_t k = 0; k < chunks; ++k) {
          out(k);
          Check(cuEventRecord(done[k], stream), "cuEventRecord");
        }
        for (size_t k = 0; k < chunks; ++k) {
          Check(cuEventSynchronize(done[k]), "cuEventSynchronize");
          unreg(k);
        }
      } else {
        for (size_t k = 0; k < chunks; ++k) out(k);
        Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
        if (way == "serial") {
          for (size_t k = 0; k < chunks; ++k) unreg(k);
        }
      }
      Row(way.c_str(), "out", round, Since(t), bytes);
      Check(cuMemsetD8(buffer, 0, bytes), "cuMemsetD8");
      Check(cuCtxSynchronize(), "cuCtxSynchronize");
      t = Clock::now();
      if (way == "pipelined") {
        for (size_t k = 0; k < chunks; ++k) {
          reg(k);
          in(k);
        }
      } else {
        if (way == "serial") {
          for (size_t k = 0; k < chunks; ++k) reg(k);
        }
        for (size_t k = 0; k < chunks; ++k) in(k);
      }
      Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
      Row(way.c_str(), "in", round, Since(t), bytes);
      unsigned char probe[3];
      for (int p = 0; p < 3; ++p) {
        Check(cuMemcpyDtoH(&probe[p], buffer + (bytes - 1) * p / 2, 1), "cuMemcpyDtoH");
      }
      if (probe[0] != fill || probe[1] != fill || probe[2] != fill) {
        std::fprintf(stderr, "registration_behind_copies: %s round %d: contents differ\n",
                     way.c_str(), round);
        ++failed;
      }
    }
  }
  return failed ? 1 : 0;
}
