// Who allocated: the shared object (library or program) a device allocation
// came from, found from the return address of the driver call, as a small
// id that the heap stores with each allocation (core/heap/slab.h) and that
// the history, the snapshot and the out-of-memory report name.
//
// How, and what it costs (bench/alloc_bench --attribution measures it):
//   - The return address of the hooked driver entry point names the caller
//     when that caller links cudart statically (a plain nvcc program,
//     libcublas, libnccl, libcudnn): one lookup in a direct-mapped cache of
//     return addresses (no lock, no system call). A miss (a new call site)
//     asks dladdr() once and remembers the answer.
//   - When the return address is inside a runtime library (the shared
//     libcudart.so, libcuda.so, or vmmshim itself), the program called
//     cudaMalloc of the shared cudart (PyTorch's libc10_cuda, CuPy, JAX):
//     the thread's stack above the call is scanned for the first word that
//     is a return address into another object's code (its text segment,
//     and on x86-64 the bytes before it encode a call instruction). This is
//     the fallback unwinders use without frame pointers; it can name a
//     stale return address left on the stack, so the answer is a best
//     effort for shared cudart and exact for static cudart. The distance
//     from the hook's frame to that word depends only on the code path
//     through the runtime, which the hook's return address names: it is
//     remembered with the return address, and the next call from there
//     checks that one word first (the whole scan runs again only when it
//     does not hold a return address into another object).
//
// Names: the file name without directory and version ("libcublas.so.13"
// -> "libcublas", "/usr/bin/alloc_bench" -> "alloc_bench"); a Python
// extension module is named by its package path
// (".../site-packages/cupy_backends/cuda/api/runtime.cpython-312-x86_64-
// linux-gnu.so" -> "cupy_backends.cuda.api.runtime"; Python's own
// ".../lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so" -> "_ctypes").
// Id 0 is "unknown"
// (attribution off, or no object found).
//
// Thread safety: every method may be called from any thread at any time.
// Tables only grow; ids stay valid for the life of the process (objects are
// never forgotten, since an allocation may outlive its library's dlclose).
#ifndef VMMSHIM_CORE_HISTORY_CALLER_LIBRARY_H_
#define VMMSHIM_CORE_HISTORY_CALLER_LIBRARY_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "core/sync/mutex.h"

namespace vmmshim {

class CallerLibraries {
 public:
  static constexpr uint16_t kUnknown = 0;

  CallerLibraries();
  CallerLibraries(const CallerLibraries&) = delete;
  CallerLibraries& operator=(const CallerLibraries&) = delete;

  // The library that called the hook which `return_address` returns into;
  // `stack` is an address in the hook's own frame (the scan starts there
  // when the return address is inside a runtime library).
  uint16_t Resolve(const void* return_address, const void* stack);

  // The name of `id` ("unknown" for kUnknown or an id never handed out).
  std::string Name(uint16_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  // All names, indexed by id (0: "unknown").
  std::vector<std::string> Names() const ABSL_LOCKS_EXCLUDED(mu_);

  // The name rule of the header comment, for one path (exposed for tests).
  static std::string NameOfPath(absl::string_view path);
  // Whether `name` is a runtime library whose callers are looked for
  // further up the stack (libcudart, libcuda, libvmmshim).
  static bool IsRuntimeLibrary(absl::string_view name);

 private:
  // One loaded object's executable segment.
  struct Text {
    uintptr_t begin = 0, end = 0;
    uint16_t id = kUnknown;  // its name's id
    bool runtime = false;    // IsRuntimeLibrary
  };
  // The loaded objects' text ranges, sorted; immutable once published.
  struct TextTable {
    std::vector<Text> texts;
    uintptr_t lowest = 0, highest = 0;
    const Text* Find(uintptr_t address) const;
  };

  // A cache entry's low 16 bits: a library id (< kRuntimePath), or
  // kRuntimePath | the word offset where the last scan from this return
  // address found its caller (kNoHint: none yet).
  static constexpr uint16_t kRuntimePath = 0x8000;
  static constexpr uint16_t kNoHint = 0x7fff;
  static constexpr size_t kCacheSlots = 4096;

  uint16_t ResolveSlow(uintptr_t return_address) ABSL_LOCKS_EXCLUDED(mu_);
  // The caller above a runtime library's frames: the word `hint` words
  // above `stack` first (kNoHint: none), then every word; *found is the
  // offset of the word that named it (kNoHint: none did).
  uint16_t ScanStack(const void* stack, uint16_t hint, uint16_t* found);
  uint16_t InternLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the loaded objects again (dl_iterate_phdr) and publishes a new
  // table; the old one is kept (readers may still use it).
  void RefreshLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // (return address << 16) | id; 0 = empty. Racy writes are fine: a slot
  // holds either a whole old or a whole new value.
  std::array<std::atomic<uint64_t>, kCacheSlots> cache_{};
  std::atomic<const TextTable*> table_{nullptr};

  mutable Mutex mu_;  // a leaf (core/sync/lock_order.h: locks outside the allocator's order)
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<TextTable>> tables_ ABSL_GUARDED_BY(mu_);  // every one published
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HISTORY_CALLER_LIBRARY_H_
