// The driver's per-context-pair peer-access state, kept by the shim when
// cuCtxEnablePeerAccess does not reach the driver
// (VMMSHIM_PEER_ENABLE_DRIVER=0), so that the application still gets the
// driver's codes: CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED for a pair enabled
// twice, CUDA_ERROR_PEER_ACCESS_NOT_ENABLED for disabling a pair that is not.
// Thread safety: all methods may be called concurrently.
#ifndef VMMSHIM_CORE_PEER_ENABLE_PEER_CONTEXTS_H_
#define VMMSHIM_CORE_PEER_ENABLE_PEER_CONTEXTS_H_

#include <cuda.h>

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "core/sync/mutex.h"

namespace vmmshim {

class PeerContexts {
 public:
  // CUDA_SUCCESS, or CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED.
  CUresult Enable(CUcontext from, CUcontext to);
  // CUDA_SUCCESS, or CUDA_ERROR_PEER_ACCESS_NOT_ENABLED.
  CUresult Disable(CUcontext from, CUcontext to);

 private:
  Mutex mu_;
  absl::flat_hash_set<std::pair<CUcontext, CUcontext>> enabled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_PEER_ENABLE_PEER_CONTEXTS_H_
