#!/usr/bin/env bash
# Load benchmark of a composed route (docs/composition.md), on loopback, one machine: a
# three-source composition of the recipe document (sources `a` and `b` in parallel, `c` chained
# on `a`: its path holds `a`'s id), each upstream served by nginx (njs answers the document after
# UPSTREAM_DELAY_MS), against
#   (a) the three calls made by the caller as three single recast routes (their CPU summed), and
#   (b) nginx+njs doing the same fan-out and merge (`ngx.fetch`, `JSON.parse`).
# Both answer the very same bytes (checked). Every run is bounded by LOAD_DURATION. Measured twice:
# with the upstreams answering at once (CPU per call) and UPSTREAM_DELAY_MS away (latency against
# the slowest chain, a then c).
#
# Then the CPU ratios again, paired: LOAD_ROUNDS rounds of LOAD_ROUND_DURATION each, every round
# a composed run, a single-route run and an njs run back to back, and the median of the rounds'
# ratios with the lowest and highest (a slow spell of the machine falls on one round, not on
# one side of the comparison).
#
# Settings (environment): LOAD_DURATION (default 10s), LOAD_CONNECTIONS (default "16 64"),
# UPSTREAM_DELAY_MS (default 20), LOAD_THREADS (wrk threads, default 2), LOAD_PORT (first of three
# ports, default 18180), LOAD_CSV (default $CARGO_TARGET_DIR/load/compose.csv), LOAD_ROUNDS
# (default 5; 0 for none), LOAD_ROUND_DURATION (default 3s).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-10s}
CONNECTIONS=${LOAD_CONNECTIONS:-16 64}
DELAY=${UPSTREAM_DELAY_MS:-20}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18180}
CSV=${LOAD_CSV:-$CARGO_TARGET_DIR/load/compose.csv}
ROUNDS=${LOAD_ROUNDS:-5}
ROUND_DURATION=${LOAD_ROUND_DURATION:-3s}
UPSTREAM_PORT=$PORT NJS_PORT=$((PORT + 1)) RECAST_PORT=$((PORT + 2))

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" libnginx-mod-http-js wrk curl
ensure_free_ports $UPSTREAM_PORT $NJS_PORT $RECAST_PORT
use_ccache
announce_rocksdb release
cargo build --release --locked --bin recast
RECAST="$CARGO_TARGET_DIR/release/recast"
NJS_MODULE=$(ls /usr/lib/nginx/modules/ngx_http_js_module.so /usr/share/nginx/modules/ngx_http_js_module.so 2>/dev/null | head -n 1)

use_work_dir

write_recipe >"$WORK/recipe.json"

# The upstream: every path answers the recipe document, after `delay` ms (the `d` query).
cat >"$WORK/upstream.js" <<'EOF'
import fs from 'fs';
const recipe = fs.readFileSync(ngx.conf_prefix + 'recipe.json');
function serve(r) {
    const delay = parseInt(r.args.d || '0', 10);
    const answer = () => { r.headersOut['Content-Type'] = 'application/json'; r.return(200, recipe); };
    if (delay > 0) setTimeout(answer, delay); else answer();
}
export default { serve };
EOF
# The same fan-out and merge in njs: a and b at once, then c with a's id.
cat >"$WORK/compose.js" <<'EOF'
async function dashboard(r) {
    const base = 'http://127.0.0.1:' + r.variables.upstream_port + '/';
    const d = '?d=' + r.variables.delay;
    const get = async (path) => {
        const reply = await ngx.fetch(base + path + d);
        const text = await reply.text();
        return JSON.parse(text);
    };
    const both = await Promise.all([get('a'), get('b')]);
    const a = both[0];
    const b = both[1];
    const c = await get('c/' + encodeURIComponent(a.meals[0].idMeal));
    const out = { id: parseInt(a.meals[0].idMeal, 10), name: a.meals[0].strMeal, area: b.meals[0].strArea, category: c.meals[0].strCategory };
    r.headersOut['Content-Type'] = 'application/json';
    r.return(200, JSON.stringify(out));
}
export default { dashboard };
EOF
temp_paths() { # $1 instance name
    local kind
    for kind in client_body proxy fastcgi uwsgi scgi; do printf '    %s_temp_path %s;\n' "$kind" "$WORK/$1-$kind"; done
}
upstream_conf() { # $1 port
    cat <<EOF
load_module $NJS_MODULE;
worker_processes 1;
pid $WORK/upstream-$1.pid;
error_log $WORK/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
$(temp_paths upstream)
    keepalive_requests 1000000;
    js_path $WORK;
    js_import up from upstream.js;
    server { listen 127.0.0.1:$1; location / { js_content up.serve; } }
}
EOF
}
upstream_conf "$UPSTREAM_PORT" >"$WORK/upstream.conf"
cat >"$WORK/njs.conf" <<EOF
load_module $NJS_MODULE;
worker_processes auto;
pid $WORK/njs.pid;
error_log $WORK/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
$(temp_paths njs)
    keepalive_requests 1000000;
    js_path $WORK;
    js_import compose from compose.js;
    js_fetch_max_response_buffer_size 1m;
    server {
        listen 127.0.0.1:$NJS_PORT;
        set \$upstream_port $UPSTREAM_PORT;
        location = /dashboard { set \$delay 0; js_content compose.dashboard; }
        location = /slow { set \$delay $DELAY; js_content compose.dashboard; }
    }
}
EOF
mkdir -p "$WORK/data"
for instance in upstream njs; do
    nginx -p "$WORK/" -c "$WORK/$instance.conf" -g 'daemon off;' 2>>"$WORK/error.log" &
    PIDS+=($!)
