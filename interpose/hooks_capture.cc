// Stream-capture hooks: the allocator follows which captures are in
// progress (core/sync/capture.h), so that allocations and frees during one get
// the driver's codes and a free never synchronizes a capturing context.
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Runtime;

namespace {

template <typename Real, typename... Args>
CUresult BeginCapture(const Runtime* rt, Real real, bool per_thread, CUstream stream,
                      Args... args) {
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt->enabled()) return real(stream, args...);
  return rt->core->captures().BeginCapture(stream, per_thread,
                                               [&] { return real(stream, args...); });
}

template <typename Real>
CUresult EndCapture(const Runtime* rt, Real real, bool per_thread, CUstream stream,
                    CUgraph* graph) {
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(stream, graph);
  if (rt->enabled()) rt->allocator->CaptureEnded(stream, per_thread);
  return r;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCapture_v2, false, stream, mode);
}

VMMSHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCapture_v2_ptsz, true, stream, mode);
}

VMMSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph,
                                                    const CUgraphNode* deps,
                                                    const CUgraphEdgeData* edges, size_t count,
                                                    CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCaptureToGraph, false, stream, graph, deps,
                      edges, count, mode);
}

VMMSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                                         const CUgraphNode* deps,
                                                         const CUgraphEdgeData* edges,
                                                         size_t count, CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCaptureToGraph_ptsz, true, stream, graph,
                      deps, edges, count, mode);
}

VMMSHIM_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return EndCapture(rt, rt->driver.cuStreamEndCapture, false, stream, graph);
}

VMMSHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return EndCapture(rt, rt->driver.cuStreamEndCapture_ptsz, true, stream, graph);
}

