#!/usr/bin/env bash
# HTTPS at the listener (SPEC §7) against nginx terminating TLS, on loopback. One nginx serves the
# recipe document (3 KB) in plain HTTP as the upstream; a second nginx terminates TLS with the
# same certificate recast serves and proxies to it (keep-alive both ways); recast serves HTTPS
# itself and maps the recipe. Both listeners offer `h2` and `http/1.1`. For each:
#  - HTTP/1.1 over TLS: wrk (keep-alive), calls/s, p99 and CPU time per call (user+system from
#    /proc: recast's process; the TLS nginx's worker);
#  - HTTP/2: h2load with LOAD_H2_CONNECTIONS connections of 100 streams each, the same figures;
#  - handshakes per second, full and resumed, and the listener's CPU per handshake: `openssl
#    s_time -new` and `-reuse` (resumption over TLS 1.2), one client.
# Every run is bounded by LOAD_DURATION and stops by itself; the script stops what it started.
#
# Settings (environment): LOAD_DURATION (seconds, default 8), LOAD_CONNECTIONS (wrk, default 64),
# LOAD_H2_CONNECTIONS (default 4), LOAD_THREADS (default 2), LOAD_PORT (first of three ports,
# default 18380).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-8}
CONNECTIONS=${LOAD_CONNECTIONS:-64}
H2_CONNECTIONS=${LOAD_H2_CONNECTIONS:-4}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18380}
UPSTREAM_PORT=$PORT PROXY_PORT=$((PORT + 1)) RECAST_PORT=$((PORT + 2))

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" wrk curl openssl nghttp2-client python3
ensure_free_ports $UPSTREAM_PORT $PROXY_PORT $RECAST_PORT
release_build

use_work_dir

# A CA and the listeners' certificate for 127.0.0.1.
write_server_certificate "$WORK"
write_recipe >"$WORK/recipe.json"

