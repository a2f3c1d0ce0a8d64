// CUDA IPC for shim memory (docs/ipc.md): cuIpcGetMemHandle /
// cuIpcOpenMemHandle / cuIpcCloseMemHandle on VMM allocations, which the
// legacy driver IPC rejects.
//
// The way of the CUDA Programming Guide, section 4.16.3 ("Shareable Memory
// Allocations"): the exporter's physical handle is exported as a POSIX file
// descriptor, passed to the importing process over a Unix-domain socket
// (SCM_RIGHTS), imported there with cuMemImportFromShareableHandle,
// reserved, mapped and granted.
//
// Exporter. Export() gives the 64-byte handle of core/ipc/ipc_handle.h (the
// allocator's random token, the allocation's offset and size, the process id
// and a random instance) and, on the first export, starts one listener
// thread on a socket `<dir>/ipc-<pid>-<instance>.sock`. The listener serves
// requests concurrently (core/base/socket_server.h: at most 64 at once,
// each read within 2 s of the connect; over the bound the importer gets
// CUDA_ERROR_OPERATING_SYSTEM), so an idle client delays no other import,
// and never holds a lock of the application while it waits on a socket. It
// serves only processes of the same effective user (SO_PEERCRED), only
// tokens of live exports, and only with the offset and size they were
// exported with; anything else gets CUDA_ERROR_INVALID_VALUE and one log
// line. The socket is removed at exit; sockets of exporters that died are
// removed by the next exporter that starts.
//
// The directory (VMMSHIM_IPC_DIR, default /tmp/vmmshim-<uid>) is created
// with mode 0700; an existing one must be a real directory (not a symbolic
// link) owned by this user with no access for group or others, so that
// another user can neither create nor replace a socket in it. The importer
// also checks that the socket is served by the exporter the handle names
// (SO_PEERCRED of the listener: its own user and the handle's pid; so
// importer and exporter must share a pid namespace, as CUDA IPC's users
// run them anyway).
//
// Importer. Open() decodes the handle (a handle without vmmshim's magic is
// not ours: kForeign, the caller hands it to the driver), asks the exporter
// for a descriptor (5-second timeout), imports it, reserves VA of the
// handle's size, maps it, grants the current device and the peers the
// policy allows (MemoryControl::AccessTargets), releases the imported handle
// (the mapping keeps the memory alive) and returns the mapping plus the
// allocation's offset. As the driver does (cuIpcOpenMemHandle), opening a
// handle already open in the same context returns the same pointer and
// counts one more reference; Close() unmaps at the last one. Memory an
// importer maps lives until its last mapping goes, also when the exporter
// frees it or exits (the driver keeps physical memory of a released handle
// while it is mapped).
//
// Errors (as CUresult codes in absl::Status, core/driver/cu_status.h):
// CUDA_ERROR_INVALID_CONTEXT without a current context, and for a handle
// exported by this same process (the driver's code for that, measured on an
// H200); CUDA_ERROR_INVALID_VALUE for a malformed, guessed, stale (freed) or
// corrupted handle, an exporter that is gone or does not answer, another
// user's exporter, or flags other than CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
// otherwise the driver's code of the failing import, reserve, map or
// set-access call, after undoing the steps before it.
//
// Thread safety: all methods may be called concurrently. The listener's
// threads take only the allocator's locks (through MemoryControl::ExportFd).
// Process exit: nothing is torn down; the listener's threads are left
// blocked and end with the process.
#ifndef VMMSHIM_CORE_IPC_IPC_H_
#define VMMSHIM_CORE_IPC_IPC_H_

#include <cuda.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/sync/mutex.h"
#include "core/memory_control.h"
#include "core/driver/driver_api.h"
#include "core/driver/vmm_mapping.h"
#include "core/ipc/ipc_handle.h"

namespace vmmshim {

class Ipc {
 public:
  // `driver` and `control` must outlive this object. `dir` empty:
  // /tmp/vmmshim-<euid>.
  Ipc(const DriverApi& driver, MemoryControl& control, std::string dir);

  Ipc(const Ipc&) = delete;
  Ipc& operator=(const Ipc&) = delete;

  // The handle for the shim allocation containing `ptr` (64 bytes written to
  // `handle`). Errors: those of MemoryControl::Export; CUDA_ERROR_OPERATING_SYSTEM
  // (logged with the reason) when the socket directory or listener cannot be
  // set up.
  absl::Status Export(CUdeviceptr ptr, uint8_t* handle);

  // Opens a decoded handle (see the header comment) in the current context.
  absl::StatusOr<CUdeviceptr> Open(const IpcHandleFields& fields, unsigned int flags);

  // Closes a pointer returned by Open. Returns false when `ptr` is not an
  // open import of ours (the caller hands it to the driver).
  absl::StatusOr<bool> Close(CUdeviceptr ptr);

  // Unmaps every import opened in `context` (the context is going away).
  void ReleaseContext(CUcontext context);

  // What this process maps now of memory other processes exported (opened
  // and not yet closed): the bytes mapped (whole exported allocations) and
  // the exporters' process ids, ascending, each once. A deep sleep is
  // refused while any is open: the driver's process checkpoint cannot take
  // memory shared between processes (docs/deep-sleep.md).
  struct OpenImports {
    size_t bytes = 0;
    std::vector<uint32_t> exporters;
  };
  OpenImports open_imports() const;

  // After fork(), in the child: the listener thread does not exist there and
  // the socket is the parent's; a later export starts afresh.
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // The socket directory in use.
  const std::string& dir() const { return dir_; }

 private:
  struct Import {
    CUdeviceptr base = 0;  // the reservation and mapping
    size_t size = 0;
    CUdeviceptr ptr = 0;  // returned: base + offset
    CUcontext context = nullptr;
    int references = 0;
    uint32_t exporter_pid = 0;
  };
  using ImportKey = std::tuple<uint64_t, std::string, CUcontext>;  // instance, token, context

  absl::Status StartListenerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckDirectory();
  std::string SocketPath(uint32_t pid, uint64_t instance) const;
  void HandleRequest(int conn, const ucred& peer);
  // Asks the exporter of `fields` for a descriptor; *handle_size set.
  absl::StatusOr<int> RequestFd(const IpcHandleFields& fields, uint64_t* handle_size);
  absl::StatusOr<CUdeviceptr> MapImport(int fd, uint64_t handle_size, int device,
                                        const IpcHandleFields& fields, size_t* mapped);
  void Unmap(CUdeviceptr base, size_t size);

  const DriverApi& driver_;
  MemoryControl& control_;
  const VmmMapper mapper_;  // maps and unmaps imports
  const std::string dir_;

  mutable Mutex mu_;
  uint64_t instance_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no listener
  uint32_t listener_pid_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<ImportKey, Import> imports_ ABSL_GUARDED_BY(mu_);
  std::map<CUdeviceptr, ImportKey> by_pointer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_IPC_IPC_H_
