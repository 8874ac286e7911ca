#!/usr/bin/env bash
# test.sh: sets up and builds hgrn (scripts/setup.sh), then runs the whole GoogleTest suite through ctest.
# GPU tests skip with a message where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
