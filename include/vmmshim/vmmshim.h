/* vmmshim's public C API: explicit per-allocation peer access and allocation
 * tags, for programs running under LD_PRELOAD=libvmmshim.so.
 *
 * Find the functions at run time, so that the program runs unchanged without
 * the shim (then the lookup returns NULL and there is nothing to control):
 *
 *   #include <dlfcn.h>
 *   #include <vmmshim/vmmshim.h>
 *   vmmshim_grant_peer_access_fn grant =
 *       (vmmshim_grant_peer_access_fn)dlsym(RTLD_DEFAULT, "vmmshim_grant_peer_access");
 *   if (grant != NULL) grant(ptr, 1);
 *
 * Return values are CUresult codes (0 = CUDA_SUCCESS):
 *   1   CUDA_ERROR_INVALID_VALUE: `ptr` is not inside memory the shim
 *       allocated (e.g. stream-ordered pools), a NULL out-pointer, or a tag
 *       longer than 255 bytes;
 *   101 CUDA_ERROR_INVALID_DEVICE: no such device;
 *   217 CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: cuDeviceCanAccessPeer says the
 *       peer cannot reach the owner;
 *   800 CUDA_ERROR_NOT_PERMITTED: `ptr` is a small allocation packed into a
 *       2 MiB granule shared with other untagged allocations; granting it
 *       would grant them too (docs/peer-access.md, "The granule rule");
 *   801 CUDA_ERROR_NOT_SUPPORTED: the shim is loaded but disabled
 *       (VMMSHIM_ENABLE=0; vmmshim_set_allocation_tag still returns 0, and the
 *       tag is ignored);
 *   or the driver's error from cuMemSetAccess.
 * Granting or revoking the owner device itself is a no-op that returns 0.
 *
 * Semantics: explicit calls override the policy (VMMSHIM_PEER_POLICY) for
 * the allocation containing `ptr` (any interior pointer names it), whether or
 * not the peer called cuCtxEnablePeerAccess, until the allocation is freed.
 * For a large allocation (one physical handle) exactly that allocation is
 * affected; for a packed one, its whole granule. Thread safety: all functions
 * may be called from any thread. All sizes are bytes.
 */
#ifndef VMMSHIM_VMMSHIM_H_
#define VMMSHIM_VMMSHIM_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Lets `peer_device` read and write the allocation containing `ptr`. */
int vmmshim_grant_peer_access(const void* ptr, int peer_device);
/* Removes `peer_device`'s access to it, whatever the policy says. */
int vmmshim_revoke_peer_access(const void* ptr, int peer_device);
/* Sets *has_access to 1 when `peer_device` can access it now, else 0. */
int vmmshim_query_peer_access(const void* ptr, int peer_device, int* has_access);
/* Tags the calling thread's following allocations with `tag` (at most 255
 * bytes; copied; "": untagged; NULL: back to the process's default tag,
 * untagged unless vmmshim_set_default_allocation_tag set one). Rules files
 * match tags, and packed allocations share granules only with allocations
 * of the same tag. */
int vmmshim_set_allocation_tag(const char* tag);
/* The tag of every thread that has not set its own (NULL: untagged; at
 * most 255 bytes, else 1, CUDA_ERROR_INVALID_VALUE; copied): a process that
 * is to pause everything it allocates from its start, as torch_memory_saver's
 * TMS_INIT_ENABLE, sets it before its first allocation. */
int vmmshim_set_default_allocation_tag(const char* tag);

/* Releases the memory the shim keeps mapped for reuse after frees (its
 * cache) on `device`, or on every device when `device` is -1, back to the
 * driver. *released_bytes (may be NULL) receives the bytes released. The
 * shim also does this by itself before reporting out of memory. */
int vmmshim_release_cached_memory(int device, size_t* released_bytes);

