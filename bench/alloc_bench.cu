// The cudart build of the benchmark (nvcc compiles .cu files).
#include "alloc_bench.cc"
