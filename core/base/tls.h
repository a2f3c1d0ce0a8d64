// Thread-local variables on the cache-hit path use the initial-exec TLS
// model: an access is one %fs-relative load instead of a call to
// __tls_get_addr, which the default model of a shared object makes on every
// access. libvmmshim.so is loaded at process start (LD_PRELOAD), where static
// TLS is allocated for it; a dlopen of it later takes glibc's static TLS
// surplus (512 bytes by default, glibc.rtld.optional_static_tls), which the
// few small variables marked with this fit.
#ifndef VMMSHIM_CORE_BASE_TLS_H_
#define VMMSHIM_CORE_BASE_TLS_H_

#define VMMSHIM_INITIAL_EXEC_TLS __attribute__((tls_model("initial-exec")))

#endif  // VMMSHIM_CORE_BASE_TLS_H_
