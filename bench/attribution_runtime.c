/* A stand-in for the shared libcudart for bench/attribution_bench.cc (built as
 * libcudart.so.97): runtime_call(fn) calls fn from a frame of its own, as
 * cudaMalloc calls the driver, so that the caller attribution in fn must look
 * past this library, up the stack. */
__attribute__((noinline, visibility("default"))) unsigned runtime_call(unsigned (*fn)(void)) {
  volatile char frame[96] = {0};
  unsigned r = fn();
  return r + frame[0];
}
