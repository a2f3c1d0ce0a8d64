/* Stream-ordered allocation under LD_PRELOAD=libvmmshim.so on the simulated
 * libcuda.so.1, through the hooks (docs/stream-ordered.md):
 *   - cuMemAllocAsync on the default pool is served by the shim (the
 *     driver's cuMemAllocAsync is not called), named by the default pool,
 *     counted in its attributes, reused on the same stream at once;
 *   - the per-thread entry point (cuGetProcAddress with the per-thread flag)
 *     is served too;
 *   - cuMemPoolSetAccess is the peer event for it, and not for cuMemAlloc
 *     memory; cuMemPoolGetAccess answers as the driver;
 *   - a pool made current with cuDeviceSetMemPool goes to the driver;
 *   - bad input gets the driver's codes. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

#include "expect.h"
#include "vmmshim/vmmshim.h"

unsigned long long simcuCallCount(const char* entry);

static vmmshim_query_peer_access_fn query;

/* 1: shim memory that `peer` can access, 0: shim memory it cannot, -1: not
 * shim memory. */
static int Access(CUdeviceptr p, int peer) {
  int has = 0;
  if (query((const void*)p, peer, &has) != 0) return -1;
  return has;
}

static cuuint64_t Attr(CUmemoryPool pool, CUmemPool_attribute attr) {
  cuuint64_t v = 0;
  EXPECT_EQ(cuMemPoolGetAttribute(pool, attr, &v), CUDA_SUCCESS);
  return v;
}

int main(void) {
  query = (vmmshim_query_peer_access_fn)dlsym(RTLD_DEFAULT, "vmmshim_query_peer_access");
  if (query == NULL) {
    fprintf(stderr, "the vmmshim API is not there: not running under the shim\n");
    return 2;
  }
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  CUcontext ctx = NULL;
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUstream s = NULL;
  EXPECT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUmemoryPool pool = NULL;
  EXPECT_EQ(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);

  CUdeviceptr p = 0, m = 0;
  EXPECT_EQ(cuMemAllocAsync(&p, 1 << 20, s), CUDA_SUCCESS);
  EXPECT_EQ(simcuCallCount("cuMemAllocAsync"), 0);
  EXPECT_EQ(Access(p, 0), 1);
  CUmemoryPool named = NULL;
  EXPECT_EQ(cuPointerGetAttribute(&named, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p), CUDA_SUCCESS);
  EXPECT_EQ(named == pool, 1);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1 << 20);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= (1 << 20), 1);
  printf("served from VMM: ok\n");

  /* Pool access is the peer event for stream-ordered memory only. */
  EXPECT_EQ(cuMemAlloc(&m, 4 << 20), CUDA_SUCCESS);
  CUmemAccessDesc desc = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  EXPECT_EQ(Access(p, 1), 0);
  EXPECT_EQ(cuMemPoolSetAccess(pool, &desc, 1), CUDA_SUCCESS);
  EXPECT_EQ(Access(p, 1), 1);
  EXPECT_EQ(Access(m, 1), 0);
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CUmemLocation peer = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  EXPECT_EQ(cuMemPoolGetAccess(&flags, pool, &peer), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  EXPECT_EQ(cuMemPoolSetAccess(pool, &desc, 1), CUDA_SUCCESS);
  EXPECT_EQ(Access(p, 1), 0);
  desc.location.id = 7; /* no such device: the driver's code */
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_EQ(cuMemPoolSetAccess(pool, &desc, 1), CUDA_ERROR_INVALID_DEVICE);
  printf("pool access: ok\n");

  /* Same-stream reuse, double free. */
  EXPECT_EQ(cuMemFreeAsync(p, s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(p, s), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr again = 0;
  EXPECT_EQ(cuMemAllocAsync(&again, 1 << 20, s), CUDA_SUCCESS);
  EXPECT_EQ(again == p, 1);
  EXPECT_EQ(cuMemFreeAsync(again, s), CUDA_SUCCESS);

  /* The per-thread entry point, as cudart built with per-thread streams
   * resolves it. */
  CUresult (*alloc_ptsz)(CUdeviceptr*, size_t, CUstream) = NULL;
  CUdriverProcAddressQueryResult found;
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAllocAsync", (void**)&alloc_ptsz, 11020,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &found),
            CUDA_SUCCESS);
  CUdeviceptr t = 0;
  EXPECT_EQ(alloc_ptsz(&t, 4096, NULL), CUDA_SUCCESS);
  EXPECT_EQ(Access(t, 0), 1);
  EXPECT_EQ(cuMemFreeAsync(t, s), CUDA_SUCCESS);
  printf("per-thread entry point: ok\n");

  /* A created pool made current: the driver's. */
  CUmemPoolProps props = {0};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool mine = NULL;
  EXPECT_EQ(cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceSetMemPool(0, mine), CUDA_SUCCESS);
  CUdeviceptr d = 0;
  EXPECT_EQ(cuMemAllocAsync(&d, 4096, s), CUDA_SUCCESS);
  EXPECT_EQ(Access(d, 0), -1);
  EXPECT_EQ(simcuCallCount("cuMemAllocAsync"), 1);
  EXPECT_EQ(cuMemFreeAsync(d, s), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceSetMemPool(0, pool), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAllocAsync(&d, 4096, s), CUDA_SUCCESS);
  EXPECT_EQ(Access(d, 0), 1);
  EXPECT_EQ(cuMemFreeAsync(d, s), CUDA_SUCCESS);
  printf("current pool: ok\n");

  /* Bad input: the driver's codes (measured on H200). */
  EXPECT_EQ(cuMemAllocAsync(NULL, 256, s), CUDA_ERROR_INVALID_VALUE);
  d = 0x5a5a;
  EXPECT_EQ(cuMemAllocAsync(&d, 0, s), CUDA_SUCCESS);
  EXPECT_EQ(d, 0);
  EXPECT_EQ(cuMemAllocFromPoolAsync(&d, 256, NULL, s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFreeAsync(0, s), CUDA_SUCCESS);

  /* Freed memory leaves the pool's figures with threshold 0, and the stream
   * goes through the shim's destroy hook. */
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(m), CUDA_SUCCESS);
  printf(failures == 0 ? "OK\n" : "FAILED\n");
  return failures == 0 ? 0 : 1;
}
