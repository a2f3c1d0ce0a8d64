/* Every kind of memory-history event on the simulated driver (2 devices,
 * small device memory), for tests/e2e/check_snapshot.py: allocations from
 * the program itself, from a library calling the driver directly, and from
 * one calling through a stand-in shared libcudart (caller attribution's
 * stack scan); frees; a cache release (segment_free); stream-ordered
 * allocation on a stream; peer enable with a grant and a denial
 * (min-size policy); pause and resume of a tag (segment_unmap/map); an
 * on-demand snapshot while paused; an allocation that fails for lack of
 * memory. Prints "address NAME 0x..." for the checker, then OK/FAILED.
 * Run with VMMSHIM_SNAPSHOT_FILE set; argv[1] is the on-demand snapshot's
 * path. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

#include "vmmshim/vmmshim.h"

#include "expect.h"

int caller_allocate(CUdeviceptr* p, size_t bytes);
int caller_allocate_direct(CUdeviceptr* p, size_t bytes);

static void Print(const char* name, CUdeviceptr p) { printf("address %s %#llx\n", name, (unsigned long long)p); }

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: history_app ON_DEMAND_SNAPSHOT\n");
    return 2;
  }
  vmmshim_set_allocation_tag_fn set_tag =
      (vmmshim_set_allocation_tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_allocation_tag");
  vmmshim_pause_memory_fn pause = (vmmshim_pause_memory_fn)dlsym(RTLD_DEFAULT, "vmmshim_pause_memory");
  vmmshim_resume_memory_fn resume =
      (vmmshim_resume_memory_fn)dlsym(RTLD_DEFAULT, "vmmshim_resume_memory");
  vmmshim_release_cached_memory_fn release =
      (vmmshim_release_cached_memory_fn)dlsym(RTLD_DEFAULT, "vmmshim_release_cached_memory");
  vmmshim_write_snapshot_fn snapshot =
      (vmmshim_write_snapshot_fn)dlsym(RTLD_DEFAULT, "vmmshim_write_snapshot");
  vmmshim_record_memory_history_fn record =
      (vmmshim_record_memory_history_fn)dlsym(RTLD_DEFAULT, "vmmshim_record_memory_history");
  if (!set_tag || !pause || !resume || !release || !snapshot || !record) {
    fprintf(stderr, "the vmmshim API is not there: not running under the shim\n");
    return 2;
  }
  CUcontext ctx[2];
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  for (int d = 0; d < 2; ++d) EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx[d], d), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS);

  /* The C API's bad input. */
  EXPECT_EQ(snapshot(NULL), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(snapshot(""), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(snapshot("/nonexistent-dir/x.pickle"), CUDA_ERROR_OPERATING_SYSTEM);
  EXPECT_EQ(record(1, 0, 65), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(record(1, 0, 8), CUDA_SUCCESS);  /* call stacks from here on */

  CUdeviceptr small, large, direct, scanned, kv_small, kv_large, freed_small, freed_large;
  EXPECT_EQ(cuMemAlloc(&small, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&large, 8 << 20), CUDA_SUCCESS);
  EXPECT_EQ(caller_allocate_direct(&direct, 3 << 20), CUDA_SUCCESS);
  EXPECT_EQ(caller_allocate(&scanned, 5 << 20), CUDA_SUCCESS);
  /* Again from the same path: the caller is found where the first scan found it. */
  CUdeviceptr scanned_again;
  EXPECT_EQ(caller_allocate(&scanned_again, 1 << 20), CUDA_SUCCESS);
  Print("scanned_again", scanned_again);
  EXPECT_EQ(cuMemFree(scanned_again), CUDA_SUCCESS);
  EXPECT_EQ(set_tag("kv"), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&kv_small, 1000), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&kv_large, 6 << 20), CUDA_SUCCESS);
  EXPECT_EQ(set_tag(NULL), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&freed_small, 2048), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&freed_large, 4 << 20), CUDA_SUCCESS);
  Print("small", small);
  Print("large", large);
  Print("direct", direct);
  Print("scanned", scanned);
  Print("kv_small", kv_small);
  Print("kv_large", kv_large);

  /* Frees, then the cache released: segment_free. */
  EXPECT_EQ(cuMemFree(freed_small), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(freed_large), CUDA_SUCCESS);
  size_t released = 0;
  EXPECT_EQ(release(-1, &released), CUDA_SUCCESS);
  EXPECT_EQ(released >= (4 << 20), 1);

  /* Stream-ordered, on a stream. */
  CUstream stream;
  CUdeviceptr async;
  EXPECT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAllocAsync(&async, 1 << 20, stream), CUDA_SUCCESS);  /* freed after the snapshot */

  /* Peer access: device 0 enables access to device 1's memory; with
   * VMMSHIM_PEER_POLICY=min-size and 1M, a small allocation there is
   * denied and a large one granted. */
  EXPECT_EQ(cuCtxSetCurrent(ctx[1]), CUDA_SUCCESS);
  CUdeviceptr peer_small, peer_large;
  EXPECT_EQ(cuMemAlloc(&peer_small, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&peer_large, 2 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxEnablePeerAccess(ctx[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDisablePeerAccess(ctx[1]), CUDA_SUCCESS);

  /* Pause and resume the tag, with a snapshot while paused. */
  size_t paused = 0, restored = 0;
  EXPECT_EQ(pause("kv", VMMSHIM_PAUSE_KEEP_CONTENTS, &paused), CUDA_SUCCESS);
  EXPECT_EQ(snapshot(argv[1]), CUDA_SUCCESS);
  EXPECT_EQ(resume("kv", &restored), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(async, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(paused, restored);

  /* More than the device holds: out of memory, reported. */
  CUdeviceptr too_big = 1;
  EXPECT_EQ(cuMemAlloc(&too_big, (size_t)1 << 40), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(too_big, 0);

  CUdeviceptr all[] = {small, large, direct, scanned, kv_small, kv_large};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(cuMemFree(all[i]), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx[1]), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(peer_small), CUDA_SUCCESS);
  /* peer_large stays live: the exit snapshot shows it. */
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures != 0;
}