done
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
    RECAST_LOG=warn "$RECAST" serve 2>>"$WORK/recast.log" &
PIDS+=($!)
ready=no
for _ in $(seq 1 200); do
    if curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT/readyz" >/dev/null 2>&1 \
        && curl -sf -m 10 "http://127.0.0.1:$UPSTREAM_PORT/a" >/dev/null 2>&1 \
        && curl -sf -m 10 "http://127.0.0.1:$NJS_PORT/dashboard" >/dev/null 2>&1; then
        ready=yes
        break
    fi
    sleep 0.05
done
if [ "$ready" = no ]; then
    say "nginx or recast did not start; their logs:"
    cat "$WORK/error.log" "$WORK/recast.log" >&2
    exit 1
fi

UP="http://127.0.0.1:$UPSTREAM_PORT/"
# COMPOSED_RULES, COMPOSED_SINGLE_RULES and the registration body (composition) come from common.sh.
register() { # $1 body; prints the route's path
    curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT/v1/mapping" -H 'content-type: application/json' -d "$1" \
        | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p'
}
composed() { # $1 route path, $2 delay
    register "$(composition "$1" "$UP" "$2")"
}
COMPOSED=$(composed dashboard 0)
SLOW=$(composed slow "$DELAY")
SINGLE=$(register '{"path":"single","originalRoute":{"originalApi":{"baseUrl":"'"$UP"'"},"path":"a"},"rulesAsString":'"$COMPOSED_SINGLE_RULES"'}')
if [ -z "$COMPOSED" ] || [ -z "$SLOW" ] || [ -z "$SINGLE" ]; then
    say "registering the routes failed; recast's log:"; cat "$WORK/recast.log" >&2; exit 1
fi
curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT$COMPOSED" >"$WORK/recast.out"
curl -sf -m 10 "http://127.0.0.1:$NJS_PORT/dashboard" >"$WORK/njs.out"
if ! cmp -s "$WORK/recast.out" "$WORK/njs.out"; then
    say "recast and njs compose differently:"; cat "$WORK/recast.out" "$WORK/njs.out" >&2; exit 1
fi
printf 'composed answer (recast and njs identical): %s\n' "$(cat "$WORK/recast.out")"

