#!/usr/bin/env bash
# Runs recast's whole test suite: formatting, lints, every test (unit, snapshot, conformance,
# HTTP, property, fuzz corpus replay, and one pass of each benchmark), and the performance budget
# (instructions per call of a release build against benches/budget.json: scripts/budget.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
use_this_checkout
ensure_packages "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
ensure_nginx
ensure_browser
ensure_oauth_server
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
# Every process the suite starts carries this run's mark (lib.sh: suite_leftovers).
SUITE_RUN="$$-$(date +%s%N)"
export SUITE_RUN
# Every process a test starts (the binary, nginx, PostgreSQL, Node.js, Chromium, openssl,
# valgrind) is stopped by that test, also when it fails. One of those still running after a step
# is a leftover: it is named, stopped, and the suite fails. Only this run's processes are judged:
# a process the suite did not start is never touched, whenever it started.
left_behind() {
    local left
    left=$(suite_leftovers "$SUITE_RUN")
    if [ -n "$left" ]; then
        say "the $1 left these processes running (now stopped):"
        printf '%s\n' "$left" >&2
        printf '%s\n' "$left" | awk '{print $1}' | xargs -r kill -KILL 2>/dev/null || true
        return 1
    fi
}
cargo test --all-targets --locked || { left_behind tests || true; exit 1; }
cargo test --doc --locked
step "no process left behind"
left_behind tests

# Instructions per call (callgrind) of the recipe, list, expression, composed and traced calls,
# each at most 3% above benches/budget.json.
step "performance budget"
scripts/budget.sh || { left_behind "budget's counts" || true; exit 1; }
left_behind "budget's counts"
step "all tests passed"
