// Host memory registered with the driver (cuMemHostRegister), shared by the
// pause's copies (core/heap/host_backup.h, pinned_pool.h).
//
// A context's destruction (cudaDeviceReset, cuCtxDestroy) drops the
// registrations made in it, and the driver answers cuMemHostGetFlags only
// with a current context (H200, driver 580): so a registration is asked
// about, and dropped, in the context it was made in, pushed for the call
// (the caller may be a thread with none, such as the control socket's).
//
// Thread safety: any thread; the caller keeps `p` registered or not meanwhile.
#ifndef VMMSHIM_CORE_DRIVER_HOST_REGISTRATION_H_
#define VMMSHIM_CORE_DRIVER_HOST_REGISTRATION_H_

#include <cuda.h>

#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/driver/driver_api.h"

namespace vmmshim {

// Whether the registration of `p` made in `context` is still alive.
inline bool HostRegistrationAlive(const DriverApi& driver, void* p, CUcontext context) {
  ContextScope scope(driver, context);
  unsigned int flags = 0;
  return driver.cuMemHostGetFlags(&flags, p) == CUDA_SUCCESS;
}

// Drops the registration of `p` made in `context` when it is still alive;
// a failure is logged, naming `what`.
inline void UnregisterHostMemory(const DriverApi& driver, void* p, CUcontext context,
                                 const char* what) {
  if (!HostRegistrationAlive(driver, p, context)) return;
  ContextScope scope(driver, context);
  if (CUresult r = driver.cuMemHostUnregister(p); r != CUDA_SUCCESS) {
    Log().warn("cuMemHostUnregister of {}: {}", what, CuResultName(r));
  }
}

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_DRIVER_HOST_REGISTRATION_H_
