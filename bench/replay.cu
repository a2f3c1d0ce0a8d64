// The cudart build of the replay benchmark.
#include "replay.cc"
