// cuCtxEnablePeerAccess / cuCtxDisablePeerAccess as the shim performs them:
// the driver's (or the emulated) per-context-pair decision, then the
// VMM grants for the device pair (PeerGrants); part 5 of the story in
// core/peer/peer_access.h.
//
// The current context asks for access to `peer`'s memory. Two modes, chosen
// by VMMSHIM_PEER_ENABLE_DRIVER:
//   - kDriver (1, default): the real cuCtxEnablePeerAccess decides and its
//     code is returned unchanged. Only after it succeeded are the policy's
//     VMM grants made (PeerGrants::EnablePeer(current device, peer's device));
//     when they fail, the driver's enable is undone with
//     cuCtxDisablePeerAccess and the grant's code is returned. When the
//     devices cannot be read after the driver accepted, CUDA_SUCCESS (no
//     grant: nothing of the shim's to map). Disable: the real
//     cuCtxDisablePeerAccess first; its failure code is returned unchanged.
//   - kEmulated (0): the driver is not asked to enable anything (for
//     drivers or topologies where the enable itself misbehaves); the shim
//     keeps the per-pair state (PeerContexts) and answers with the codes the
//     driver gives, checked in this order:
//       CUDA_ERROR_INVALID_VALUE              flags != 0
//       CUDA_ERROR_INVALID_CONTEXT            no current context, or peer
//                                             nullptr
//       (cuCtxGetDevice's or, for `peer`, cuCtxPushCurrent_v2's /
//        cuCtxGetDevice's code, unchanged; likewise cuDeviceCanAccessPeer's)
//       CUDA_ERROR_PEER_ACCESS_UNSUPPORTED    cuDeviceCanAccessPeer says 0
//       CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED the pair is enabled already
//       the grant's code (core/driver/cu_status.h)   PeerGrants::EnablePeer failed;
//                                             the pair is not recorded
//     Disable: CUDA_ERROR_INVALID_CONTEXT (no current context, peer
//     nullptr), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED (pair not enabled).
// In both modes a successful disable then revokes the grants
// (PeerGrants::DisablePeer); a revoke failure is logged, not returned (the
// driver's disable has happened). Enables nest per device pair: two
// contexts of one device that enable the same owner need two disables
// before its grants go (PeerGrants::EnablePeer's count).
//
// Thread safety: Enable and Disable may be called concurrently (the
// grants' and PeerContexts' locks; the push/pop of `peer` is on the calling
// thread's context stack only).
//
// Source of the behaviour: measured on an H200 (docs/architecture.md,
// "Measured driver facts": cudaDeviceDisablePeerAccess gives 705,
// CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, when not enabled).
#ifndef VMMSHIM_CORE_PEER_ENABLE_PEER_ENABLE_H_
#define VMMSHIM_CORE_PEER_ENABLE_PEER_ENABLE_H_

#include <cuda.h>

#include <atomic>
#include <cstdint>

#include "core/driver/driver_api.h"
#include "core/peer/enable/peer_contexts.h"
#include "core/peer/enable/peer_grants.h"

namespace vmmshim {

// The device of `ctx`: cuCtxGetDevice with `ctx` pushed current for the
// query, popped again. The push's or the query's CUresult on failure.
CUresult ContextDevice(const DriverApi& driver, CUcontext ctx, CUdevice* device);

enum class PeerEnableMode {
  kDriver,    // VMMSHIM_PEER_ENABLE_DRIVER=1: the driver decides
  kEmulated,  // VMMSHIM_PEER_ENABLE_DRIVER=0: PeerContexts decides
};

// cuCtxEnablePeerAccess as the program saw it: the calls and their time
// (steady clock), whatever they returned (MemoryControl::GetStats reports
// them as peer_enable_calls and peer_enable_seconds). Relaxed atomics.
struct PeerEnableFigures {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> nanoseconds{0};
};

// Holds references only: `driver`, `grants`, `figures` and `contexts` must
// outlive it. Cheap to construct per call; the state lives in `contexts`
// (used in kEmulated mode only) and in `grants`.
class PeerEnable {
 public:
  PeerEnable(const DriverApi& driver, PeerGrants& grants, PeerEnableFigures& figures,
             PeerContexts& contexts, PeerEnableMode mode)
      : driver_(driver), grants_(grants), figures_(figures), contexts_(contexts), mode_(mode) {}

  // cuCtxEnablePeerAccess(peer, flags) for the current context; counted in
  // `figures` with its duration, whatever it returns.
  CUresult Enable(CUcontext peer, unsigned int flags) const;
  // cuCtxDisablePeerAccess(peer) for the current context.
  CUresult Disable(CUcontext peer) const;

 private:
  CUresult EnableUntimed(CUcontext peer, unsigned int flags) const;

  const DriverApi& driver_;
  PeerGrants& grants_;
  PeerEnableFigures& figures_;
  PeerContexts& contexts_;
  PeerEnableMode mode_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_PEER_ENABLE_PEER_ENABLE_H_
