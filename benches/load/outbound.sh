#!/usr/bin/env bash
# Load on loopback, the outbound side of a route. Routes are registered against a small upstream
# on 127.0.0.1 (Python's http.server, which logs every request it answers):
#
# 1. A route with `"rateLimit": {"requestsPerSecond": LOAD_RATE, "burst": 1}`: wrk drives it as fast as it
#    can for LOAD_DURATION, far above the limit, and the script prints how many requests a second
#    the upstream received (from its log) against the limit.
# 2. A route with a Bearer token and a route with OAuth2 client credentials (its token endpoint
#    oidc-provider from tests/oauth, tokens living an hour), both to an nginx upstream that keeps
#    connections alive (so recast's own work is what is measured): wrk drives each in turn, and the script
#    prints calls per second, p99 and recast's CPU time per call of each, and the token endpoint's
#    count of token requests (one: the OAuth2 route's live call).
# 3. Then the upstream is stopped, RECAST_BREAKER_FAILURES calls of another route fail, and from
#    then on every call of it is refused without an outbound call (503 upstream-unavailable). wrk
#    drives the open route and an unknown route (a 404) in turn, and the script prints calls per
#    second, p99 and recast's CPU time per call (user+system, from /proc) of each.
#
# Settings (environment): LOAD_DURATION (default 8s), LOAD_CONNECTIONS (default 64),
# LOAD_ROUNDS (default 2), LOAD_THREADS (default 2), LOAD_RATE (default 100), LOAD_PORT (first of
# four ports, default 18180).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh

DURATION=${LOAD_DURATION:-8s}
CONNECTIONS=${LOAD_CONNECTIONS:-64}
ROUNDS=${LOAD_ROUNDS:-2}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18180}
RATE=${LOAD_RATE:-100}
UPSTREAM_PORT=$PORT RECAST_PORT=$((PORT + 1)) TOKEN_PORT=$((PORT + 2)) NGINX_PORT=$((PORT + 3))

ensure_toolchain
ensure_packages "${BUILD_PACKAGES[@]}" wrk curl python3
ensure_oauth_server
ensure_nginx
ensure_free_ports $UPSTREAM_PORT $RECAST_PORT $TOKEN_PORT $NGINX_PORT
use_ccache
announce_rocksdb release
cargo build --release --locked --bin recast
RECAST="$CARGO_TARGET_DIR/release/recast"

use_work_dir

echo '{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken"}]}' >"$WORK/meals.json"
python3 -m http.server "$UPSTREAM_PORT" --bind 127.0.0.1 --directory "$WORK" >/dev/null 2>"$WORK/upstream.log" &
UPSTREAM_PID=$!
PIDS+=("$UPSTREAM_PID")
node tests/oauth/server.mjs authorization "$TOKEN_PORT" 3600 >/dev/null 2>&1 &
PIDS+=($!)
start_nginx upstream "
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$NGINX_PORT; root $WORK; default_type application/json; }"
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
    RECAST_LOG=warn RECAST_BREAKER_FAILURES=5 RECAST_BREAKER_COOLDOWN_MS=3600000 \
    "$RECAST" serve >"$WORK/recast.log" 2>&1 &
RECAST_PID=$!
PIDS+=("$RECAST_PID")
wait_for "http://127.0.0.1:$UPSTREAM_PORT/meals.json"
wait_for "http://127.0.0.1:$RECAST_PORT/readyz"
wait_for "http://127.0.0.1:$TOKEN_PORT/test/counts"
wait_for "http://127.0.0.1:$NGINX_PORT/meals.json"

register() { # $1 route path, $2 more members, $3 upstream port (default: the Python one); prints the route's public path
    curl -sf -H 'content-type: application/json' -d '{"path":"'"$1"'","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"${3:-$UPSTREAM_PORT}"'/"},"path":"meals.json"},"rulesAsString":{"newBodyFields":{"name":{"key":"name","type":"String"}},"oldBodyFields":{"name":{"keys":["strMeal"],"parents":["meals"]}}}'"$2"'}' \
        "http://127.0.0.1:$RECAST_PORT/v1/mapping" | python3 -c 'import json, sys; print(json.load(sys.stdin)["path"])'
}
ROUTE=$(register meals "")
LIMITED=$(register limited ',"rateLimit":{"requestsPerSecond":'"$RATE"',"burst":1}')
BEARER=$(register bearer ',"authHeader":{"type":"Bearer","token":"a-static-token-of-forty-three-characters-x"}' "$NGINX_PORT")
OAUTH=$(register oauth ',"authHeader":{"type":"OAuth2ClientCredentials","tokenUrl":"http://127.0.0.1:'"$TOKEN_PORT"'/token","clientId":"basic-client","clientSecret":"basic-secret"}' "$NGINX_PORT")

