#!/usr/bin/env bash
# What traces cost a call: the recipe route (the same document and rules as run.sh) served by
# four recast processes, measured back to back under wrk on loopback, CPU per call read from
# /proc for the recast process alone:
#   off     LOAD_BEFORE, a recast binary built before traces existed (required): no trace work;
#   prop    this build without a collector: the caller's context read, ids made, `traceparent`
#           written into the upstream call, nothing recorded;
#   ratio   this build exporting to a local receiver, `parentbased_traceidratio` at 0.01;
#   on      this build exporting every span (the default sampler) to the same receiver.
# The receiver is nginx answering 200 to every `POST /v1/traces` (its CPU is not counted: it is
# the collector's). wrk sends no `traceparent`, so every call begins its own trace and the ratio
# sampler decides. LOAD_ROUNDS rounds (default 5) of LOAD_DURATION (default 5s) each, the order
# of the four turned round every round; each ratio is the median of the per-round ratios.
#
# Settings (environment): LOAD_BEFORE (required), LOAD_DURATION, LOAD_ROUNDS, LOAD_CONNECTIONS
# (default 64), LOAD_THREADS (default 2), LOAD_PORT (first of six ports, default 18380), LOAD_CSV
# (default $CARGO_TARGET_DIR/load/traces.csv).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-5s}
ROUNDS=${LOAD_ROUNDS:-5}
CONNECTIONS=${LOAD_CONNECTIONS:-64}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18380}
CSV=${LOAD_CSV:-$CARGO_TARGET_DIR/load/traces.csv}
BEFORE=${LOAD_BEFORE:-}
if [ -z "$BEFORE" ] || [ ! -x "$BEFORE" ]; then
    say "LOAD_BEFORE must name a recast binary built before traces (the 'off' column), e.g. a copy of an earlier release build"
    exit 1
fi
UPSTREAM_PORT=$PORT RECEIVER_PORT=$((PORT + 1))
ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" wrk curl
ensure_free_ports $UPSTREAM_PORT $RECEIVER_PORT $((PORT + 2)) $((PORT + 3)) $((PORT + 4)) $((PORT + 5))
use_ccache
announce_rocksdb release
cargo build --release --locked --bin recast
RECAST="$CARGO_TARGET_DIR/release/recast"

use_work_dir
write_recipe >"$WORK/recipe.json"
start_nginx nginx "    keepalive_requests 1000000;
    client_max_body_size 64m;
    server { listen 127.0.0.1:$UPSTREAM_PORT; root $WORK; default_type application/json; }
    server { listen 127.0.0.1:$RECEIVER_PORT; location = /v1/traces { return 200; } }"

NAMES=(off prop ratio on)
declare -A PID_OF PORT_OF
start() { # $1 name, $2 port, $3 binary, then environment assignments
    local name=$1 port=$2 binary=$3
    shift 3
    mkdir -p "$WORK/data-$name"
    env RECAST_LISTEN=127.0.0.1:$port RECAST_DATA_DIR="$WORK/data-$name" RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
        RECAST_LOG=warn "$@" "$binary" serve 2>>"$WORK/recast-$name.log" &
    PID_OF[$name]=$!
    PORT_OF[$name]=$port
    PIDS+=($!)
}
RECEIVER="http://127.0.0.1:$RECEIVER_PORT"
start off $((PORT + 2)) "$BEFORE"
start prop $((PORT + 3)) "$RECAST"
start ratio $((PORT + 4)) "$RECAST" OTEL_EXPORTER_OTLP_ENDPOINT="$RECEIVER" \
    OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01
start on $((PORT + 5)) "$RECAST" OTEL_EXPORTER_OTLP_ENDPOINT="$RECEIVER"
wait_for "http://127.0.0.1:$UPSTREAM_PORT/recipe.json"
for name in "${NAMES[@]}"; do
    wait_for "http://127.0.0.1:${PORT_OF[$name]}/readyz"
    # Answering is not ready: /readyz says 200 once the (no) stored routes are loaded.
    for _ in $(seq 1 200); do curl -sf -o /dev/null "http://127.0.0.1:${PORT_OF[$name]}/readyz" && break; sleep 0.05; done
done

declare -A ROUTE
for name in "${NAMES[@]}"; do
    ROUTE[$name]=$(curl -sf -m 10 "http://127.0.0.1:${PORT_OF[$name]}/v1/mapping" -H 'content-type: application/json' -d \
        '{"path":"recipe","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"recipe.json"},"rulesAsString":'"$RECIPE_RULES"'}' \
        | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p')
    if [ -z "${ROUTE[$name]}" ]; then
        say "registering the route on recast ($name) failed; its log:"; cat "$WORK/recast-$name.log" >&2; exit 1
    fi
done

HZ=$(getconf CLK_TCK)
mkdir -p "$(dirname "$CSV")"
echo "round,target,requests_per_s,p50_ms,p99_ms,errors,cpu_us_per_request" >"$CSV"
measure() { # $1 round, $2 name
    local out rps p50 p99 errors requests before after cpu
    before=$(cpu_ticks "${PID_OF[$2]}")
    out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency "http://127.0.0.1:${PORT_OF[$2]}${ROUTE[$2]}")
    after=$(cpu_ticks "${PID_OF[$2]}")
    read -r rps p50 p99 errors requests <<<"$(wrk_figures "$out")"
    cpu=$(awk -v b="$before" -v a="$after" -v n="$requests" -v hz="$HZ" 'BEGIN {
        split(b, x, " "); split(a, y, " "); t = (y[2] + y[3]) - (x[2] + x[3]); if (n < 1) n = 1
        printf "%.2f", t * 1e6 / hz / n }')
    echo "$1,$2,$rps,$p50,$p99,$errors,$cpu" >>"$CSV"
    printf '  round %s  %-6s %10s req/s  p50 %7s ms  p99 %7s ms  errors %s  CPU us/call %s\n' \
        "$1" "$2" "$rps" "$p50" "$p99" "$errors" "$cpu"
}
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION, $ROUNDS rounds; CPU of the recast process per call"
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then order="off prop ratio on"; else order="on ratio prop off"; fi
    for name in $order; do
        measure "$r" "$name"
    done
done
metrics=$(curl -sf -m 10 "http://127.0.0.1:${PORT_OF[on]}/metrics" | grep '^recast_trace_' || true)
echo
echo "the always-on process's export counts:"
echo "$metrics"
echo
echo "| tracing | CPU µs/call, median | / off, median of the rounds (lowest–highest) | requests/s, median |"
echo "|---|---:|---:|---:|"
awk -F, 'NR > 1 { cpu[$1","$2] = $7; rps[$1","$2] = $3; if ($1 > rounds) rounds = $1 }
    function median(a, k,    i, j, x) {
        for (i = 2; i <= k; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    END {
        split("off prop ratio on", names, " ")
        split("off (the build before traces)|propagation only|sampler ratio 0.01|always on, local receiver", labels, "|")
        for (n = 1; n <= 4; n++) {
            name = names[n]
            for (r = 1; r <= rounds; r++) { c[r] = cpu[r","name]; q[r] = rps[r","name]; ratio[r] = cpu[r","name] / cpu[r",off"] }
            lo = hi = ratio[1]; for (r = 2; r <= rounds; r++) { if (ratio[r] < lo) lo = ratio[r]; if (ratio[r] > hi) hi = ratio[r] }
            printf "| %s | %.2f | %.3f× (%.3f–%.3f) | %.0f |\n", labels[n], median(c, rounds), median(ratio, rounds), lo, hi, median(q, rounds)
        }
    }' "$CSV"
