#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: unit and contract tests
# on the simulated driver, end-to-end preload tests on the simulated
# libcuda.so.1, and the gpu-labelled checks, which skip with their reason
# where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
cd build
status=0
ctest --output-on-failure -j2 || status=$?
if grep -h "^SKIP:" Testing/Temporary/LastTest.log >/dev/null 2>&1; then
  echo "Skipped tests said:"
  grep -h "^SKIP:" Testing/Temporary/LastTest.log | sort | uniq -c
fi
exit $status