/* Pause and resume (docs/pause-resume.md): releases the physical memory of
 * the allocations made under `tag` (vmmshim_set_allocation_tag; NULL: every
 * allocation the shim serves), keeping their addresses: the program's GPU
 * work is quiesced first (unless VMMSHIM_PAUSE_SOLE_SUBMITTER: the other
 * threads' launches, copies and other work submissions wait, the calls
 * already inside the driver return, every active context is synchronized;
 * docs/pause-resume.md, "Quiescing"), the owning contexts are synchronized, with VMMSHIM_PAUSE_KEEP_CONTENTS the contents are copied
 * to host memory, then the memory is unmapped and released. An access to
 * paused memory faults; cudaFree of it works (its contents are dropped).
 * The tag's cached (freed) memory is released too. *released_bytes (may be
 * NULL) receives the physical bytes released: 0 for an unknown tag or
 * memory paused already (and the call returns 0). Returns:
 *   1   CUDA_ERROR_INVALID_VALUE: unknown flags, a tag over 255 bytes;
 *   2   CUDA_ERROR_OUT_OF_MEMORY: host memory for the contents is short
 *       (logged with the bytes needed and available); nothing paused;
 *   800 CUDA_ERROR_NOT_PERMITTED: selected memory is exported to another
 *       process (cudaIpcGetMemHandle; logged); nothing paused;
 *   801 CUDA_ERROR_NOT_SUPPORTED: the shim is disabled;
 *   or a driver error of the synchronize or the copy (nothing paused).
 * All or nothing across devices: contents are copied everywhere before any
 * memory is released (a later cuMemUnmap refusal leaves that block live and
 * returns the driver's code). "" selects the untagged allocations.
 * A pause of every allocation (NULL) keeps the other threads' work waiting
 * until the resume of every allocation (vmmshim_resume_memory(NULL, ...)),
 * since any of it could touch the paused memory; the calling thread's own
 * work passes. A pause of tags lets it go on once the pause is done.
 * Quiesce errors, nothing paused, the program's work going on:
 *   909 CUDA_ERROR_TIMEOUT: a call stayed inside the driver, or a context's
 *       work did not finish, within VMMSHIM_QUIESCE_TIMEOUT (logged, naming
 *       the thread and entry point, or the device).
 * Stream-ordered (cudaMallocAsync from a device's default pool) memory is
 * paused like cudaMalloc memory, by the tag set on the thread that called
 * cudaMallocAsync; its freed blocks waiting for reuse are released (their
 * streams' contexts synchronized first). Pausing paused memory releases 0
 * bytes and returns 0. During a stream capture: 900
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), the capture untouched. Sizes are
 * bytes. */
#define VMMSHIM_PAUSE_KEEP_CONTENTS 1u
/* With KEEP_CONTENTS: the host copy is page-locked (cuMemHostRegister):
 * copied at the copy engine's speed and, kept across resumes
 * (vmmshim_resume_memory_retaining_contents), pinned once. Pinning new host
 * memory is slower than the pageable path (2.2-2.5 vs about 14 GiB/s on an
 * H200), so it pays off for a copy that is kept. A refused pinning (a
 * memlock limit) leaves the copy pageable, logged; the pause goes on. */
#define VMMSHIM_PAUSE_PAGE_LOCKED 2u
/* With KEEP_CONTENTS: each block's copy is a file of its own in the
 * directory of vmmshim_set_backup_directory (written out and dropped from
 * the page cache: the contents hold disk, not host memory; read back at
 * resume; removed when no longer needed). Without a directory: 1
 * (CUDA_ERROR_INVALID_VALUE), nothing paused; a file that cannot be made:
 * 1, logged with the path and the system's reason, nothing paused. */
#define VMMSHIM_PAUSE_TO_DISK 4u
/* The caller is the only thread that submits GPU work now (a training
 * loop's own pause and resume): no quiesce, no thread held, nothing added to
 * the pause's cost. Another thread's launch on the paused memory then
 * faults, as it would without the shim's gate. */
#define VMMSHIM_PAUSE_SOLE_SUBMITTER 8u
int vmmshim_pause_memory(const char* tag, unsigned flags, size_t* released_bytes);
/* The same for every allocation whose tag is not one of the `count` tags of
 * `keep_tags` ("" keeps the untagged ones; count 0: every allocation, as
 * vmmshim_pause_memory(NULL, ...)). 1 (CUDA_ERROR_INVALID_VALUE) when
 * `keep_tags` is NULL with count > 0, or a tag in it is NULL or over 255
 * bytes; otherwise the codes of vmmshim_pause_memory. A resume of NULL
 * brings it all back. */
