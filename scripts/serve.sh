#!/usr/bin/env bash
# Builds recast and runs `recast serve` from the repository root (data in ./recast-data).
# Arguments are passed on, e.g. `./scripts/serve.sh --listen 127.0.0.1:9090`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
use_this_checkout
ensure_packages "${BUILD_PACKAGES[@]}"
use_ccache
announce_rocksdb release
cargo build --release --locked --bin recast
exec "$CARGO_TARGET_DIR/release/recast" serve "$@"
