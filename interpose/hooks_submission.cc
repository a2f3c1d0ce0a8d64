// The gated hooks: every entry point of core/driver/work_submission.h passes
// through the submission gate (core/sync/submission_gate.h) on its way to
// the driver, so that a quiesce (core/sleep/work_quiescer.h) can hold the
// program's new work back. Routing only: the gate and what closes it live
// in core/.
//
// Each hook is Gated<member>::Call, a function with the entry point's exact
// parameters (taken from its PFN type), reached two ways: the resolver's
// answer for the driver's function (interpose/hooks_resolver.cc, by address
// identity), and the exported symbol of the driver's name, for programs
// linked with -lcuda and for dlsym of libcuda (interpose/dlsym.cc). The
// export is a two-instruction jump to the hook through a pointer, since a
// C++ template cannot carry a C symbol name.
//
// While the gate is closed a held thread waits without holding the Python
// GIL, when it holds one: PyTorch launches with the GIL held, and the thread
// that paused needs it to resume (interpose/hooks_submission.cc, WaitAtGate).
// Host functions (cuLaunchHostFunc, cuStreamAddCallback) on a stream that is
// not capturing run inside an ExemptScope: the quiesce's synchronize waits
// for them, so their own (forbidden, but seen) CUDA calls must pass.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>

#include "absl/base/optimization.h"
#include "core/base/log.h"
#include "core/driver/work_submission.h"
#include "core/sync/submission_gate.h"
#include "interpose/hooks.h"
#include "interpose/hooks_internal.h"

using vmmshim::DriverApi;
using vmmshim::GetRuntime;
using vmmshim::Runtime;
using vmmshim::SubmissionGate;

namespace {

// Gate entry numbers: the list's order, plus one (kWorkSubmissionNames).
enum : uint32_t {
  kNoEntry = 0,
#define VMMSHIM_ENTRY_NUMBER(member, symbol, type, required) kEntry_##member,
  VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(VMMSHIM_ENTRY_NUMBER)
#undef VMMSHIM_ENTRY_NUMBER
};

// The Python C API a held thread uses to step out of the GIL, looked up
// when a thread is first held (never in dlsym or on the open path).
struct PythonApi {
  int (*is_initialized)() = nullptr;
  void* (*current_thread)() = nullptr;  // PyThreadState_GetUnchecked / _PyThreadState_UncheckedGet
  int (*gil_check)() = nullptr;
  void* (*save_thread)() = nullptr;
  void (*restore_thread)(void*) = nullptr;
};

const PythonApi& Python() {
  static const PythonApi api = [] {  // made at start: PrepareGatedHooks
    PythonApi p;
    auto find = [](const char* name) { return vmmshim::RealDlsym()(RTLD_DEFAULT, name); };
    p.is_initialized = reinterpret_cast<int (*)()>(find("Py_IsInitialized"));
    p.current_thread = reinterpret_cast<void* (*)()>(find("PyThreadState_GetUnchecked"));
    if (p.current_thread == nullptr) {
      p.current_thread = reinterpret_cast<void* (*)()>(find("_PyThreadState_UncheckedGet"));
    }
    p.gil_check = reinterpret_cast<int (*)()>(find("PyGILState_Check"));
    p.save_thread = reinterpret_cast<void* (*)()>(find("PyEval_SaveThread"));
    p.restore_thread = reinterpret_cast<void (*)(void*)>(find("PyEval_RestoreThread"));
    if (p.is_initialized == nullptr || p.current_thread == nullptr || p.gil_check == nullptr ||
        p.save_thread == nullptr || p.restore_thread == nullptr) {
      return PythonApi();
    }
    return p;
  }();
  return api;
}

// How long a held thread waits before the log says so (and again after as
// long): a program that waits for such a thread before it resumes waits for
// ever (docs/pause-resume.md, "Quiescing").
constexpr auto kHeldWarning = std::chrono::seconds(10);

// Waits while the gate is closed to this thread, without the GIL.
__attribute__((noinline)) void WaitAtGate(SubmissionGate& gate, uint32_t entry) {
  const PythonApi& py = Python();
  void* saved = nullptr;
  if (py.save_thread != nullptr && py.is_initialized() != 0 && py.current_thread() != nullptr &&
      py.gil_check() == 1) {
    saved = py.save_thread();
  }
  for (int waited = 1; !gate.WaitWhileClosed(kHeldWarning); ++waited) {
    vmmshim::Log().warn(
        "thread {} has waited {} s in {} for the resume (the program's GPU work is held while "
        "everything is paused or asleep); if the program waits for this thread before it "
        "resumes, it never will: pause with sole_submitter=True "
        "(VMMSHIM_PAUSE_SOLE_SUBMITTER) when other threads must work meanwhile",
        static_cast<long>(syscall(SYS_gettid)), waited * kHeldWarning.count(),
        vmmshim::WorkSubmissionName(entry));
  }
  if (saved != nullptr) py.restore_thread(saved);
}

// A host function's trip through the driver: run inside an ExemptScope,
// then freed (it runs once: the stream was not capturing).
struct HostCall {
  CUhostFn fn;
  CUstreamCallback callback;
  void* data;
};

void CUDA_CB RunHostFn(void* arg) {
  HostCall* call = static_cast<HostCall*>(arg);
  {
    SubmissionGate::ExemptScope exempt;
    call->fn(call->data);
  }
  delete call;
}

void CUDA_CB RunStreamCallback(CUstream stream, CUresult status, void* arg) {
  HostCall* call = static_cast<HostCall*>(arg);
  {
    SubmissionGate::ExemptScope exempt;
    call->callback(stream, status, call->data);
  }
  delete call;
}

// Whether a host function enqueued on `stream` runs exactly once: not while
// the stream is capturing (a graph may run it many times, or never).
bool RunsOnce(const Runtime& rt, CUstream stream, bool per_thread) {
  if (!rt.enabled()) return false;
  std::optional<bool> capturing = rt.core->captures().IsCapturing(stream, per_thread);
  return capturing.has_value() && !*capturing;
}

// Whether two driver-table members are the same one (members of different
// types are not comparable).
template <auto kA, auto kB>
constexpr bool SameMember() {
  if constexpr (std::is_same_v<decltype(kA), decltype(kB)>) {
    return kA == kB;
  } else {
    return false;
  }
}
template <auto kMember>
constexpr bool kHostFunction = SameMember<kMember, &DriverApi::cuLaunchHostFunc>() ||
                               SameMember<kMember, &DriverApi::cuLaunchHostFunc_ptsz>();
template <auto kMember>
constexpr bool kStreamCallback = SameMember<kMember, &DriverApi::cuStreamAddCallback>() ||
                                 SameMember<kMember, &DriverApi::cuStreamAddCallback_ptsz>();
template <auto kMember>
constexpr bool kPerThread = SameMember<kMember, &DriverApi::cuLaunchHostFunc_ptsz>() ||
                            SameMember<kMember, &DriverApi::cuStreamAddCallback_ptsz>();

template <auto kMember, uint32_t kEntry>
struct Gated;

template <typename... Args, CUresult (*DriverApi::*kMember)(Args...), uint32_t kEntry>
struct Gated<kMember, kEntry> {
  static CUresult Call(Args... args) {
    const Runtime* rt = GetRuntime();
    if (ABSL_PREDICT_FALSE(rt == nullptr)) return CUDA_ERROR_NOT_INITIALIZED;
    auto fn = rt->driver.*kMember;
    if (ABSL_PREDICT_FALSE(fn == nullptr)) return CUDA_ERROR_NOT_FOUND;
    SubmissionGate* gate = rt->gate;
    if (gate == nullptr) return fn(args...);
    SubmissionGate::Ticket ticket;
    while (ABSL_PREDICT_FALSE(!gate->TryEnter(kEntry, &ticket))) WaitAtGate(*gate, kEntry);
    CUresult r;
    if constexpr (kHostFunction<kMember> || kStreamCallback<kMember>) {
      r = SubmitHostFunction(*rt, fn, args...);
    } else {
      r = fn(args...);
    }
    gate->Exit(ticket);
    return r;
  }

