#include "core/ipc/ipc_handle.h"

#include <cstring>

namespace vmmshim {
namespace {

constexpr uint8_t kMagic[4] = {'V', 'M', 'S', 'H'};

template <typename T>
void Put(uint8_t* out, size_t at, T value) {
  std::memcpy(out + at, &value, sizeof value);
}

template <typename T>
T Get(const uint8_t* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof value);
  return value;
}

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace

void EncodeIpcHandle(const IpcHandleFields& fields, uint8_t* out) {
  std::memset(out, 0, kIpcHandleBytes);
  std::memcpy(out, kMagic, sizeof kMagic);
  Put<uint16_t>(out, 4, kIpcHandleVersion);
  Put<uint32_t>(out, 8, fields.pid);
  Put<uint64_t>(out, 16, fields.instance);
  std::memcpy(out + 24, fields.token.data(), fields.token.size());
  Put<uint64_t>(out, 40, fields.offset);
  Put<uint64_t>(out, 48, fields.size);
}

IpcHandleKind DecodeIpcHandle(const uint8_t* in, IpcHandleFields* fields) {
  if (std::memcmp(in, kMagic, sizeof kMagic) != 0) return IpcHandleKind::kForeign;
  if (Get<uint16_t>(in, 4) != kIpcHandleVersion || !AllZero(in + 6, 2) ||
      !AllZero(in + 12, 4) || !AllZero(in + 56, 8)) {
    return IpcHandleKind::kMalformed;
  }
  IpcHandleFields f;
  f.pid = Get<uint32_t>(in, 8);
  f.instance = Get<uint64_t>(in, 16);
  std::memcpy(f.token.data(), in + 24, f.token.size());
  f.offset = Get<uint64_t>(in, 40);
  f.size = Get<uint64_t>(in, 48);
  if (f.pid == 0 || f.instance == 0 || f.size == 0 || AllZero(f.token.data(), f.token.size()) ||
      f.offset > UINT64_MAX - f.size) {
    return IpcHandleKind::kMalformed;
  }
  *fields = f;
  return IpcHandleKind::kShim;
}

}  // namespace vmmshim
