#include "core/peer/enable/peer_enable.h"

#include <chrono>

#include "core/driver/cu_status.h"
#include "core/base/log.h"

namespace vmmshim {

CUresult ContextDevice(const DriverApi& driver, CUcontext ctx, CUdevice* device) {
  CUresult r = driver.cuCtxPushCurrent_v2(ctx);
  if (r != CUDA_SUCCESS) return r;
  r = driver.cuCtxGetDevice(device);
  CUcontext popped;
  driver.cuCtxPopCurrent_v2(&popped);
  return r;
}

CUresult PeerEnable::Enable(CUcontext peer, unsigned int flags) const {
  const auto start = std::chrono::steady_clock::now();
  const CUresult r = EnableUntimed(peer, flags);
  figures_.calls.fetch_add(1, std::memory_order_relaxed);
  figures_.nanoseconds.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count()),
      std::memory_order_relaxed);
  return r;
}

CUresult PeerEnable::EnableUntimed(CUcontext peer, unsigned int flags) const {
  CUcontext current = nullptr;
  CUdevice me = 0, owner = 0;
  if (mode_ == PeerEnableMode::kDriver) {
    CUresult r = driver_.cuCtxEnablePeerAccess(peer, flags);
    if (r != CUDA_SUCCESS) return r;
    if (driver_.cuCtxGetDevice(&me) != CUDA_SUCCESS ||
        ContextDevice(driver_, peer, &owner) != CUDA_SUCCESS) {
      return CUDA_SUCCESS;  // the driver accepted it; nothing of ours to grant
    }
    absl::Status granted = grants_.EnablePeer(me, owner);
    if (!granted.ok()) {
      Log().error("granting peer {} access to device {} failed: {}", me, owner,
                  granted.ToString());
      driver_.cuCtxDisablePeerAccess(peer);
      return ToCuResult(granted);
    }
    return CUDA_SUCCESS;
  }
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (driver_.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr ||
      peer == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (CUresult r = driver_.cuCtxGetDevice(&me); r != CUDA_SUCCESS) return r;
  if (CUresult r = ContextDevice(driver_, peer, &owner); r != CUDA_SUCCESS) return r;
  int can = 0;
  if (CUresult r = driver_.cuDeviceCanAccessPeer(&can, me, owner); r != CUDA_SUCCESS) {
    return r;
  }
  if (can == 0) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (CUresult r = contexts_.Enable(current, peer); r != CUDA_SUCCESS) return r;
  absl::Status granted = grants_.EnablePeer(me, owner);
  if (!granted.ok()) contexts_.Disable(current, peer);
  return ToCuResult(granted);
}

CUresult PeerEnable::Disable(CUcontext peer) const {
  CUcontext current = nullptr;
  CUdevice me = 0, owner = 0;
  if (mode_ == PeerEnableMode::kDriver) {
    CUresult r = driver_.cuCtxDisablePeerAccess(peer);
    if (r != CUDA_SUCCESS) return r;
  } else {
    if (driver_.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr ||
        peer == nullptr) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult r = contexts_.Disable(current, peer);
    if (r != CUDA_SUCCESS) return r;
  }
  if (driver_.cuCtxGetDevice(&me) == CUDA_SUCCESS &&
      ContextDevice(driver_, peer, &owner) == CUDA_SUCCESS) {
    absl::Status revoked = grants_.DisablePeer(me, owner);
    if (!revoked.ok()) {
      Log().warn("revoking peer {} access to device {}: {}", me, owner, revoked.ToString());
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace vmmshim
