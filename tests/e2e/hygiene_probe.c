/* Prints what a process holds that a preloaded library could add: threads,
 * open file descriptors, sockets, and whether libcuda is mapped. Run with
 * and without LD_PRELOAD=libvmmshim.so in a process that never uses CUDA:
 * the outputs must be identical. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int Count(const char* dir, int* sockets) {
  DIR* d = opendir(dir);
  int n = 0;
  struct dirent* e;
  char path[512], target[512];
  while (d != NULL && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    ++n;
    if (sockets != NULL) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      ssize_t len = readlink(path, target, sizeof target - 1);
      if (len > 0) {
        target[len] = 0;
        if (strncmp(target, "socket:", 7) == 0) ++*sockets;
      }
    }
  }
  if (d != NULL) closedir(d);
  return n;
}

int main(void) {
  int sockets = 0;
  int threads = Count("/proc/self/task", NULL);
  int fds = Count("/proc/self/fd", &sockets) - 1; /* minus the directory stream */
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[1024];
  int libcuda = 0;
  while (maps != NULL && fgets(line, sizeof line, maps) != NULL) {
    if (strstr(line, "libcuda") != NULL) libcuda = 1;
  }
  if (maps != NULL) fclose(maps);
  printf("threads %d fds %d sockets %d libcuda-mapped %d\n", threads, fds, sockets, libcuda);
  return 0;
}
