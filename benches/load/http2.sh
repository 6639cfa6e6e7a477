#!/usr/bin/env bash
# Load on loopback: HTTP/2 to an upstream against HTTP/1.1 to the same upstream. nginx serves one
# JSON document over HTTPS twice, on one port offering HTTP/2 (`listen ... ssl http2`) and on one
# speaking HTTP/1.1 only, with a certificate of a CA this script makes with openssl. Two recast
# routes trust that CA (`"tls": {"ca": ...}`), one per port. For each number of concurrent callers,
# wrk drives each route in turn; the script prints calls per second, p99, recast's CPU time per
# call (user+system, from /proc) and the connections recast held to the upstream (counted by ss
# in the middle of the run).
#
# Settings (environment): LOAD_DURATION (default 8s), LOAD_CONCURRENCY (default "16 64 256"),
# LOAD_THREADS (default 2), LOAD_PORT (first of three ports, default 18280).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-8s}
CONCURRENCY=${LOAD_CONCURRENCY:-16 64 256}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18280}
H2_PORT=$PORT H1_PORT=$((PORT + 1)) RECAST_PORT=$((PORT + 2))

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" wrk curl python3 openssl iproute2
ensure_free_ports $H2_PORT $H1_PORT $RECAST_PORT
release_build

use_work_dir

# A CA and the server's certificate for 127.0.0.1.
write_server_certificate "$WORK"
echo '{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken","strArea":"Japanese"}]}' >"$WORK/meals.json"
chmod 644 "$WORK/meals.json"

start_nginx upstream "
    keepalive_requests 1000000;
    http2_max_concurrent_streams 512;
    ssl_certificate $WORK/server.pem;
    ssl_certificate_key $WORK/server.key;
    server { listen 127.0.0.1:$H2_PORT ssl http2; root $WORK; default_type application/json; }
    server { listen 127.0.0.1:$H1_PORT ssl; root $WORK; default_type application/json; }"
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 RECAST_LOG=warn \
    "$RECAST" serve >"$WORK/recast.log" 2>&1 &
RECAST_PID=$!
PIDS+=("$RECAST_PID")

wait_for "https://127.0.0.1:$H2_PORT/meals.json"
wait_for "http://127.0.0.1:$RECAST_PORT/readyz"

CA=$(python3 -c 'import json, sys; print(json.dumps(open(sys.argv[1]).read()))' "$WORK/ca.pem")
register() { # $1 route path, $2 upstream port; prints the route's public path
    curl -sf -H 'content-type: application/json' -d '{"path":"'"$1"'","originalRoute":{"originalApi":{"baseUrl":"https://127.0.0.1:'"$2"'/"},"path":"meals.json"},"tls":{"ca":'"$CA"'},"rulesAsString":{"newBodyFields":{"name":{"key":"name","type":"String"}},"oldBodyFields":{"name":{"keys":["strMeal"],"parents":["meals"]}}}}' \
        "http://127.0.0.1:$RECAST_PORT/v1/mapping" | python3 -c 'import json, sys; print(json.load(sys.stdin)["path"])'
}
H2_ROUTE=$(register over-h2 "$H2_PORT")
H1_ROUTE=$(register over-h1 "$H1_PORT")

HZ=$(getconf CLK_TCK)
ticks() { awk '{ sub(/.*\) /, ""); t += $12 + $13 } END { print t }' /proc/"$RECAST_PID"/task/*/stat 2>/dev/null; }
held() { # $1 upstream port: recast's established connections to it
    ss -Htn state established "dst 127.0.0.1:$1" 2>/dev/null | wc -l
}
measure() { # $1 name, $2 path, $3 upstream port, $4 connections
    local before after out rps p99 requests codes seconds=${DURATION%s} connections
    before=$(ticks)
    wrk -t"$THREADS" -c"$4" -d"$DURATION" --latency "http://127.0.0.1:$RECAST_PORT$2" >"$WORK/wrk.out" &
    local wrk=$!
    sleep "$(awk -v s="$seconds" 'BEGIN { print s / 2 }')"
    connections=$(held "$3")
    wait "$wrk"
    after=$(ticks)
    out=$(cat "$WORK/wrk.out")
    rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
    requests=$(awk '/ requests in / { print $1 }' <<<"$out")
    codes=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
    printf '| %s | %s | %s | %s | %s | %.2f | %s |\n' "$1" "$4" "$rps" "$p99" "${codes:-0}/$requests" \
        "$(awk -v t=$((after - before)) -v n="$requests" -v hz="$HZ" 'BEGIN { print t * 1e6 / hz / n }')" "$connections"
}
echo "wrk -t$THREADS -d$DURATION, one nginx over TLS, $(date -u +%F)"
echo "| upstream | callers | calls/s | p99 | non-2xx / calls | recast CPU µs per call | upstream connections held |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for callers in $CONCURRENCY; do
    measure "HTTP/2" "$H2_ROUTE" "$H2_PORT" "$callers"
    measure "HTTP/1.1" "$H1_ROUTE" "$H1_PORT" "$callers"
done
