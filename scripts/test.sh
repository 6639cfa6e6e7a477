#!/usr/bin/env bash
# Runs recast's whole test suite: formatting, lints, and every test (unit, snapshot, conformance,
# HTTP, property, fuzz corpus replay, and one pass of each benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
use_this_checkout
ensure_packages "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
ensure_nginx
ensure_browser
use_ccache

# Tests build their own configuration; RECAST_* settings of the calling shell must not leak in.
for name in $(compgen -v RECAST_ || true); do unset "$name"; done

# The contract and its conformance cases are copies; when the originals are beside the clone,
# the copies must match them.
for pair in ../shared/SPEC.md:docs/SPEC.md ../shared/conformance/cases.json:tests/data/conformance.json; do
    original=${pair%%:*} copy=${pair#*:}
    if [ -f "$original" ] && ! cmp -s "$original" "$copy"; then
        say "$copy differs from $original: copy it over and run again"
        exit 1
    fi
done

step() { printf '\n== %s\n' "$*" >&2; }
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
announce_rocksdb debug
cargo clippy --all-targets --locked -- -D warnings
step "cargo test"
cargo test --all-targets --locked
cargo test --doc --locked
step "all tests passed"
