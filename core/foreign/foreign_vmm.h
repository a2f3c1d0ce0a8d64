// Other libraries' own VMM memory in this process: the physical handles
// they make with cuMemCreate (directly, or through pointers from
// cuGetProcAddress / cudaGetDriverEntryPoint: PyTorch's expandable segments,
// vLLM's CuMemAllocator, NCCL's buffers), their mappings and access, and the
// handles they import. The hooks (interpose/hooks_vmm.cc) hand each such
// call here; it is made in the driver with the caller's arguments and its
// result returned, and what succeeded is recorded, so that the residency
// report names that memory and a pause can release it
// (docs/pause-resume.md, "Other libraries' VMM memory").
//
// What counts as held: a handle on a device (CUmemAllocationProp's location
// a device; host and host-NUMA handles are not device memory) from its
// cuMemCreate until its last reference is gone: cuMemRelease as many times
// as it was created or retained (cuMemRetainAllocationHandle), and every
// mapping of it unmapped (CUDA Programming Guide 4.16: "the memory is freed
// when all references are released"). The tag is the allocation tag set on
// the thread at cuMemCreate. Imported handles (cuMemImportFromShareableHandle)
// count from their first cuMemMap, with the mapped size, as imported.
//
// Pause (PausableMemory, core/heap/pausable_memory.h): a handle made here on a device,
// of a selected tag, mapped at least once, never exported, is paused: with
// contents, the whole handle is copied to host memory (through a mapping
// that shows it whole, else through a reservation of the shim's for the
// copy: the library may map any part of it later); then each mapping is
// unmapped (the reservation, which the library owns, stays) and every
// driver reference of the handle is released. Resume makes a new
// handle with the same CUmemAllocationProp, maps it at the same addresses
// and offsets, sets the access descriptors the library last set there
// (cuMemSetAccess, per location), and copies the contents back. Left alone,
// and named in the residency report: exported handles (another process may
// map them), imported ones (another process owns them), and handles not
// mapped anywhere (their contents cannot be reached to be kept).
//
// Handle values: the library keeps the value cuMemCreate gave it. After a
// resume the driver's handle is a new one, so calls that take a handle
// (cuMemRelease, cuMemMap, cuMemExportToShareableHandle,
// cuMemGetAllocationPropertiesFromHandle) get the driver's current value for
// it, and cuMemRetainAllocationHandle answers with the library's. A resumed
// handle holds one driver reference; the library's references are counted
// here and the driver's is released with the last of them. A value the
// driver hands out that equals a value a library still holds for a paused
// or resumed handle is given to the caller as a new value (bit 63 set,
// counted down), so that no two handles share one.
//
// With VMMSHIM_PAUSED_ACCESS=host a paused handle's mappings map views
// (MapViewsLocked): its contents in host VMM memory where a mapping shows
// the whole handle from offset 0, scratch where none were kept, with the
// access the library set there; a mapping of part of a handle with kept
// contents gets none (an access faults). The resume unmaps them first, and
// a failed resume maps them again.
//
// Note [Adjacent handles share one view]: a pause that maps views of kept
// contents (BackupKind::addressable) copies a run of handles that lie side
// by side (PyTorch's expandable segments: 20 MiB handles in one
// reservation) into one host allocation of the run's size, and maps it
// over the run in one cuMemMap once the last of them is released. The
// host mappings a pause makes beside its copies cost per call as well as
// per byte: on an H100, 4 GiB of 20 MiB handles paused at 32-35 GiB/s with
// a view per handle and at 45 GiB/s with one per 240 MiB
// (bench/host_view_groups; docs/performance.md, "the expandable pause's
// host mappings"). A run: handles of one device, context and tag, each
// mapped once, whole, from offset 0, readable by its device, with the same
// access, adjacent, kViewGroupBytes at most, two or more. Each is resumed
// as any other (its part of the run's copy copied back). The library's
// cuMemUnmap of one of them while paused (PyTorch's empty_cache) leaves
// the run's view as it is: that range keeps showing host memory until the
// resume, where natively it would fault. A cuMemMap into the run's range,
// a cuMemAddressFree of it, or a cuMemSetAccess over one of them takes the
// run apart first (DissolveGroupLocked), as does a member that stays live
// at the pause: each paused member gets host memory of its own (the pool's
// kept memory of its size, else made then, else pageable memory and no
// view), its contents copied there by the CPU while the run's view still
// shows them, then the run's view goes and each maps its own. Meanwhile a
// kernel's access to them faults, and its writes during that copy may be
// lost: the library is changing that memory's mappings while it runs. With
// no host memory at all, the run stays whole with no view (faults until
// the resume). cuMemGetAddressRange of a member while paused answers with
// the run's range.
//
// While paused: cuMemUnmap of its mappings (their views unmapped) and
// cuMemRelease of its references are recorded and return CUDA_SUCCESS;
// cuMemRetainAllocationHandle of a paused address returns its value;
// cuMemSetAccess over it is recorded for resume and applied to its views;
// cuMemGetAllocationPropertiesFromHandle answers from the record; cuMemMap
// and cuMemExportToShareableHandle of it return CUDA_ERROR_ILLEGAL_STATE
// (logged: resume it first); cuMemMap of anything over a paused mapping's
// range returns CUDA_ERROR_INVALID_VALUE, as over a mapped range natively;
// cuMemSetAccess over it is checked as the driver checks descriptors. A
// cuMemUnmap whose range holds paused mappings unmaps the live mappings in
// it one by one (mappings of handles not made here are recorded too, for
// that). An import that returns a handle held already adds a reference.
// At resume, a peer's access the driver refuses now is dropped (logged).
//
// Units: bytes. Thread safety: any thread. One mutex (lock order: "other
// libraries' VMM mutex", core/sync/lock_order.h) held across the driver
// calls made for the callers, so that a pause (which holds it from its
// selection to its commit) never meets a handle half changed; the calls of
// other libraries are serialized with each other (microseconds each, slow
// calls anyway). Process exit: never destroyed.
#ifndef VMMSHIM_CORE_FOREIGN_FOREIGN_VMM_H_
#define VMMSHIM_CORE_FOREIGN_FOREIGN_VMM_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/heap/backup_copier.h"
#include "core/heap/host_mapped_pool.h"
#include "core/heap/pausable_memory.h"
#include "core/sync/mutex.h"

