// The 64-byte CUipcMemHandle that vmmshim gives for shim memory, and its
// decoder. The legacy driver IPC rejects VMM memory, so cuIpcGetMemHandle on
// a shim allocation returns one of these instead; cuIpcOpenMemHandle in
// another process recognises it by its magic and asks the exporter for the
// physical handle (core/ipc/ipc.h). Handles without the magic are the driver's
// and go to the driver unchanged.
//
// Layout (little-endian, as the hosts CUDA runs on):
//   [0, 4)   magic "VMSH"
//   [4, 6)   version (1)
//   [6, 8)   zero
//   [8, 12)  exporter's process id
//   [12, 16) zero
//   [16, 24) exporter instance: 64 random bits per exporting process (its
//            socket's name; tells a reused pid apart)
//   [24, 40) token: 128 random bits naming the exported allocation
//   [40, 48) offset of the allocation inside its physical handle, bytes
//   [48, 56) the allocation's size, bytes
//   [56, 64) zero
// Every byte the format does not use is zero, so a handle is a pure function
// of its fields. A handle with the magic whose version, zero bytes or fields
// are wrong is kMalformed: cuIpcOpenMemHandle answers it with
// CUDA_ERROR_INVALID_VALUE, never by passing it to the driver.
//
// Thread safety: pure functions.
#ifndef VMMSHIM_CORE_IPC_IPC_HANDLE_H_
#define VMMSHIM_CORE_IPC_IPC_HANDLE_H_

#include <array>
#include <cstddef>
#include <cstdint>

namespace vmmshim {

inline constexpr size_t kIpcHandleBytes = 64;  // sizeof(CUipcMemHandle)
inline constexpr uint16_t kIpcHandleVersion = 1;

struct IpcHandleFields {
  uint32_t pid = 0;
  uint64_t instance = 0;
  std::array<uint8_t, 16> token{};
  uint64_t offset = 0;
  uint64_t size = 0;
};

enum class IpcHandleKind {
  kForeign,    // no vmmshim magic: a driver handle
  kMalformed,  // vmmshim magic, but not a valid handle of this version
  kShim,       // valid: fields decoded
};

// Writes the 64 bytes of `fields` to `out`.
void EncodeIpcHandle(const IpcHandleFields& fields, uint8_t* out);

// Reads 64 bytes at `in`; fills *fields only for kShim. A valid handle has
// a non-zero pid, instance, token and size.
IpcHandleKind DecodeIpcHandle(const uint8_t* in, IpcHandleFields* fields);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_IPC_IPC_HANDLE_H_
