// Thread slots: small per-thread indices for state sharded by thread (heap
// arenas, core/heap/device_heap.h; the capture gate's reader counts,
// core/sync/shared_gate.h).
//
// A thread takes the lowest slot no live thread holds on its first call and
// gives it back when it exits, so a new thread (a pool's replacement
// worker, the next request's thread) takes the slot an exited thread left.
// More live threads than kThreadSlots share slots round robin. A thread
// keeps reading its slot after giving it back at exit (thread_local
// destructors that free memory then), which another thread may hold by
// then: everything sharded by slot tolerates sharing.
// Thread safety: any thread; lock-free.
#ifndef VMMSHIM_CORE_SYNC_THREAD_SLOT_H_
#define VMMSHIM_CORE_SYNC_THREAD_SLOT_H_

namespace vmmshim {

inline constexpr int kThreadSlots = 64;

// The calling thread's slot, in [0, kThreadSlots).
int ThreadSlot();
// Whether a live thread holds `slot`.
bool ThreadSlotHeld(int slot);
// In a fork()ed child, where only the forking thread exists: every slot is
// free again but that thread's.
void ResetThreadSlotsInForkChild();

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SYNC_THREAD_SLOT_H_
