#include "interpose/runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>

#include "core/cu_status.h"
#include "core/log.h"

namespace vmmshim {
namespace {

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

const Runtime* g_runtime_for_exit = nullptr;

void ExitReport() {
  const Runtime* rt = g_runtime_for_exit;
  if (rt == nullptr || rt->allocator == nullptr) return;
  const AllocatorStats s = rt->allocator->GetStats();
  Log().info(
      "exit report: served {} allocations ({} bytes) from VMM, {} frees, {} still live "
      "({} bytes); passed {} allocations ({} bytes) through to the driver; peak physical "
      "memory {} bytes",
      s.served_allocations, s.served_bytes, s.frees, s.live_allocations, s.live_bytes,
      s.passthrough_allocations, s.passthrough_bytes, s.peak_handle_bytes);
}

const Runtime* Initialize() {
  ParseResult parsed = ParseConfigFromEnvironment();
  absl::Status log_status =
      ConfigureLog(SpdlogLevel(parsed.config.log_level), parsed.config.log_file);
  if (!log_status.ok()) Log().warn("{}", std::string(log_status.message()));
  for (const std::string& problem : parsed.problems) Log().warn("{}", problem);

  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (libcuda == nullptr) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libcuda == nullptr) {
    const char* why = dlerror();
    Log().error("cannot open libcuda.so.1 ({}); driver calls fail", why ? why : "?");
    return nullptr;
  }
  auto* rt = new Runtime;
  rt->config = parsed.config;
  rt->driver = LoadDriverApi(libcuda, RealDlsym());
  absl::Status complete = CheckRequired(rt->driver);
  int version = 0;
  if (rt->driver.cuDriverGetVersion != nullptr) rt->driver.cuDriverGetVersion(&version);
  if (!complete.ok()) {
    Log().warn("{}; vmmshim passes every call through", std::string(complete.message()));
  } else if (!rt->config.enable) {
    Log().info("VMMSHIM_ENABLE=0: pass-through, driver {}", version);
  } else {
    rt->allocator = new Allocator(rt->driver);
    Log().info("serving device allocations from VMM (driver {}, log level {})", version,
               std::string(LogLevelName(rt->config.log_level)));
  }
  g_runtime_for_exit = rt;
  std::atexit(&ExitReport);
  return rt;
}

}  // namespace

const Runtime* GetRuntime() {
  static const Runtime* runtime = Initialize();
  return runtime;
}

DlsymFunction RealDlsym() {
  static std::atomic<DlsymFunction> real{nullptr};
  DlsymFunction fn = real.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<DlsymFunction>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (fn == nullptr) {
      fn = reinterpret_cast<DlsymFunction>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    }
    real.store(fn, std::memory_order_release);
  }
  return fn;
}

}  // namespace vmmshim
