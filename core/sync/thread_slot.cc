#include "core/sync/thread_slot.h"

#include <array>
#include <atomic>

#include "core/base/tls.h"

namespace vmmshim {
namespace {

std::array<std::atomic<int>, kThreadSlots> g_slot_users{};
std::atomic<int> g_overflow{0};

// The slot itself is a plain int, valid for the thread's whole life, so
// that thread_local destructors running after the release below (an
// application's per-thread cache freeing device memory) still read a
// stable slot; only its hold is given back.
VMMSHIM_INITIAL_EXEC_TLS thread_local int t_slot = -1;
struct SlotRelease {
  bool armed = false;
  ~SlotRelease() {
    if (t_slot >= 0) g_slot_users[t_slot].fetch_sub(1, std::memory_order_acq_rel);
  }
};
thread_local SlotRelease t_release;

int Claim() {
  for (int s = 0; s < kThreadSlots; ++s) {
    int free = 0;
    if (g_slot_users[s].load(std::memory_order_relaxed) == 0 &&
        g_slot_users[s].compare_exchange_strong(free, 1, std::memory_order_acq_rel)) {
      return s;
    }
  }
  const int s = g_overflow.fetch_add(1, std::memory_order_relaxed) % kThreadSlots;
  g_slot_users[s].fetch_add(1, std::memory_order_acq_rel);
  return s;
}

}  // namespace

int ThreadSlot() {
  if (t_slot < 0) {
    t_release.armed = true;  // constructs it, so its destructor runs at thread exit
    t_slot = Claim();
  }
  return t_slot;
}

void ResetThreadSlotsInForkChild() {
  for (auto& users : g_slot_users) users.store(0, std::memory_order_relaxed);
  if (t_slot >= 0) g_slot_users[t_slot].store(1, std::memory_order_release);
}

bool ThreadSlotHeld(int slot) {
  return g_slot_users[slot].load(std::memory_order_acquire) > 0;
}

}  // namespace vmmshim
