#!/usr/bin/env bash
# Where a route call's CPU goes in the whole process, kernel included: recast serves the recipe
# route of run.sh (an nginx upstream on loopback) while wrk calls it for LOAD_DURATION, twice:
# once under `strace -c` (the system calls per call, by name), once under `perf record` (the
# process's time by function, user and kernel, `perf report --sort dso,sym`). Prints the calls
# per second wrk saw in each run, the system calls per call and perf's top functions; the perf
# file is kept in LOAD_PROFILES when it is set. Every run is bounded by LOAD_DURATION.
#
# Settings (environment): LOAD_DURATION (default 5s), LOAD_CONNECTIONS (default 64), LOAD_PORT
# (first of two ports, default 18280), LOAD_DOCUMENT (recipe or list, default recipe),
# LOAD_PROFILES (a directory for perf.data).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-5s}
CONNECTIONS=${LOAD_CONNECTIONS:-64}
PORT=${LOAD_PORT:-18280}
DOCUMENT=${LOAD_DOCUMENT:-recipe}
PROFILES=${LOAD_PROFILES:-}
UPSTREAM_PORT=$PORT RECAST_PORT=$((PORT + 1))
case "$DOCUMENT" in
recipe) RULES=$RECIPE_RULES ;;
list) RULES=$LIST_RULES ;;
*) say "LOAD_DOCUMENT is recipe or list, not $DOCUMENT"; exit 1 ;;
esac

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" wrk curl strace linux-perf
ensure_free_ports $UPSTREAM_PORT $RECAST_PORT
use_ccache
announce_rocksdb release
cargo build --release --locked --bin recast
RECAST="$CARGO_TARGET_DIR/release/recast"
use_work_dir
[ -z "$PROFILES" ] || mkdir -p "$PROFILES"

write_recipe >"$WORK/recipe.json"
write_list >"$WORK/list.json"
start_nginx upstream "    keepalive_requests 1000000;
    server { listen 127.0.0.1:$UPSTREAM_PORT; root $WORK; default_type application/json; }"
wait_for "http://127.0.0.1:$UPSTREAM_PORT/recipe.json"

RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 RECAST_LOG=warn \
    "$RECAST" serve 2>>"$WORK/recast.log" &
RECAST_PID=$!
PIDS+=($RECAST_PID)
wait_for "http://127.0.0.1:$RECAST_PORT/readyz"
path=$(curl -sf -m 60 "http://127.0.0.1:$RECAST_PORT/v1/mapping" -H 'content-type: application/json' -d \
    '{"path":"'"$DOCUMENT"'","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"'"$DOCUMENT"'.json"},"rulesAsString":'"$RULES"'}' \
    | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p')
if [ -z "$path" ]; then
    say "recast did not register the $DOCUMENT route; its log:"; cat "$WORK/recast.log" >&2; exit 1
fi
URL="http://127.0.0.1:$RECAST_PORT$path"
# Warm the pools and the thread's scratch.
wrk -t 2 -c "$CONNECTIONS" -d 2s "$URL" >/dev/null

# Calls wrk completed in a run ($1: its output).
calls() { sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' <<<"$1"; }

echo "## $DOCUMENT route, $CONNECTIONS connections, $DURATION per run"
echo
strace -c -f -p "$RECAST_PID" -o "$WORK/strace.txt" &
STRACE=$!
sleep 1
out=$(wrk -t 2 -c "$CONNECTIONS" -d "$DURATION" "$URL")
kill -INT "$STRACE"
wait "$STRACE" 2>/dev/null || true
n=$(calls "$out")
echo "### System calls per call (strace -c, $n calls: strace slows every call)"
echo
echo "| system call | per call |"
echo "|---|---:|"
awk -v n="$n" '$1 ~ /^[0-9.]+$/ && NF >= 5 { name = $NF; count = $4; if (count ~ /^[0-9]+$/ && n > 0) printf "| %s | %.2f |\n", name, count / n }' \
    "$WORK/strace.txt" | sort -t'|' -k3 -rn | awk 'NR <= 12'
echo
perf record -F 999 -g -o "$WORK/perf.data" -p "$RECAST_PID" 2>/dev/null &
PERF=$!
sleep 1
out=$(wrk -t 2 -c "$CONNECTIONS" -d "$DURATION" "$URL")
kill -INT "$PERF"
wait "$PERF" 2>/dev/null || true
echo "### Where the time goes (perf record -F 999 -p, $(calls "$out") calls)"
echo
echo '```'
# (awk, not head: the report is read to its end, so that pipefail does not stop the script)
perf report -i "$WORK/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' | awk 'NR <= 40'
echo '```'
echo
echo "### By part (self time, summed)"
echo
perf report -i "$WORK/perf.data" --no-children --sort sym --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' | awk '
    { share = $1; sub(/%/, "", share); sym = $0
      part = "other user space"
      if (sym ~ /\[k\]/) part = "kernel"
      else if (sym ~ /json::|simdutf8/) part = "reading the answer (index, walk)"
      else if (sym ~ /exec::|coerce/) part = "mapping (executor)"
      else if (sym ~ /upstream::|hyper|h2::|httparse/) part = "upstream exchange, HTTP parsing"
      else if (sym ~ /server::|http1::/) part = "serving the caller (lane, reply)"
      else if (sym ~ /tokio|mio|epoll/) part = "runtime"
      else if (sym ~ /mi_|malloc|free|memcpy|memmove|memset/) part = "allocation and copies"
      total[part] += share }
    END { for (p in total) printf "| %s | %.1f%% |\n", p, total[p] }' | sort -t'|' -k3 -rn
if [ -n "$PROFILES" ]; then
    cp "$WORK/perf.data" "$PROFILES/$DOCUMENT.perf.data"
    echo
    echo "perf file: $PROFILES/$DOCUMENT.perf.data (perf report -i it, with this build's binary)"
fi
