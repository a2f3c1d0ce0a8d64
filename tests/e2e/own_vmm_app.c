/* A driver-API program that makes VMM memory of its own, as PyTorch's
 * expandable segments and NCCL do: one handle through the exported
 * cuMemCreate, one through a pointer from cuGetProcAddress (the way
 * libraries reach the driver), each reserved, mapped and made accessible.
 * Under LD_PRELOAD=libvmmshim.so on the simulated libcuda.so.1 the calls
 * keep the driver's results, and vmmshim_get_residency names the memory
 * under "other_libraries_vmm" with the tag set at cuMemCreate; after the
 * program releases it, the report says 0 again. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "vmmshim/vmmshim.h"

#define MIB (1ull << 20)

/* The residency document, or NULL without the shim. */
static char* Residency(void) {
  vmmshim_get_residency_fn get = (vmmshim_get_residency_fn)dlsym(RTLD_DEFAULT, "vmmshim_get_residency");
  size_t needed = 0;
  if (get == NULL || get(NULL, 0, &needed) != 0) return NULL;
  char* doc = malloc(needed + 4096);
  if (get(doc, needed + 4096, &needed) != 0) {
    free(doc);
    return NULL;
  }
  return doc;
}

/* The number after `"key": ` at the first occurrence of `key` after `from`. */
static long long NumberAfter(const char* doc, const char* from, const char* key) {
  const char* at = strstr(doc, from);
  if (at == NULL) return -1;
  char quoted[128];
  snprintf(quoted, sizeof quoted, "\"%s\": ", key);
  at = strstr(at, quoted);
  return at == NULL ? -1 : atoll(at + strlen(quoted));
}

static void MapOwn(PFN_cuMemCreate_v10020 create, size_t size, CUdeviceptr* va,
                   CUmemGenericAllocationHandle* h) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  EXPECT_EQ(create(h, size, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressReserve(va, size, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemMap(*va, size, 0, *h, 0), CUDA_SUCCESS);
  CUmemAccessDesc access;
  memset(&access, 0, sizeof access);
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_EQ(cuMemSetAccess(*va, size, &access, 1), CUDA_SUCCESS);
}

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr shim_memory = 0;
  EXPECT_EQ(cuMemAlloc(&shim_memory, 4 * MIB), CUDA_SUCCESS);  /* the shim's own */

  vmmshim_set_allocation_tag_fn set_tag =
      (vmmshim_set_allocation_tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_allocation_tag");
  if (set_tag) set_tag("segments");
  CUdeviceptr a = 0, b = 0;
  CUmemGenericAllocationHandle ha = 0, hb = 0;
  MapOwn(cuMemCreate, 8 * MIB, &a, &ha);
  void* resolved = NULL;
  CUdriverProcAddressQueryResult found;
  EXPECT_EQ(cuGetProcAddress("cuMemCreate", &resolved, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found),
            CUDA_SUCCESS);
  MapOwn((PFN_cuMemCreate_v10020)resolved, 16 * MIB, &b, &hb);
  if (set_tag) set_tag(NULL);
  /* Bad input keeps the driver's code (the simulated driver's, which the
   * run without the shim checks too). */
  EXPECT_EQ(cuMemMap(a, 2 * MIB, 0, 0xdeadbeef, 0), CUDA_ERROR_INVALID_HANDLE);

  char* doc = Residency();
  if (doc != NULL) {
    EXPECT_EQ(NumberAfter(doc, "other_libraries_vmm", "bytes"), 24 * MIB);
    EXPECT_EQ(NumberAfter(doc, "other_libraries_vmm", "segments"), 24 * MIB);
    EXPECT_EQ(NumberAfter(doc, "\"shim\"", "resident_bytes"), 4 * MIB);
    free(doc);
  }
  EXPECT_EQ(cuMemUnmap(a, 8 * MIB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(ha), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(a, 8 * MIB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(hb), CUDA_SUCCESS);  /* still mapped: still held */
  doc = Residency();
  if (doc != NULL) {
    EXPECT_EQ(NumberAfter(doc, "other_libraries_vmm", "bytes"), 16 * MIB);
    free(doc);
  }
  EXPECT_EQ(cuMemUnmap(b, 16 * MIB), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(b, 16 * MIB), CUDA_SUCCESS);
  doc = Residency();
  if (doc != NULL) {
    EXPECT_EQ(NumberAfter(doc, "other_libraries_vmm", "bytes"), 0);
    free(doc);
  }
  EXPECT_EQ(cuMemFree(shim_memory), CUDA_SUCCESS);
  printf(failures ? "FAILED\n" : "OK\n");
  return failures != 0;
}
