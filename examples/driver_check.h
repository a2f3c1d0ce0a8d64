/* CHECK(call): prints the failing driver-API call and its CUresult and
 * returns 1 from the calling function (main). Shared by the plain-C
 * driver-API examples, which check every call. */
#ifndef VMMSHIM_EXAMPLES_DRIVER_CHECK_H_
#define VMMSHIM_EXAMPLES_DRIVER_CHECK_H_

#include <cuda.h>
#include <stdio.h>

#define CHECK(call)                                                            \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                      \
      return 1;                                                                \
    }                                                                          \
  } while (0)

#endif /* VMMSHIM_EXAMPLES_DRIVER_CHECK_H_ */
