/* Resolves the driver the way cudart 13 does: dlopen("libcuda.so.1"), a
 * plain dlsym for cuGetProcAddress_v2, then that resolver asked for
 * "cuGetProcAddress" itself and used for every later lookup. Not linked with
 * libcuda. Mode "vmm": the shim must be in the path; "native": the shim is
 * loaded with VMMSHIM_ENABLE=0 and must stay out of the way. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                    \
    }                                                                \
  } while (0)

static int InShim(void* fn) {
  Dl_info info;
  return dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libvmmshim") != NULL;
}

int main(int argc, char** argv) {
  const int vmm = !(argc > 1 && strcmp(argv[1], "native") == 0);
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL);
  if (!h) return 1;
  PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  CHECK(gpa != NULL);
  CHECK(InShim((void*)gpa)); /* dlsym routing does not depend on the config */

  CUdriverProcAddressQueryResult st;
  PFN_cuGetProcAddress_v12000 self = NULL;
  CHECK(gpa("cuGetProcAddress", (void**)&self, 12000, 0, &st) == CUDA_SUCCESS);
  CHECK(InShim((void*)self) == vmm);
  PFN_cuGetProcAddress_v11030 v1 = NULL;
  CHECK(self("cuGetProcAddress", (void**)&v1, 11030, 0, &st) == CUDA_SUCCESS);
  CHECK(v1 != NULL && InShim((void*)v1) == vmm);

  /* Errors and statuses of the real resolver pass through unchanged. */
  void* none = (void*)1;
  CUresult missing = self("cuNoSuchEntryPoint", &none, 13000, 0, &st);
  printf("unknown entry point: CUresult %d, status %d\n", (int)missing, (int)st);
  CHECK(none == NULL);
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

  PFN_cuInit_v2000 init;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain;
  PFN_cuCtxSetCurrent_v4000 set_current;
  PFN_cuMemAlloc_v3020 alloc;
  PFN_cuMemFree_v3020 mfree;
  PFN_cuMemcpyDtoH_v3020 dtoh;
  PFN_cuMemcpyHtoD_v7000_ptds htod_ptds;
  CHECK(self("cuInit", (void**)&init, 13000, 0, &st) == CUDA_SUCCESS);
  CHECK(self("cuDevicePrimaryCtxRetain", (void**)&retain, 13000, 0, &st) == CUDA_SUCCESS);
  CHECK(self("cuCtxSetCurrent", (void**)&set_current, 13000, 0, &st) == CUDA_SUCCESS);
  CHECK(self("cuMemAlloc", (void**)&alloc, 13000, 0, &st) == CUDA_SUCCESS);
  CHECK(v1("cuMemFree", (void**)&mfree, 13000, 0) == CUDA_SUCCESS);
  CHECK(self("cuMemcpyDtoH", (void**)&dtoh, 13000, 0, &st) == CUDA_SUCCESS);
  /* The per-thread-default-stream flag is honoured: the _ptds function
   * comes back, the driver's (pass-through) or the shim's gated hook of that
   * name (interpose/hooks_submission.cc), as a dlsym of the name answers. */
  CHECK(self("cuMemcpyHtoD", (void**)&htod_ptds, 13000,
             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) == CUDA_SUCCESS);
  Dl_info where;
  CHECK(dladdr((void*)htod_ptds, &where) != 0 && where.dli_sname != NULL &&
        strcmp(where.dli_sname, "cuMemcpyHtoD_v2_ptds") == 0);
  CHECK(InShim((void*)htod_ptds) == vmm);
  CHECK(InShim((void*)alloc) == vmm);
  CHECK(InShim((void*)mfree) == vmm);
  CHECK(!InShim((void*)init));
  /* A plain dlsym of a hooked versioned export is routed too (dlsym routing
   * does not depend on VMMSHIM_ENABLE; the hook itself passes through). */
  CHECK(InShim(dlsym(h, "cuMemAlloc_v2")));

  CUcontext ctx;
  CHECK(init(0) == CUDA_SUCCESS);
  CHECK(retain(&ctx, 0) == CUDA_SUCCESS);
  CHECK(set_current(ctx) == CUDA_SUCCESS);
  CUdeviceptr small = 0, big = 0;
  CHECK(alloc(&small, 4096) == CUDA_SUCCESS);
  CHECK(alloc(&big, 16 << 20) == CUDA_SUCCESS);
  char out[6] = {0};
  CHECK(htod_ptds(big + (8 << 20), "hello", 6) == CUDA_SUCCESS);
  CHECK(dtoh(out, big + (8 << 20), 6) == CUDA_SUCCESS);
  CHECK(strcmp(out, "hello") == 0);
  CHECK(mfree(small) == CUDA_SUCCESS);
  CHECK(mfree(big) == CUDA_SUCCESS);

  unsigned long long (*count)(const char*) =
      (unsigned long long (*)(const char*))dlsym(h, "simcuCallCount");
  /* On the simulated driver, count the VMM calls; the real driver has no
   * such counter (the gpu-labelled test runs this program there too). */
  if (count) CHECK((count("cuMemCreate") > 0) == vmm);
  printf("%s (%s driver)\n", failures ? "FAILED" : "OK", count ? "simulated" : "real");
  return failures != 0;
}