start_nginx upstream "
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$UPSTREAM_PORT; root $WORK; default_type application/json; }"
UPSTREAM_NGINX=${PIDS[0]}
start_nginx proxy "
    keepalive_requests 1000000;
    upstream recipe { server 127.0.0.1:$UPSTREAM_PORT; keepalive 64; }
    ssl_certificate $WORK/server.pem;
    ssl_certificate_key $WORK/server.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:tls:10m;
    http2_max_concurrent_streams 128;
    server {
        listen 127.0.0.1:$PROXY_PORT ssl http2;
        location / { proxy_pass http://recipe; proxy_http_version 1.1; proxy_set_header Connection \"\"; }
    }"
PROXY_NGINX=${PIDS[1]}
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 RECAST_LOG=warn \
    RECAST_TLS_CERT=$WORK/server.pem RECAST_TLS_KEY=$WORK/server.key "$RECAST" serve >"$WORK/recast.log" 2>&1 &
RECAST_PID=$!
PIDS+=("$RECAST_PID")

wait_for "http://127.0.0.1:$UPSTREAM_PORT/recipe.json"
wait_for "https://127.0.0.1:$PROXY_PORT/recipe.json"
wait_for "https://127.0.0.1:$RECAST_PORT/readyz"
ROUTE=$(curl -sf --cacert "$WORK/ca.pem" -H 'content-type: application/json' \
    -d '{"path":"recipe","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"recipe.json"},"rulesAsString":'"$RECIPE_RULES"'}' \
    "https://127.0.0.1:$RECAST_PORT/v1/mapping" | python3 -c 'import json, sys; print(json.load(sys.stdin)["path"])')

HZ=$(getconf CLK_TCK)
# Clock ticks so far of one listener: recast's process, or the TLS nginx's worker.
ticks() {
    local pids
    case "$1" in
        recast) pids=$RECAST_PID ;;
        nginx) pids=$(pgrep -P "$PROXY_NGINX" -f 'worker process' | tr '\n' ' ') ;;
    esac
    local pid
    for pid in $pids; do cat /proc/"$pid"/task/*/stat 2>/dev/null; done | awk '{ sub(/.*\) /, ""); t += $12 + $13 } END { print t + 0 }'
}
url() { # $1 listener: the URL wrk and h2load call
    case "$1" in
        recast) echo "https://127.0.0.1:$RECAST_PORT$ROUTE" ;;
        nginx) echo "https://127.0.0.1:$PROXY_PORT/recipe.json" ;;
    esac
}
per_call() { awk -v t="$1" -v n="$2" -v hz="$HZ" 'BEGIN { if (n > 0) printf "%.2f", t * 1e6 / hz / n; else print "-" }'; }

wrk_run() { # $1 listener
    local before after out rps p99 requests
    before=$(ticks "$1")
    out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency "$(url "$1")")
    after=$(ticks "$1")
    rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
    requests=$(awk '/ requests in / { print $1 }' <<<"$out")
    if grep -q 'Non-2xx' <<<"$out"; then say "$1 answered non-2xx under wrk: $out"; exit 1; fi
    printf '| %s | HTTP/1.1 (wrk -c%s) | %s | %s | %s |\n' "$1" "$CONNECTIONS" "$rps" "$p99" "$(per_call $((after - before)) "$requests")"
}

h2_run() { # $1 listener
    local before after out rps done_ p99
    before=$(ticks "$1")
    out=$(h2load -D "$DURATION" -c "$H2_CONNECTIONS" -m 100 -t 1 "$(url "$1")")
    after=$(ticks "$1")
    rps=$(awk '/^finished in/ { gsub(",", "", $4); print $4 }' <<<"$out")
    done_=$(awk '/^requests:/ { print $8 }' <<<"$out")
    if ! awk '/^status codes:/ { exit !($3 > 0 && $5 == 0 && $7 == 0 && $9 == 0) }' <<<"$out"; then
        say "$1 answered other than 2xx under h2load: $out"; exit 1
    fi
    p99=$(awk '/^time for request:/ { print $6 " (mean)" }' <<<"$out")
    printf '| %s | HTTP/2 (h2load -c%s -m100) | %s | %s | %s |\n' "$1" "$H2_CONNECTIONS" "$rps" "${p99:--}" "$(per_call $((after - before)) "$done_")"
}

handshakes() { # $1 listener, $2 -new (full) or -reuse (resumed): handshakes per second, and the listener's CPU µs per handshake
    local port=$RECAST_PORT before after out count seconds versions=()
    [ "$1" = nginx ] && port=$PROXY_PORT
    # Resumption is measured over TLS 1.2: s_time closes each connection without reading, so it
    # never receives the tickets TLS 1.3 sends after the handshake.
    [ "$2" = -reuse ] && versions=(-tls1_2)
    before=$(ticks "$1")
    out=$(timeout $((DURATION + 10)) openssl s_time -connect "127.0.0.1:$port" -CAfile "$WORK/ca.pem" "$2" "${versions[@]}" -time "$DURATION" 2>/dev/null || true)
    after=$(ticks "$1")
    count=$(awk '/ connections in [0-9.]+ real seconds/ { print $1; exit }' <<<"$out")
    seconds=$(awk '/ connections in [0-9.]+ real seconds/ { print $4; exit }' <<<"$out")
    if [ -z "$count" ] || [ "${seconds:-0}" = 0 ]; then say "openssl s_time $2 against $1 gave no count: $out"; exit 1; fi
    printf '%s/s, %s µs' "$(awk -v n="$count" -v s="$seconds" 'BEGIN { printf "%.0f", n / s }')" "$(per_call $((after - before)) "$count")"
}

echo "HTTPS on loopback, $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), ${DURATION}s a run"
echo "| listener | load | calls/s | p99 (h2load: mean) | CPU µs per call |"
echo "|---|---|---:|---:|---:|"
for listener in nginx recast; do
    wrk_run "$listener"
    h2_run "$listener"
done
echo
echo "| listener | full handshakes (per s, listener CPU per handshake) | resumed (TLS 1.2) |"
echo "|---|---:|---:|"
for listener in nginx recast; do
    printf '| %s | %s | %s |\n' "$listener" "$(handshakes "$listener" -new)" "$(handshakes "$listener" -reuse)"
done
curl -sf --cacert "$WORK/ca.pem" "https://127.0.0.1:$RECAST_PORT/metrics" | grep -E '^recast_tls_(handshakes|resumed)' || true