int vmmshim_pause_memory_except(const char* const* keep_tags, size_t count, unsigned flags,
                                size_t* released_bytes);
/* Maps new physical memory at the paused addresses of `tag` (NULL: all),
 * with the access each allocation would have had never paused (its owner,
 * and the peers the policy or explicit grants allow among those that
 * enabled access, also meanwhile), and copies kept contents back.
 * *restored_bytes (may be NULL): the bytes mapped again (0: nothing
 * paused). CUDA_ERROR_OUT_OF_MEMORY (2) when the device cannot hold it
 * after releasing the shim's cache: everything stays paused, nothing
 * leaks, a later resume can succeed. A resume of NULL that succeeds lets
 * the threads a pause of every allocation held go on. */
int vmmshim_resume_memory(const char* tag, size_t* restored_bytes);
/* The same, and the resumed allocations keep their host copy (readable with
 * vmmshim_get_paused_contents, at the same address) until a later pause
 * with contents writes it again in place, a resume without retaining drops
 * it, or the allocation is freed; as torch_memory_saver's
 * retain_cpu_backup. Other libraries' VMM memory drops its copy. */
int vmmshim_resume_memory_retaining_contents(const char* tag, size_t* restored_bytes);
/* Deep sleep (docs/deep-sleep.md): gives this process's whole GPU back, by
 * running `vmmshim sleep PID` on itself (the command next to this library;
 * the driver's checkpoint calls are for an external controller): everything
 * the shim holds is paused (the `count` tags of `drop_tags` without their
 * contents), then the driver checkpoints the rest, context included. After
 * it the process's CUDA calls block until vmmshim_wake (from another thread,
 * or `vmmshim wake PID` from outside). Returns 0; 1 (INVALID_VALUE) for a
 * NULL `drop_tags` with count > 0 or a tag that is NULL or over 255 bytes;
 * 801 when the shim is disabled or the command is missing; 304
 * (OPERATING_SYSTEM) when it cannot be started; 401 (ILLEGAL_STATE) when the
 * sleep was refused or failed: the command's reason is on stderr, and
 * nothing is left half asleep. */
int vmmshim_sleep(const char* const* drop_tags, size_t count);
/* Restores, unlocks and resumes this process (`vmmshim wake PID`); codes as
 * vmmshim_sleep's, 401 when it is not asleep or the wake failed. */
int vmmshim_wake(void);
/* The directory of VMMSHIM_PAUSE_TO_DISK's files (NULL: none). 1
 * (CUDA_ERROR_INVALID_VALUE), logged, when it is not a directory this
 * process can write to. */
int vmmshim_set_backup_directory(const char* path);
/* The memory margin, as torch_memory_saver's memory_margin_bytes: from now
 * on an allocation made under a tag (vmmshim_set_allocation_tag) that needs
 * new physical memory fails with CUDA_ERROR_OUT_OF_MEMORY (cudaMalloc:
 * cudaErrorMemoryAllocation) when less than `bytes` of the device's memory
 * (cuMemGetInfo) would stay free after it; a line at log level info says
 * so. 0, the default, turns it off. Untagged allocations and those the
 * shim's cache serves are not checked. 801 when the shim is disabled. */
int vmmshim_set_memory_margin(size_t bytes);
/* The contents of a paused allocation, as kept in host memory by a pause
 * with VMMSHIM_PAUSE_KEEP_CONTENTS (or retained across a resume): *host
 * receives the host address that holds the `bytes` bytes from `ptr`
 * (inside one allocation the shim serves), readable (not writable) until
 * the allocation is resumed (without retaining) or freed; after that the
 * address may hold another allocation's paused contents or be unmapped.
 * Nothing is copied: it is the shim's own backup (with
 * VMMSHIM_PAUSED_ACCESS=host, the memory kernels read and write while
 * paused). *host is NULL on
 * failure. Returns 1 (CUDA_ERROR_INVALID_VALUE) for a NULL `host`, a `ptr`
 * the shim does not serve or a range past the allocation's end; 500
 * (CUDA_ERROR_NOT_FOUND) when the allocation is not paused, or was paused
 * without its contents; 801 when the shim is disabled. Other libraries' own
 * VMM memory (docs/pause-resume.md) is not reached here. */