namespace vmmshim {

// One device's other-library VMM memory now.
struct ForeignDeviceFigures {
  int device = -1;
  std::map<std::string, uint64_t> by_tag;  // resident bytes of handles made here, by tag
  std::map<std::string, uint64_t> paused_by_tag;  // paused bytes of them, by tag
  // The bytes of paused handles' mappings that map nothing now
  // (TagResidency::paused_faulting_bytes, core/heap/types.h); a handle
  // mapped twice counts twice, so this may exceed its paused bytes.
  uint64_t paused_faulting_bytes = 0;
  uint64_t exported_bytes = 0;  // resident, exported (cuMemExportToShareableHandle)
  uint64_t unmapped_bytes = 0;  // resident, mapped nowhere
  uint64_t imported_bytes = 0;  // mapped from handles imported from another process
  uint64_t handles = 0;         // handles held (made or imported), resident or paused
  uint64_t bytes() const {
    uint64_t sum = imported_bytes;
    for (const auto& [tag, b] : by_tag) sum += b;
    return sum;
  }
};

class ForeignVmm final : public PausableMemory {
 public:
  // `driver` must outlive this.
  explicit ForeignVmm(const DriverApi& driver) : driver_(driver) {}
  ForeignVmm(const ForeignVmm&) = delete;
  ForeignVmm& operator=(const ForeignVmm&) = delete;

