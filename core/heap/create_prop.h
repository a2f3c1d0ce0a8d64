// What one heap arena asks cuMemCreate for, and what became of a request for
// generic compression (guide section 4.16.5.2; AllocatorOptions::compression
// in core/heap/allocator_options.h). The driver may refuse compressible
// memory outright, or make it and not compress it: the first compressible
// handle is checked with cuMemGetAllocationPropertiesFromHandle, and after a
// refusal or a handle without compression, later memory is asked for
// without it (and the log says why, once).
//
// Thread safety: none of its own; the arena's mutex guards it. The arena
// copies prop() before calling cuMemCreate without its mutex.
#ifndef VMMSHIM_CORE_HEAP_CREATE_PROP_H_
#define VMMSHIM_CORE_HEAP_CREATE_PROP_H_

#include <cuda.h>

#include "absl/status/status.h"
#include "core/driver/driver_api.h"
#include "core/heap/types.h"

namespace vmmshim {

class CreateProp {
 public:
  // `state`: kOff (not asked), kUnsupported (asked, the device cannot), or
  // the request stands until checked (kGranted or kNotGranted later).
  CreateProp(int device, const CUmemAllocationProp& prop, CompressionState state)
      : device_(device), prop_(prop), state_(state) {}

  const CUmemAllocationProp& prop() const { return prop_; }
  CompressionState state() const { return state_; }

  // cuMemCreate with `asked` failed with `failure`: true when it asked for
  // compressible memory and failed for a reason other than memory running
  // out; compression is then dropped for good and a retry with prop() may
  // succeed.
  bool DropCompressionAfter(const CUmemAllocationProp& asked, const absl::Status& failure);
  // `handle` was made with `asked`: the first compressible one is checked;
  // compression not granted is dropped for later memory.
  void CheckMade(const DriverApi& driver, const CUmemAllocationProp& asked,
                 CUmemGenericAllocationHandle handle);

 private:
  const int device_;
  CUmemAllocationProp prop_;
  CompressionState state_;
  bool checked_ = false;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_CREATE_PROP_H_