int vmmshim_get_paused_contents(const void* ptr, size_t bytes, const void** host);
/* The statistics of VMMSHIM_STATS_FILE (a JSON document, docs/configuration.md)
 * now, NUL-terminated, into `buffer` of `size` bytes. *needed (may be NULL)
 * receives the bytes it takes, NUL included; `buffer` NULL only asks for
 * that. CUDA_ERROR_INVALID_VALUE (1) when `size` is too small (nothing
 * written); 801 when the shim is disabled. */
int vmmshim_get_statistics(char* buffer, size_t size, size_t* needed);
/* What the process holds on each device now, by category (docs/pause-resume.md,
 * "What is left"; a JSON document, NUL-terminated, in the buffer contract of
 * vmmshim_get_statistics): the device's used memory (cuMemGetInfo in its
 * primary context, when active), the shim's memory by tag (resident and
 * paused), its cache, allocations passed through to the driver, graph
 * memory, the driver's part of the default pool, and the rest
 * (unattributed: the context, modules, pools the program made, other
 * libraries' own VMM memory). Bytes throughout. 801 when the shim is
 * disabled. */
int vmmshim_get_residency(char* buffer, size_t size, size_t* needed);
/* Starts (`enabled` 1) or stops (0) recording the memory history: every
 * allocation, free, mapping, release, pause, resume and peer decision of
 * the shim's memory, with its caller library, for vmmshim_write_snapshot
 * (docs/memory-snapshots.md). `max_entries`: events kept at most (0: one
 * million; the oldest are dropped beyond); `stack_frames`: call-stack
 * frames per allocation and free, 0 to 64 (0: none; an unwind per call).
 * Stopping keeps what was recorded. VMMSHIM_SNAPSHOT_FILE starts it at
 * start-up. Returns 1 (CUDA_ERROR_INVALID_VALUE) for `stack_frames` out of
 * range; 801 when the shim is disabled. */
int vmmshim_record_memory_history(int enabled, size_t max_entries, int stack_frames);
/* Writes a memory snapshot to `path`: PyTorch's memory_viz format (a
 * pickle; python -m torch.cuda._memory_viz trace_plot PATH -o out.html),
 * with every block the shim holds and its allocations, their tags and
 * caller libraries, and the recorded history. Written to a file beside
 * `path` and renamed, so a failure leaves no partial file. Returns 1 for a
 * NULL or empty path; 304 (CUDA_ERROR_OPERATING_SYSTEM) when the file
 * cannot be written (a warning in the log names the path and the reason);
 * 801 when the shim is disabled. */
int vmmshim_write_snapshot(const char* path);
typedef int (*vmmshim_get_statistics_fn)(char*, size_t, size_t*);
typedef int (*vmmshim_get_paused_contents_fn)(const void*, size_t, const void**);
typedef int (*vmmshim_pause_memory_fn)(const char*, unsigned, size_t*);
typedef int (*vmmshim_pause_memory_except_fn)(const char* const*, size_t, unsigned, size_t*);
typedef int (*vmmshim_get_residency_fn)(char*, size_t, size_t*);
typedef int (*vmmshim_record_memory_history_fn)(int, size_t, int);
typedef int (*vmmshim_write_snapshot_fn)(const char*);
typedef int (*vmmshim_resume_memory_fn)(const char*, size_t*);
typedef int (*vmmshim_grant_peer_access_fn)(const void*, int);
typedef int (*vmmshim_revoke_peer_access_fn)(const void*, int);
typedef int (*vmmshim_query_peer_access_fn)(const void*, int, int*);
typedef int (*vmmshim_set_allocation_tag_fn)(const char*);
typedef int (*vmmshim_release_cached_memory_fn)(int, size_t*);

#ifdef __cplusplus
}
#endif

#endif /* VMMSHIM_VMMSHIM_H_ */