  // The driver calls of other libraries, with the driver's arguments and
  // results (see above for handle values and paused memory). `tag`: the
  // allocation tag set on the calling thread.
  CUresult Create(CUmemGenericAllocationHandle* handle, size_t size,
                  const CUmemAllocationProp* prop, unsigned long long flags,
                  absl::string_view tag) ABSL_LOCKS_EXCLUDED(mu_);
  CUresult Release(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  CUresult Retain(CUmemGenericAllocationHandle* handle, void* addr) ABSL_LOCKS_EXCLUDED(mu_);
  CUresult Map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
               unsigned long long flags) ABSL_LOCKS_EXCLUDED(mu_);
  CUresult Unmap(CUdeviceptr ptr, size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  CUresult SetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count)
      ABSL_LOCKS_EXCLUDED(mu_);
  CUresult GetProperties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle)
      ABSL_LOCKS_EXCLUDED(mu_);
  CUresult Export(void* shareable, CUmemGenericAllocationHandle handle,
                  CUmemAllocationHandleType type, unsigned long long flags)
      ABSL_LOCKS_EXCLUDED(mu_);
  CUresult Import(CUmemGenericAllocationHandle* handle, void* os_handle,
                  CUmemAllocationHandleType type) ABSL_LOCKS_EXCLUDED(mu_);
  // Reservations are recorded only so that a run of Note [Adjacent handles
  // share one view] never crosses from one into another (the driver maps
  // within one reservation).
  CUresult Reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                   unsigned long long flags) ABSL_LOCKS_EXCLUDED(mu_);
  CUresult Free(CUdeviceptr ptr, size_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // Per device with anything held, in device order.
  std::vector<ForeignDeviceFigures> Figures() const ABSL_LOCKS_EXCLUDED(mu_);

  // PausableMemory (core/heap/pausable_memory.h). Lock/Unlock take mu_; the steps
  // require it.
  void Lock() override ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void Unlock() override ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  // mu_ is held (Lock) around these; the analysis cannot see the
  // coordinator's Lock through the interface.
  size_t PauseCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) override
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::StatusOr<size_t> PausePrepare(const TagSelection& tag, BackupCopier* copier,
                                      PauseTimes* times) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void PauseAbort(const TagSelection& tag) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // With `views`, each mapping of a paused handle maps its view
  // (MapViewsLocked).
  absl::StatusOr<size_t> PauseCommit(const TagSelection& tag, BackupCopier* copier,
                                     HostMappedPools* views,
                                     PauseTimes* times) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::StatusOr<size_t> ResumePrepare(const TagSelection& tag, BackupCopier& copier,
                                       HostMappedPools* views,
                                       PauseTimes* times) override ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Drops the host copy whatever `retain_contents` asks (PauseCoordinator::
  // Resume: other libraries' VMM memory keeps no copy across a resume).
  void ResumeCommit(const TagSelection& tag, bool retain_contents) override
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void ResumeAbort(const TagSelection& tag, HostMappedPools* views) override
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Takes mu_ handle by handle (called without Lock).
  size_t MapLateViews(HostMappedPools& views, const std::atomic<int>& waiting) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // The contexts of the paused handles whose mappings have views, and their
  // peers' active primary contexts.
  void ResumeCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) override
      ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Teardown (ShimCore::ReleaseAll): the views of paused memory are
  // unmapped and its host copies go now, while the pools they may come from
  // exist (the pause coordinator's, destroyed before this); those handles
  // stay paused, their contents lost. Host memory still mapped at a view
  // that will not unmap is forgotten, never handed to a pause.
  void DropBackups() ABSL_LOCKS_EXCLUDED(mu_);

  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS { new (&mu_) Mutex; }

 private:
  using HandleValue = CUmemGenericAllocationHandle;
  struct Handle {
    HandleValue real = 0;  // the driver's value now; 0 while paused
    size_t size = 0;       // cuMemCreate's; imported: the largest mapping seen
    CUmemAllocationProp prop = {};
    int device = -1;       // -1: not device memory (not counted, never paused)
    std::string tag;
    CUcontext context = nullptr;  // current at its cuMemCreate or first cuMemMap
    int references = 1;    // the library's: creates/imports + retains - releases
    int mappings = 0;
    bool imported = false;
    bool exported = false;
    // After a resume the driver holds one reference of `real` for all of
    // the library's (released with the last of them).
    bool one_driver_reference = false;
    bool pausing = false;  // prepared, not committed
    bool paused = false;   // released; `real` is 0 unless a resume is prepared
    bool wants_view = false;  // paused by a pause that maps views (MapViewsLocked)
    std::optional<HostBackup> backup;
    // Note [Adjacent handles share one view]: the start of the run it is
    // part of (groups_; its contents are there, `backup` empty), else 0,
    // and where in the run it lies.
    CUdeviceptr group = 0;
    size_t group_offset = 0;
  };
  // A run of Note [Adjacent handles share one view].
  struct ViewGroup {
    int device = -1;
    size_t bytes = 0;
    std::vector<HandleValue> members;  // by address, side by side from the start
    std::optional<HostBackup> backup;  // their contents, in that order
    ViewMapping view;                  // over the whole run
    HostMappedPool* pool = nullptr;    // the device's, once its view was asked for
    DeviceSet writers, readers;        // the members' access (the same for all)
    // Never shown again as a whole: a member stayed live at the pause, or
    // taking it apart found no host memory (its members fault until resumed).
    bool broken = false;
  };
  static constexpr size_t kViewGroupBytes = size_t{256} << 20;
  struct Mapping {
    size_t size = 0;
    size_t offset = 0;
    HandleValue handle = 0;  // the library's value
    // The last flags the library set here per location (cuMemSetAccess).
    std::vector<CUmemAccessDesc> access;
    ViewMapping view;  // paused with views: what the range maps meanwhile
    // Paused, but still mapped to the handle a failed resume made and
    // released (its unmap failed): unmapped again before anything else.
    bool stale = false;
  };
  using HandleMap = absl::flat_hash_map<HandleValue, Handle>;

  // The library's value for a value the driver just handed out: the same
  // unless a paused or resumed handle's value equals it.
  HandleValue NameLocked(HandleValue real) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record of the library's `value` that is paused (no driver handle
  // now), else nullptr.
  Handle* PausedLocked(HandleValue value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The driver's value now for the library's `value`.
  HandleValue RealLocked(HandleValue value) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mapping containing `ptr`, or mappings_.end().
  absl::btree_map<CUdeviceptr, Mapping>::iterator MappingAtLocked(CUdeviceptr ptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetMappingLocked(absl::btree_map<CUdeviceptr, Mapping>::iterator m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `it` once nothing references it.
  void MaybeForgetLocked(HandleMap::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SelectedLocked(const Handle& h, const TagSelection& tag) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mappings of the library's `value`, by address.
  std::vector<absl::btree_map<CUdeviceptr, Mapping>::iterator> MappingsOfLocked(
      HandleValue value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps the library's `value` (driver handle `real`) at each of its
  // mappings with their access; on failure unmaps what it mapped.
  absl::Status MapAllLocked(HandleValue value, HandleValue real)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Paused `value` (Handle::wants_view): each of its mappings without a
  // view maps one (HostMappedPool::MapView): the kept contents where the
  // mapping shows the whole handle from offset 0 and they are in host VMM
  // memory (cuMemMap takes a handle from offset 0 only), scratch where none
  // were kept, else nothing (an access faults). A failure is logged and
  // leaves that mapping without a view.
  void MapViewsLocked(HandleValue value, HostMappedPools& views)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same with `pool` (its device's; nullptr: none maps); a handle of a
  // run maps the run's view (MapGroupViewLocked).
  void MapViewsLocked(HandleValue value, HostMappedPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Peers the library let read only read the view at `at` only (a refusal
  // leaves them without access, logged).
  void GrantReadersLocked(CUdeviceptr at, size_t size, DeviceSet readers, int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Note [Adjacent handles share one view] (foreign_vmm_groups.cc).
  // Forms the runs among `chosen` (being paused, not yet marked), setting
  // their members' Handle::group; the runs' starts.
  std::vector<CUdeviceptr> FormGroupsLocked(const std::vector<HandleValue>& chosen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the run at `start` (its members' Handle::group cleared, its
  // memory given back).
  void EraseGroupLocked(CUdeviceptr start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps the run's view over it when every member is paused with a view
  // wanted, none stale, and its contents are in host VMM memory; else, or
  // when the driver refuses (logged), nothing (an access faults).
  void MapGroupViewLocked(CUdeviceptr start, HostMappedPool* pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The runs whose ranges overlap [ptr, ptr + size).
  std::vector<CUdeviceptr> GroupsOverlappingLocked(CUdeviceptr ptr, size_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps the run's view, if mapped (a failure logged and returned).
  absl::Status UnmapGroupViewLocked(CUdeviceptr start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the run at `start` apart (see the Note); when its view will not
  // unmap, the error, and it stays as it was.
  absl::Status DissolveGroupLocked(CUdeviceptr start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The start of the library's reservation that holds [at, at + size), else 0.
  CUdeviceptr ReservationOfLocked(CUdeviceptr at, size_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether paused `h`'s mapping `m` shows something now (its view, or its
  // run's).
  bool ShownLocked(const Handle& h, const Mapping& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every member of `g` is paused, wants a view and has no stale
  // mapping (what its view needs, whenever it is mapped).
  bool MembersViewableLocked(const ViewGroup& g) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The runs late views may map (MapLateViews): contents kept outside host
  // VMM memory, MembersViewableLocked.
  bool LateGroupLocked(const ViewGroup& g) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pause's release of handle `value` (its copy waited for): unmapped
  // everywhere and every driver reference released, marked paused; false
  // (left live, the error in `first`) when an unmap fails.
  bool ReleaseForPauseLocked(HandleValue value, const TagSelection& tag, PauseTimes* times,
                             bool views, absl::Status* first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties the paused mapping at `at` in the driver: its stale mapping
  // (Mapping::stale) and its view, if any; on failure what is left stays
  // recorded.
  absl::Status UnmapPausedLocked(CUdeviceptr at, Mapping& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds, once each, the context (ContextForLocked) of each handle `tag`
  // selects with a mapping that is live and pausable (`paused_views`
  // false: a pause's) or paused with a view (true: a resume's), and the
  // active primary context of each peer those mappings' access reaches (a
  // kernel there may be reading them; a peer's other contexts are not seen).
  void AddContextsLocked(const TagSelection& tag, bool paused_views,
                         std::vector<CUcontext>* contexts) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The devices whose recorded access at a mapping is exactly `flags`.
  static DeviceSet DevicesOf(const Mapping& m, CUmemAccess_flags flags);
  // Whether [ptr, ptr + size) overlaps a paused mapping.
  bool PausedOverlapLocked(CUdeviceptr ptr, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The context to synchronize and copy in for `h`: where it was made or
  // first mapped, else its device's primary context when active.
  CUcontext ContextForLocked(const Handle& h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The driver's checks of access descriptors (cuMemSetAccess), for those
  // recorded while paused: CUDA_SUCCESS or the code it would return.
  CUresult CheckAccess(const CUmemAccessDesc* desc, size_t count) const;
  // Calls fn(base, temporary) with the whole of the library's handle `value`
  // (driver handle `real`) mapped at `base`, accessible to its device:
  // through its mapping when one shows it whole with that access, else
  // (`temporary`) through a reservation of the shim's, mapped and made
  // accessible for the call and unmapped at its return (so a copy started
  // there must be complete before fn returns).
  absl::Status WithWholeHandleLocked(HandleValue value, HandleValue real,
                                     const std::function<absl::Status(CUdeviceptr, bool)>& fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back handles whose release failed at a pause or an undone resume.
  void ReleaseOrphansLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DriverApi& driver_;
  mutable Mutex mu_;  // lock order: "other libraries' VMM mutex"
  HandleMap handles_ ABSL_GUARDED_BY(mu_);  // by the library's value
  // Driver value -> the library's, where they differ.
  absl::flat_hash_map<HandleValue, HandleValue> names_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<CUdeviceptr, Mapping> mappings_ ABSL_GUARDED_BY(mu_);  // by mapped address
  absl::btree_map<CUdeviceptr, ViewGroup> groups_ ABSL_GUARDED_BY(mu_);  // by start
  // The library's reservations (Reserve): start -> size.
  absl::btree_map<CUdeviceptr, size_t> reservations_ ABSL_GUARDED_BY(mu_);
  std::vector<HandleValue> orphans_ ABSL_GUARDED_BY(mu_);  // driver handles to release
  HandleValue next_name_ ABSL_GUARDED_BY(mu_) = ~HandleValue{0};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_FOREIGN_FOREIGN_VMM_H_
