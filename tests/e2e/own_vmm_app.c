/* A driver-API program that makes VMM memory of its own, as PyTorch's
 * expandable segments and NCCL do: one handle through the exported
 * cuMemCreate, one through a pointer from cuGetProcAddress (the way
 * libraries reach the driver), each reserved, mapped and made accessible.
 * Under LD_PRELOAD=libvmmshim.so on the simulated libcuda.so.1 the calls
 * keep the driver's results, and vmmshim_get_residency names the memory
 * under "other_libraries_vmm" with the tag set at cuMemCreate.
 * vmmshim_pause_memory(NULL) with contents releases it too; while paused the
 * program's handle values keep working; resume maps new memory at the same
 * addresses with the contents back, and cuMemRetainAllocationHandle still
 * answers with the program's value. After the program releases it, the
 * report says 0 again.
 *
 * argv[1] says what an access to paused memory does (VMMSHIM_PAUSED_ACCESS):
 *   fault   it fails;
 *   host    it reads the contents, and a write made while paused is there
 *           after the resume (host memory made at the pause);
 *   either  the default's first pause: it fails until the host memory made in
 *           the background holds the contents (views made late), then reads
 *           them; which one a run sees depends on timing. */
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

/* With the shim: pauses everything with contents and resumes it, checking
 * that the program's own memory went and came back. */
static void PauseAndResume(const char* access, CUdeviceptr a, CUmemGenericAllocationHandle ha,
                           CUdeviceptr b, CUmemGenericAllocationHandle hb) {
  vmmshim_pause_memory_fn pause =
      (vmmshim_pause_memory_fn)dlsym(RTLD_DEFAULT, "vmmshim_pause_memory");
  vmmshim_resume_memory_fn resume =
      (vmmshim_resume_memory_fn)dlsym(RTLD_DEFAULT, "vmmshim_resume_memory");
  if (pause == NULL || resume == NULL) return;
  static unsigned char pattern[2 * MIB], back[2 * MIB];
  for (size_t i = 0; i < sizeof pattern; ++i) pattern[i] = (unsigned char)(i * 7 + 3);
  EXPECT_EQ(cuMemcpyHtoD(b + 6 * MIB, pattern, sizeof pattern), CUDA_SUCCESS);
  size_t released = 0, restored = 0;
  EXPECT_EQ(pause(NULL, VMMSHIM_PAUSE_KEEP_CONTENTS, &released), 0);
  EXPECT_EQ(released, 28 * MIB); /* 24 of the program's own, 4 of the shim's */
  char* doc = Residency();
  if (doc != NULL) {
    EXPECT_EQ(NumberAfter(doc, "other_libraries_vmm", "bytes"), 0);
    EXPECT_EQ(NumberAfter(doc, "paused_by_tag", "segments"), 24 * MIB);
    /* What an access would fault on now: all of it, or none of it. */
    if (strcmp(access, "fault") == 0) {
      EXPECT_EQ(NumberAfter(doc, "other_libraries_vmm", "paused_faulting_bytes"), 24 * MIB);
      EXPECT_EQ(NumberAfter(doc, "\"shim\"", "paused_faulting_bytes"), 4 * MIB);
    } else if (strcmp(access, "host") == 0) {
      EXPECT_EQ(NumberAfter(doc, "other_libraries_vmm", "paused_faulting_bytes"), 0);
      EXPECT_EQ(NumberAfter(doc, "\"shim\"", "paused_faulting_bytes"), 0);
    }
    free(doc);
  }
  /* Paused: an access fails or reads the contents (argv[1]); the handle
   * answers from the record. */
  CUresult paused_read = cuMemcpyDtoH(back, b + 6 * MIB, sizeof back);
  if (strcmp(access, "fault") == 0) {
    EXPECT_EQ(paused_read != CUDA_SUCCESS, 1);
  } else if (strcmp(access, "host") == 0) {
    EXPECT_EQ(paused_read, CUDA_SUCCESS);
  }
  if (paused_read == CUDA_SUCCESS) {
    EXPECT_EQ(memcmp(back, pattern, sizeof back), 0);
  }
  if (strcmp(access, "host") == 0) {
    /* A write while paused goes to the host copy and comes back with it. */
    pattern[0] ^= 0xff;
    EXPECT_EQ(cuMemcpyHtoD(b + 6 * MIB, pattern, 1), CUDA_SUCCESS);
  }
  CUmemAllocationProp prop;
  EXPECT_EQ(cuMemGetAllocationPropertiesFromHandle(&prop, ha), CUDA_SUCCESS);
  EXPECT_EQ(prop.location.id, 0);
  CUdeviceptr fresh = 0;
  EXPECT_EQ(cuMemAddressReserve(&fresh, 2 * MIB, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemMap(fresh, 2 * MIB, 0, hb, 0), CUDA_ERROR_ILLEGAL_STATE); /* resume first */
  EXPECT_EQ(cuMemAddressFree(fresh, 2 * MIB), CUDA_SUCCESS);
  /* Over a paused mapping's range, as over a mapped one natively. */
  EXPECT_EQ(cuMemMap(a, 2 * MIB, 0, hb, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(resume(NULL, &restored), 0);
  EXPECT_EQ(restored, 28 * MIB);
  memset(back, 0, sizeof back);
  EXPECT_EQ(cuMemcpyDtoH(back, b + 6 * MIB, sizeof back), CUDA_SUCCESS);
  EXPECT_EQ(memcmp(back, pattern, sizeof back), 0);
  /* The program's value, through a pointer from cuGetProcAddress. */
  void* resolved = NULL;
  CUdriverProcAddressQueryResult found;
  EXPECT_EQ(cuGetProcAddress("cuMemRetainAllocationHandle", &resolved, 12000,
                             CU_GET_PROC_ADDRESS_DEFAULT, &found),
            CUDA_SUCCESS);
  CUmemGenericAllocationHandle retained = 0;
  EXPECT_EQ(((PFN_cuMemRetainAllocationHandle_v11000)resolved)(&retained, (void*)(b + MIB)),
            CUDA_SUCCESS);
  EXPECT_EQ(retained, hb);
  EXPECT_EQ(cuMemRelease(retained), CUDA_SUCCESS);
}

int main(int argc, char** argv) {
  const char* access = argc > 1 ? argv[1] : "either";
  if (strcmp(access, "fault") != 0 && strcmp(access, "host") != 0 &&
      strcmp(access, "either") != 0) {
    fprintf(stderr, "usage: %s [fault|host|either]\n", argv[0]);
    return 2;
  }
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
  PauseAndResume(access, a, ha, b, hb);
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
