#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: unit and contract tests
# on the simulated driver, end-to-end preload tests on the simulated
# libcuda.so.1, and the gpu-labelled checks, which skip with their reason
# where no GPU is present; then the checking builds (sanitizers, lock
# contracts).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build/build.sh
status=0
(cd build && ctest --output-on-failure -j2) || status=$?
if grep -h "^SKIP:" build/Testing/Temporary/LastTest.log >/dev/null 2>&1; then
  echo "Skipped tests said:"
  grep -h "^SKIP:" build/Testing/Temporary/LastTest.log | sort | uniq -c
fi

# Checking builds (docs/reliability.md): the unit, contract, fault-sweep and
# stress tests and the CLI's tests under AddressSanitizer +
# UndefinedBehaviorSanitizer and under ThreadSanitizer, and clang's
# thread-safety analysis of the lock annotations, as errors.
echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DVMMSHIM_SANITIZE=address,undefined \
  -DVMMSHIM_BUILD_EXAMPLES=OFF -DVMMSHIM_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$(nproc)" --target vmmshim_unit_tests vmmshim_cli_tests >/dev/null
for t in vmmshim_unit_tests vmmshim_cli_tests; do
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build-asan/tests/$t --gtest_brief=1 2>&1 | grep -vE "^\[vmmshim" || status=1
done
echo "== unit tests under ThreadSanitizer (our locks as std::shared_mutex: core/sync/mutex.h)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DVMMSHIM_SANITIZE=thread \
  -DVMMSHIM_BUILD_EXAMPLES=OFF -DVMMSHIM_BUILD_BENCH=OFF >/dev/null
cmake --build build-tsan -j"$(nproc)" --target vmmshim_unit_tests vmmshim_cli_tests >/dev/null
for t in vmmshim_unit_tests vmmshim_cli_tests; do
  TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/$t --gtest_brief=1 2>&1 \
    | grep -vE "^\[vmmshim" || status=1
done
echo "== clang -Wthread-safety (lock contracts) over libvmmshim.so"
CC=clang CXX=clang++ cmake -S . -B build-tsa -DVMMSHIM_THREAD_SAFETY_ANALYSIS=ON \
  -DVMMSHIM_BUILD_TESTS=OFF -DVMMSHIM_BUILD_EXAMPLES=OFF -DVMMSHIM_BUILD_BENCH=OFF >/dev/null
if cmake --build build-tsa -j"$(nproc)" --target vmmshim >/dev/null; then
  echo "thread-safety analysis: clean"
else
  echo "thread-safety analysis: FAILED"; status=1
fi
echo "== fuzzing the config, size and rules-file parsers and the IPC handle decoder (libFuzzer, 15 s each)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DVMMSHIM_FUZZ=ON -DVMMSHIM_SANITIZE=address,undefined \
  -DVMMSHIM_BUILD_TESTS=OFF -DVMMSHIM_BUILD_EXAMPLES=OFF -DVMMSHIM_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_rules_file fuzz_parse_bytes fuzz_config fuzz_ipc_handle >/dev/null
for pair in rules_file:rules parse_bytes:bytes config:config ipc_handle:ipc; do
  target=${pair%%:*} corpus=${pair##*:}
  work=build-fuzz/corpus-$corpus
  mkdir -p "$work" && cp tests/fuzz/corpus/$corpus/* "$work/"
  if build-fuzz/tests/fuzz/fuzz_$target -max_total_time=15 -timeout=10 "$work" \
       > "build-fuzz/fuzz_$target.log" 2>&1; then
    echo "fuzz_$target: $(grep -E '^Done' "build-fuzz/fuzz_$target.log")"
  else
    echo "fuzz_$target: FAILED (build-fuzz/fuzz_$target.log; crash input saved as crash-*)"
    tail -20 "build-fuzz/fuzz_$target.log"
    status=1
  fi
done
exit $status