serving() { # $1 target
    case $1 in
        njs*) pgrep -P "${PIDS[1]}" -f 'worker process' || true ;;
        upstream*) pgrep -P "${PIDS[0]}" -f 'worker process' || true ;;
        *) echo "${PIDS[2]}" ;;
    esac
}
HZ=$(getconf CLK_TCK)
mkdir -p "$(dirname "$CSV")"
echo "connections,target,requests_per_s,p50_ms,p99_ms,errors,cpu_us_per_request" >"$CSV"
measure() { # $1 connections, $2 target, $3 URL, $4 duration (default LOAD_DURATION)
    local out rps p50 p99 errors requests pids before after cpu
    pids=$(serving "$2")
    # shellcheck disable=SC2086
    before=$(cpu_ticks $pids)
    out=$(wrk -t"$THREADS" -c"$1" -d"${4:-$DURATION}" --latency "$3")
    # shellcheck disable=SC2086
    after=$(cpu_ticks $pids)
    read -r rps p50 p99 errors requests <<<"$(wrk_figures "$out")"
    cpu=$(awk -v b="$before" -v a="$after" -v n="$requests" -v hz="$HZ" 'BEGIN {
        k = split(b, x, ";"); for (i = 1; i <= k; i++) if (split(x[i], f, " ") == 3) { bu[f[1]] = f[2] + f[3] }
        k = split(a, y, ";"); for (i = 1; i <= k; i++) if (split(y[i], f, " ") == 3 && (f[1] in bu)) { t += f[2] + f[3] - bu[f[1]] }
        if (n < 1) n = 1
        printf "%.1f", t * 1e6 / hz / n }')
    echo "$1,$2,$rps,$p50,$p99,$errors,$cpu" >>"$CSV"
    printf '  %5s conns  %-14s %10s req/s  p50 %8s ms  p99 %8s ms  errors %s  CPU us/request %s\n' \
        "$1" "$2" "$rps" "$p50" "$p99" "$errors" "$cpu"
}
echo "wrk -t$THREADS -d$DURATION, connections: $CONNECTIONS, upstream delay for the latency runs: $DELAY ms"
for c in $CONNECTIONS; do
    measure "$c" composed "http://127.0.0.1:$RECAST_PORT$COMPOSED"
    measure "$c" single "http://127.0.0.1:$RECAST_PORT$SINGLE"
    measure "$c" njs "http://127.0.0.1:$NJS_PORT/dashboard"
    measure "$c" upstream-slow "http://127.0.0.1:$UPSTREAM_PORT/a?d=$DELAY"
    measure "$c" composed-slow "http://127.0.0.1:$RECAST_PORT$SLOW"
    measure "$c" njs-slow "http://127.0.0.1:$NJS_PORT/slow"
done
echo
echo "| connections | composed req/s | CPU µs/composed call | 3 × CPU µs/single call | composed/3 singles | njs req/s | CPU µs/njs call | calls per CPU-second recast/njs | p50 composed, upstreams ${DELAY} ms away | p50 njs, same | slowest chain (2 × p50 of one delayed upstream call) | composed over the chain |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F, -v delay="$DELAY" 'NR > 1 { rps[$1","$2] = $3; p50[$1","$2] = $4; cpu[$1","$2] = $7; if (!seen[$1]++) order[n++] = $1 }
    END {
        for (i = 0; i < n; i++) {
            c = order[i]
            chain = 2 * p50[c",upstream-slow"]
            printf "| %s | %.0f | %.1f | %.1f | %.2f× | %.0f | %.1f | %.2f× | %.2f ms | %.2f ms | %.2f ms | %+.2f ms |\n", c,
                rps[c",composed"], cpu[c",composed"], 3 * cpu[c",single"], cpu[c",composed"] / (3 * cpu[c",single"]),
                rps[c",njs"], cpu[c",njs"], cpu[c",njs"] / cpu[c",composed"], p50[c",composed-slow"], p50[c",njs-slow"],
                chain, p50[c",composed-slow"] - chain
        }
    }' "$CSV"
if [ "$ROUNDS" -gt 0 ]; then
    echo
    echo "paired: $ROUNDS rounds of $ROUND_DURATION, each composed, single and njs back to back"
    for c in $CONNECTIONS; do
        for r in $(seq 1 "$ROUNDS"); do
            measure "$c" "composed#$r" "http://127.0.0.1:$RECAST_PORT$COMPOSED" "$ROUND_DURATION"
            measure "$c" "single#$r" "http://127.0.0.1:$RECAST_PORT$SINGLE" "$ROUND_DURATION"
            measure "$c" "njs#$r" "http://127.0.0.1:$NJS_PORT/dashboard" "$ROUND_DURATION"
        done
    done
    echo
    echo "| connections | rounds | composed / 3 singles, median (lowest–highest) | calls per CPU-second recast / njs, median (lowest–highest) |"
    echo "|---:|---:|---:|---:|"
    awk -F, 'NR > 1 && $2 ~ /#/ { split($2, t, "#"); cpu[$1","t[1]","t[2]] = $7; if (!seen[$1]++) order[n++] = $1; if (t[2] > rounds) rounds = t[2] }
        function median(a, k,    i, j, x) {
            for (i = 2; i <= k; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
            return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        END {
            for (i = 0; i < n; i++) {
                c = order[i]; k = 0
                for (r = 1; r <= rounds; r++) {
                    k++
                    single[k] = cpu[c",composed,"r] / (3 * cpu[c",single,"r])
                    njs[k] = cpu[c",njs,"r] / cpu[c",composed,"r]
                }
                m1 = median(single, k); m2 = median(njs, k)
                printf "| %s | %d | %.2f× (%.2f–%.2f) | %.2f× (%.2f–%.2f) |\n", c, k, m1, single[1], single[k], m2, njs[1], njs[k]
            }
        }' "$CSV"
fi
echo
echo "CSV: $CSV"
