#include "core/heap/export_registry.h"

#include <sys/random.h>

#include <new>
#include <vector>

#include "core/driver/cu_status.h"

namespace vmmshim {

absl::StatusOr<ExportToken> ExportRegistry::Register(int device, CUdeviceptr base) {
  MutexLock lock(&mu_);
  auto it = by_allocation_.find(std::make_pair(device, base));
  if (it != by_allocation_.end()) return it->second;
  ExportToken token;
  if (getrandom(token.data(), token.size(), 0) != static_cast<ssize_t>(token.size())) {
    return DriverError(CUDA_ERROR_OPERATING_SYSTEM, "getrandom");
  }
  by_allocation_[{device, base}] = token;
  by_token_[Key(token)] = {device, base};
  return token;
}

std::optional<std::pair<int, CUdeviceptr>> ExportRegistry::Lookup(
    const ExportToken& token) const {
  MutexLock lock(&mu_);
  auto it = by_token_.find(Key(token));
  if (it == by_token_.end()) return std::nullopt;
  return it->second;
}

bool ExportRegistry::IsCurrent(const ExportToken& token, int device, CUdeviceptr base) const {
  MutexLock lock(&mu_);
  auto it = by_allocation_.find(std::make_pair(device, base));
  return it != by_allocation_.end() && it->second == token;
}

void ExportRegistry::DropRange(int device, CUdeviceptr begin, CUdeviceptr end) {
  MutexLock lock(&mu_);
  std::vector<std::pair<int, CUdeviceptr>> gone;
  for (const auto& [where, token] : by_allocation_) {
    if (where.first == device && where.second >= begin && where.second < end) {
      gone.push_back(where);
    }
  }
  for (const auto& where : gone) {
    by_token_.erase(Key(by_allocation_[where]));
    by_allocation_.erase(where);
  }
}

size_t ExportRegistry::size() const {
  MutexLock lock(&mu_);
  return by_token_.size();
}

void ExportRegistry::AfterForkChild() { new (&mu_) Mutex; }

}  // namespace vmmshim
