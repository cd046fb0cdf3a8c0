#!/usr/bin/env bash
# Runs every test: unit, integration, doc and loom.
# Redis tests use $KEYRATE_REDIS_URL (see README); without it, and outside
# CI, they are skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test (all features)"
cargo test --all-features

if [ -f loom_tests/main.rs ]; then
  echo "== loom model checks"
  RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
    CARGO_TARGET_DIR=target/loom \
    cargo test --release --test loom
fi
