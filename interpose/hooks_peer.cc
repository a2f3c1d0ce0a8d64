// cudaDeviceEnablePeerAccess / cudaDeviceDisablePeerAccess arrive here. The
// decisions (driver or emulated mode, grants, rollback, codes) are
// core/peer/enable/peer_enable.h's.
#include "core/peer/enable/peer_enable.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Runtime;

namespace {

vmmshim::PeerEnable PeerEnableOf(const Runtime& rt) {
  return vmmshim::PeerEnable(rt.driver, rt.core->peers(), rt.core->peer_enables(), rt.peer_contexts,
                             rt.config.peer_enable_driver
                                 ? vmmshim::PeerEnableMode::kDriver
                                 : vmmshim::PeerEnableMode::kEmulated);
}

}  // namespace

VMMSHIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled()) return rt->driver.cuCtxEnablePeerAccess(peer, flags);
  return PeerEnableOf(*rt).Enable(peer, flags);
}

VMMSHIM_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled()) return rt->driver.cuCtxDisablePeerAccess(peer);
  return PeerEnableOf(*rt).Disable(peer);
}
