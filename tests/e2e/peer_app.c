/* Peer access under the shim on the simulated driver (4 devices): device 1
 * owns a small, a large and a tagged ("kv") allocation; device 0 enables peer
 * access to device 1 and reads each with cuMemcpyDtoH (the simulated copy
 * engine of the current device checks the mapping's access). Prints one
 * line "small=ok|fault large=... tagged=... explicit=..." for the ctest
 * pattern of each policy, and checks the driver's peer-access codes. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

#include "vmmshim/vmmshim.h"

#include "expect.h"

static const char* Read(CUdeviceptr p) {
  char c;
  return cuMemcpyDtoH(&c, p, 1) == CUDA_SUCCESS ? "ok" : "fault";
}

int main(void) {
  CUcontext ctx[3];
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx[d], d), CUDA_SUCCESS);
  vmmshim_set_allocation_tag_fn set_tag =
      (vmmshim_set_allocation_tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_allocation_tag");
  vmmshim_grant_peer_access_fn grant =
      (vmmshim_grant_peer_access_fn)dlsym(RTLD_DEFAULT, "vmmshim_grant_peer_access");
  vmmshim_query_peer_access_fn query =
      (vmmshim_query_peer_access_fn)dlsym(RTLD_DEFAULT, "vmmshim_query_peer_access");
  if (!set_tag || !grant || !query) {
    fprintf(stderr, "the vmmshim API is not there: not running under the shim\n");
    return 2;
  }
  EXPECT_EQ(cuCtxSetCurrent(ctx[1]), CUDA_SUCCESS);
  CUdeviceptr small, large, tagged, spare;
  EXPECT_EQ(cuMemAlloc(&small, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&large, 8 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&spare, 6 << 20), CUDA_SUCCESS);
  EXPECT_EQ(set_tag("kv"), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&tagged, 4096), CUDA_SUCCESS);
  EXPECT_EQ(set_tag(NULL), CUDA_SUCCESS);

  EXPECT_EQ(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS);
  printf("before-enable large=%s\n", Read(large));
  /* The driver's codes. */
  EXPECT_EQ(cuCtxEnablePeerAccess(ctx[1], 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxEnablePeerAccess(ctx[0], 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  EXPECT_EQ(cuCtxDisablePeerAccess(ctx[2]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  EXPECT_EQ(cuCtxEnablePeerAccess(ctx[1], 0), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxEnablePeerAccess(ctx[1], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);

  /* A later allocation on device 1 follows the policy too. */
  CUdeviceptr later;
  EXPECT_EQ(cuCtxSetCurrent(ctx[1]), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&later, 16 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS);

  /* Explicit grant of `spare` to device 2, which never enabled anything. */
  EXPECT_EQ(grant((void*)spare, 2), CUDA_SUCCESS);
  int has = -1;
  EXPECT_EQ(query((void*)spare, 2, &has), CUDA_SUCCESS);
  EXPECT_EQ(has, 1);
  EXPECT_EQ(query((void*)0x1234, 2, &has), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxSetCurrent(ctx[2]), CUDA_SUCCESS);
  const char* explicit_read = Read(spare);
  EXPECT_EQ(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS);

  printf("small=%s large=%s tagged=%s later=%s explicit=%s\n", Read(small), Read(large),
         Read(tagged), Read(later), explicit_read);
  EXPECT_EQ(cuCtxDisablePeerAccess(ctx[1]), CUDA_SUCCESS);
  printf("after-disable large=%s\n", Read(large));
  EXPECT_EQ(cuCtxDisablePeerAccess(ctx[1]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);

  EXPECT_EQ(cuCtxSetCurrent(ctx[1]), CUDA_SUCCESS);
  CUdeviceptr all[] = {small, large, tagged, spare, later};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(cuMemFree(all[i]), CUDA_SUCCESS);
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures != 0;
}
