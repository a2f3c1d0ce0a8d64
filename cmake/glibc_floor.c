/* The oldest glibc libvmmshim.so and bin/vmmshim run on (the wheel's
 * manylinux tag, tools/build/build-wheel.sh, reads it from the ELF files).
 *
 * The static libstdc++ of GCC 12 built on glibc 2.36 (Debian 12) refers to
 * arc4random (GLIBC_2.36) from std::random_device, which the project never
 * uses; linking against libc's definition would raise the floor from 2.35
 * (_dl_find_object of libgcc's unwinder) to 2.36 and shut out Ubuntu 22.04.
 * This definition, hidden and local to each binary, satisfies that
 * reference with getrandom (GLIBC_2.25) and fails as glibc's does: the
 * process stops when no randomness can be had. */
#include <errno.h>
#include <stdint.h>
#include <sys/random.h>
#include <unistd.h>

void abort(void);

__attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t value;
  for (;;) {
    const ssize_t n = getrandom(&value, sizeof value, 0);
    if (n == (ssize_t)sizeof value) return value;
    if (n < 0 && errno != EINTR) {
      static const char kMessage[] = "vmmshim: getrandom failed in arc4random\n";
      (void)!write(2, kMessage, sizeof kMessage - 1);
      abort();
    }
  }
}
