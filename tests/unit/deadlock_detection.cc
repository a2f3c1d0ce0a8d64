// Abseil's lock-order (deadlock) detector for every unit test: the abseil
// build has NDEBUG (tools/build/build-abseil.sh), where it is off by default, and
// the shim turns it off in production (interpose/runtime.cc) because it
// serializes every Lock behind one global lock. In the tests it aborts on a
// lock-order cycle (docs/architecture.md, thread safety).
#include "absl/synchronization/mutex.h"

namespace {

const bool kDeadlockDetection = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  return true;
}();

}  // namespace
