#!/usr/bin/env bash
# How long a newcomer waits: runs the README's two commands from nothing built, in a checkout,
# and times them. Each path gets a new, empty cargo target directory and a new, empty ccache
# directory (CARGO_TARGET_DIR and CCACHE_DIR point into a new temporary directory); the Debian
# packages, the Rust toolchain and the crates already downloaded to ~/.cargo stay, so the times
# are the build's and the tests' (test.sh also runs `npm ci` for the browser test in a new
# checkout, from npm's cache when it has the packages).
#
#   benches/first-build/run.sh [--checkout DIR] PATH...
#
# PATH is one of
#   serve       ./scripts/serve.sh until the service it starts answers GET /readyz with 200
#   test        ./scripts/test.sh, to its end
#   serve-test  serve, stopped once it answers, then test in the same directories: the README's order
#
# DIR is the checkout whose scripts run (default: this one), so an older commit can be timed by
# the same method. Every path is bounded: it is stopped after FIRST_BUILD_LIMIT seconds (default
# 5400, CI's 90 minutes). Prints one line per path: the wall time, and the CPU time of the
# processes it waited for (servers that detach, such as the tests' PostgreSQL, are not counted).
# Keeps the scripts' output in the temporary directory it names. Ctrl-C stops the step under way.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd -P)
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
checkout=$here
if [ "${1:-}" = --checkout ]; then
    [ $# -ge 2 ] || usage
    checkout=$(cd "$2" && pwd -P)
    shift 2
fi
[ $# -gt 0 ] || usage
limit=${FIRST_BUILD_LIMIT:-5400}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { s = b - a; printf "%d min %02d s", s / 60, s % 60 }'; }
# Sets CPU to the CPU time (user + system) of this shell's waited-for children so far, in seconds.
# Called directly: `times` in a pipe or $(...) would run in a new shell, which has no children yet.
cpu() {
    times >"$work/times"
    CPU=$(tail -n 1 "$work/times" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); sub(/s$/, "", p[2]); n += p[1] * 60 + p[2] } print n }')
}
work=$(mktemp -d)

# The step under way: `timeout` leads a process group of its own, which a Ctrl-C at the terminal
# does not reach, so the whole group is stopped here when this script stops or is interrupted.
step=
stop_step() {
    [ -n "$step" ] || return 0
    kill -TERM -- "-$step" 2>/dev/null || true
    wait "$step" 2>/dev/null || true
    step=
}
trap 'stop_step; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Starts serve.sh and waits (within the limit) until the service is ready; stops it.
run_serve() {
    local dir=$1 log=$2 port deadline
    port=$(free_port)
    (cd "$checkout" && exec timeout "$limit" ./scripts/serve.sh --listen "127.0.0.1:$port" \
        --data-dir "$dir/data") >"$log" 2>&1 &
    step=$!
    deadline=$(($(date +%s) + limit))
    until curl -fs -o /dev/null "http://127.0.0.1:$port/readyz"; do
        if ! kill -0 "$step" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
            stop_step
            echo "serve.sh stopped or ran out of time before the service answered; see $log" >&2
            return 1
        fi
        sleep 0.2
    done
    stop_step
}

run_test() {
    local log=$1 status=0
    (cd "$checkout" && exec timeout "$limit" ./scripts/test.sh) >"$log" 2>&1 &
    step=$!
    wait "$step" || status=$?
    step=
    if [ "$status" -ne 0 ]; then
        echo "test.sh failed or ran out of time; see $log" >&2
        return 1
    fi
}

for path in "$@"; do
    dir=$(mktemp -d "/tmp/recast-first-build.$path.XXXXXX")
    export CARGO_TARGET_DIR=$dir/target CCACHE_DIR=$dir/ccache
    cpu
    start=$(now) cpu_start=$CPU
    case $path in
        serve) run_serve "$dir" "$dir/serve.log" ;;
        test) run_test "$dir/test.log" ;;
        serve-test)
            run_serve "$dir" "$dir/serve.log"
            middle=$(now)
            printf '%s: serve.sh answered after %s\n' "$path" "$(elapsed "$start" "$middle")"
            run_test "$dir/test.log"
            ;;
        *) echo "unknown path $path (serve, test or serve-test)" >&2; exit 2 ;;
    esac
    end=$(now)
    cpu
    printf '%s: %s wall, %.0f min CPU, checkout %s at %s; output in %s\n' "$path" \
        "$(elapsed "$start" "$end")" "$(awk -v a="$cpu_start" -v b="$CPU" 'BEGIN { print (b - a) / 60 }')" \
        "$checkout" "$(git -C "$checkout" rev-parse --short HEAD)" "$dir"
done