  // cuLaunchHostFunc(stream, fn, data) / cuStreamAddCallback(stream, cb,
  // data, flags) with the function wrapped when it runs once.
  template <typename Fn, typename... Rest>
  static CUresult SubmitHostFunction(const Runtime& rt, Fn fn, CUstream stream, Rest... rest) {
    if constexpr (kHostFunction<kMember>) {
      auto [host_fn, data] = std::tuple<Rest...>(rest...);
      if (host_fn == nullptr || !RunsOnce(rt, stream, kPerThread<kMember>)) {
        return fn(stream, rest...);
      }
      auto* call = new HostCall{host_fn, nullptr, data};
      CUresult r = fn(stream, &RunHostFn, call);
      if (r != CUDA_SUCCESS) delete call;
      return r;
    } else {
      auto [callback, data, flags] = std::tuple<Rest...>(rest...);
      if (callback == nullptr || !RunsOnce(rt, stream, kPerThread<kMember>)) {
        return fn(stream, rest...);
      }
      auto* call = new HostCall{nullptr, callback, data};
      CUresult r = fn(stream, &RunStreamCallback, call, flags);
      if (r != CUDA_SUCCESS) delete call;
      return r;
    }
  }
};

}  // namespace

namespace vmmshim {
void PrepareGatedHooks() { Python(); }
}  // namespace vmmshim

// The hooks' pointers, which the exported jumps below go through.
#define VMMSHIM_GATED_POINTER(member, symbol, type, required)               \
  extern "C" __attribute__((visibility("hidden"), used)) const type vmmshim_gated_##member = \
      &Gated<&DriverApi::member, kEntry_##member>::Call;
VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(VMMSHIM_GATED_POINTER)
#undef VMMSHIM_GATED_POINTER

// The exports: `endbr64` (an indirect branch's landing pad where CET is on; a
// no-op elsewhere) and a jump through the pointer, arguments untouched.
#if defined(__x86_64__)
#define VMMSHIM_GATED_EXPORT(member, symbol, type, required)                  \
  __asm__(".pushsection .text\n"                                              \
          ".globl " #member "\n"                                              \
          ".type " #member ", @function\n"                                    \
          ".p2align 4\n" #member ":\n"                                        \
          "  .byte 0xf3, 0x0f, 0x1e, 0xfa\n"                                  \
          "  jmp *vmmshim_gated_" #member "(%rip)\n"                          \
          ".size " #member ", .-" #member "\n"                                \
          ".popsection\n");
#elif defined(__aarch64__)
#define VMMSHIM_GATED_EXPORT(member, symbol, type, required)                  \
  __asm__(".pushsection .text\n"                                              \
          ".globl " #member "\n"                                              \
          ".type " #member ", %function\n"                                    \
          ".p2align 4\n" #member ":\n"                                        \
          "  adrp x16, vmmshim_gated_" #member "\n"                           \
          "  ldr x16, [x16, :lo12:vmmshim_gated_" #member "]\n"               \
          "  br x16\n"                                                        \
          ".size " #member ", .-" #member "\n"                                \
          ".popsection\n");
#else
#error "the gated exports need a jump for this architecture"
#endif
VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(VMMSHIM_GATED_EXPORT)
#undef VMMSHIM_GATED_EXPORT
