// libFuzzer target: the decoder of vmmshim's CUipcMemHandle (core/ipc/ipc_handle.h),
// which reads bytes another process handed over. Any 64 bytes decode without
// crashing; a handle decoded as kShim encodes back to exactly the same bytes
// (so no two handles name one export), and carries the fields a valid one
// must have.
#include <cstdint>
#include <cstring>

#include "core/ipc/ipc_handle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t handle[vmmshim::kIpcHandleBytes] = {};
  std::memcpy(handle, data, size < sizeof handle ? size : sizeof handle);
  vmmshim::IpcHandleFields fields;
  if (vmmshim::DecodeIpcHandle(handle, &fields) != vmmshim::IpcHandleKind::kShim) return 0;
  uint8_t again[vmmshim::kIpcHandleBytes];
  vmmshim::EncodeIpcHandle(fields, again);
  if (std::memcmp(handle, again, sizeof handle) != 0) __builtin_trap();
  if (fields.pid == 0 || fields.instance == 0 || fields.size == 0 ||
      fields.offset + fields.size < fields.offset) {
    __builtin_trap();
  }
  return 0;
}
