#include "core/thread_slot.h"

#include <array>
#include <atomic>

namespace vmmshim {
namespace {

std::array<std::atomic<int>, kThreadSlots> g_slot_users{};
std::atomic<int> g_overflow{0};

struct SlotHold {
  int slot = -1;
  ~SlotHold() {
    if (slot >= 0) g_slot_users[slot].fetch_sub(1, std::memory_order_acq_rel);
  }
};
thread_local SlotHold t_slot;

}  // namespace

int ThreadSlot() {
  if (t_slot.slot >= 0) return t_slot.slot;
  for (int s = 0; s < kThreadSlots; ++s) {
    int free = 0;
    if (g_slot_users[s].load(std::memory_order_relaxed) == 0 &&
        g_slot_users[s].compare_exchange_strong(free, 1, std::memory_order_acq_rel)) {
      return t_slot.slot = s;
    }
  }
  const int s = g_overflow.fetch_add(1, std::memory_order_relaxed) % kThreadSlots;
  g_slot_users[s].fetch_add(1, std::memory_order_acq_rel);
  return t_slot.slot = s;
}

bool ThreadSlotHeld(int slot) {
  return g_slot_users[slot].load(std::memory_order_acquire) > 0;
}

}  // namespace vmmshim
