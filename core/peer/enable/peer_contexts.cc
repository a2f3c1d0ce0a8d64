#include "core/peer/enable/peer_contexts.h"

namespace vmmshim {

CUresult PeerContexts::Enable(CUcontext from, CUcontext to) {
  MutexLock lock(&mu_);
  return enabled_.insert({from, to}).second ? CUDA_SUCCESS
                                            : CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
}

CUresult PeerContexts::Disable(CUcontext from, CUcontext to) {
  MutexLock lock(&mu_);
  return enabled_.erase({from, to}) == 1 ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

}  // namespace vmmshim