HZ=$(getconf CLK_TCK)
ticks() { awk '{ sub(/.*\) /, ""); t += $12 + $13 } END { print t }' /proc/"$RECAST_PID"/task/*/stat 2>/dev/null; }
measure() { # $1 name, $2 path
    local before after out rps p99 requests codes
    before=$(ticks)
    out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency "http://127.0.0.1:$RECAST_PORT$2")
    after=$(ticks)
    rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
    requests=$(awk '/ requests in / { print $1 }' <<<"$out")
    codes=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
    printf '| %s | %s | %s | %s | %s | %.2f |\n' "$1" "$round" "$rps" "$p99" "${codes:-0}/$requests" \
        "$(awk -v t=$((after - before)) -v n="$requests" -v hz="$HZ" 'BEGIN { print t * 1e6 / hz / n }')"
}
alternate() { # $1 name and $2 path of one call, $3 and $4 of the other: LOAD_ROUNDS rounds, in turn first
    for round in $(seq 1 "$ROUNDS"); do
        if ((round % 2)); then
            measure "$1" "$2"
            measure "$3" "$4"
        else
            measure "$3" "$4"
            measure "$1" "$2"
        fi
    done
}

# --- The rate limit --------------------------------------------------------------------------
sleep 1
received() { grep -c '"GET /meals.json' "$WORK/upstream.log" || true; }
before=$(received)
out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" "http://127.0.0.1:$RECAST_PORT$LIMITED")
sleep 0.5
after=$(received)
seconds=${DURATION%s}
requests=$(awk '/ requests in / { print $1 }' <<<"$out")
echo "rate limit of $RATE a second, wrk -t$THREADS -c$CONNECTIONS -d$DURATION:"
echo "| callers' calls/s | answered 429 | upstream received | upstream calls/s | against the limit |"
echo "|---:|---:|---:|---:|---:|"
awk -v r="$requests" -v n="$(awk '/Non-2xx/ { print $NF }' <<<"$out")" -v got=$((after - before)) -v s="$seconds" -v rate="$RATE" \
    'BEGIN { printf "| %.0f | %d | %d | %.1f | %.3f× |\n", r / s, n, got, got / s, got / s / rate }'

# --- OAuth2 against Bearer, the token held ---------------------------------------------------
echo
echo "OAuth2 client credentials against a Bearer token, wrk -t$THREADS -c$CONNECTIONS -d$DURATION, rounds: $ROUNDS"
echo "| call | round | calls/s | p99 | non-2xx / calls | recast CPU µs per call |"
echo "|---|---:|---:|---:|---:|---:|"
alternate "Bearer route" "$BEARER" "OAuth2 route" "$OAUTH"
echo "token requests the token endpoint received: $(curl -s "http://127.0.0.1:$TOKEN_PORT/test/counts" | python3 -c 'import json, sys; print(json.load(sys.stdin)["tokenRequests"])')"

# --- The open breaker ------------------------------------------------------------------------
kill "$UPSTREAM_PID"
wait "$UPSTREAM_PID" 2>/dev/null || true
for _ in 1 2 3 4 5; do
    curl -s -o /dev/null "http://127.0.0.1:$RECAST_PORT$ROUTE"
done
status=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RECAST_PORT$ROUTE")
if [ "$status" != 503 ]; then
    say "the route answered $status, not 503: the breaker did not open"
    exit 1
fi
UNKNOWN=/v1/00000000-0000-4000-8000-000000000000/meals

echo
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION, rounds: $ROUNDS"
echo "| call | round | calls/s | p99 | non-2xx / calls | recast CPU µs per call |"
echo "|---|---:|---:|---:|---:|---:|"
alternate "open breaker (503)" "$ROUTE" "unknown route (404)" "$UNKNOWN"
