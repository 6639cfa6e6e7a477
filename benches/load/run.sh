#!/usr/bin/env bash
# Load benchmark on loopback, one machine: the same upstream documents fetched (a) from the
# upstream directly, (b) through nginx as a plain reverse proxy with upstream keep-alive, (c)
# through nginx with njs mapping the fields in JavaScript, and (d) through a recast route mapping
# the same fields; and, as a control, (e) through a second nginx instance identical to the first
# (the twin), which shows how far two identical proxies measured back to back differ here. Then
# the cache of mapped answers: (f) a recast route with `cache`, every call a hit, against nginx
# serving the very same mapped bytes (g) as a static file and (h) from its proxy_cache. Every
# run is bounded by LOAD_DURATION. Prints two tables and writes them as CSV, with the CPU time
# per request of the processes serving each target, read from /proc.
#
# Settings (environment): LOAD_DURATION (default 10s), LOAD_CONNECTIONS (default "16 64 256"),
# LOAD_ROUNDS (default 1: how many times the whole set is measured, one round after another; the
# tables give medians, each ratio is the median of the ratios within a round, and each round's
# recast/proxy and twin/proxy ratios and p99s are listed under the first; the proxy, recast and
# the twin are measured back to back, in that order in odd rounds and the other way round in
# even ones, and so are static, proxy_cache and the cached route), LOAD_THREADS (wrk threads,
# default 2), LOAD_PORT (first of eight ports, default 18080; nine with LOAD_BEFORE), LOAD_CSV
# (default $CARGO_TARGET_DIR/load/results.csv), LOAD_BEFORE (the path of another recast binary,
# e.g. a copy of the last build before a change: it serves the same routes on a ninth port, is
# measured back to back with this build in every round, and a third table gives this build's
# CPU per call and calls per second against it, round by round).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-10s}
CONNECTIONS=${LOAD_CONNECTIONS:-16 64 256}
ROUNDS=${LOAD_ROUNDS:-1}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18080}
CSV=${LOAD_CSV:-$CARGO_TARGET_DIR/load/results.csv}
UPSTREAM_PORT=$PORT PROXY_PORT=$((PORT + 1)) NJS_PORT=$((PORT + 2)) RECAST_PORT=$((PORT + 3))
TWIN_PORT=$((PORT + 4)) TWIN_NJS_PORT=$((PORT + 5)) CACHE_PORT=$((PORT + 6)) TWIN_CACHE_PORT=$((PORT + 7))
BEFORE=${LOAD_BEFORE:-} BEFORE_PORT=$((PORT + 8))
if [ -n "$BEFORE" ] && [ ! -x "$BEFORE" ]; then
    say "LOAD_BEFORE=$BEFORE is not an executable recast binary"
    exit 1
fi

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" libnginx-mod-http-js wrk curl
ensure_free_ports $UPSTREAM_PORT $PROXY_PORT $NJS_PORT $RECAST_PORT $TWIN_PORT $TWIN_NJS_PORT $CACHE_PORT $TWIN_CACHE_PORT \
    ${BEFORE:+$BEFORE_PORT}
use_ccache
announce_rocksdb release
cargo build --release --locked --bin recast
RECAST="$CARGO_TARGET_DIR/release/recast"
NJS_MODULE=$(ls /usr/lib/nginx/modules/ngx_http_js_module.so /usr/share/nginx/modules/ngx_http_js_module.so 2>/dev/null | head -n 1)

use_work_dir

# --- The documents -------------------------------------------------------------------------
write_recipe >"$WORK/recipe.json"
write_list >"$WORK/list.json"

# --- The same mapping for recast and for njs -----------------------------------------------
# RECIPE_RULES and LIST_RULES come from common.sh.

cat >"$WORK/map.js" <<'EOF'
function joined(parts) {
    return parts.map((p) => (p === null || p === undefined ? '' : String(p).trim())).filter((p) => p !== '').join(' ');
}
async function recipe(r) {
    const reply = await r.subrequest('/_upstream/recipe.json');
    const meal = JSON.parse(reply.responseText).meals[0];
    const ingredients = [];
    for (let i = 1; i <= 7; i++) {
        ingredients.push(joined([meal['strMeasure' + i], meal['strIngredient' + i]]));
    }
    const out = { id: parseInt(meal.idMeal, 10), name: meal.strMeal, category: meal.strCategory, area: meal.strArea, ingredients };
    r.headersOut['Content-Type'] = 'application/json';
    r.return(200, JSON.stringify(out));
}
async function list(r) {
    const reply = await r.subrequest('/_upstream/list.json');
    const items = JSON.parse(reply.responseText).items.map((it) => ({
        id: parseInt(it.id, 10), title: it.title, price: parseFloat(it.price), owner: it.owner.name, email: it.owner.email,
    }));
    r.headersOut['Content-Type'] = 'application/json';
    r.return(200, JSON.stringify(items));
}
export default { recipe, list };
EOF

# Three nginx instances: the upstream, the gateway for (b) and (c), and its twin for (e). A gateway
# and its upstream are separate processes, as recast and the upstream are; in one instance the
# proxy's hop to the upstream would stay inside one worker's event loop, a shortcut no real
# deployment has.
# The twin is the gateway's configuration on two other ports, so it is the proxy's twin in every
# respect; its njs server is never measured.
common() { # $1 instance name
    cat <<EOF
worker_processes auto;
pid $WORK/$1.pid;
error_log $WORK/error.log warn;
events { worker_connections 4096; }
EOF
}
temp_paths() { # $1 instance name
    local kind
    for kind in client_body proxy fastcgi uwsgi scgi; do printf '    %s_temp_path %s;\n' "$kind" "$WORK/$1-$kind"; done
}
{
    common upstream
    cat <<EOF
http {
    access_log off;
$(temp_paths upstream)
    keepalive_requests 1000000;
    # (a) the upstream: two fixed JSON documents.
    server {
        listen 127.0.0.1:$UPSTREAM_PORT;
        root $WORK;
        default_type application/json;
    }
}
EOF
} >"$WORK/upstream.conf"
gateway() { # $1 instance name, $2 proxy port, $3 njs port, $4 proxy_cache port
    echo "load_module $NJS_MODULE;"
    common "$1"
    cat <<EOF
http {
    access_log off;
$(temp_paths "$1")
    keepalive_requests 1000000;
    upstream documents { server 127.0.0.1:$UPSTREAM_PORT; keepalive 256; }
    js_import map from $WORK/map.js;
    # (b) a plain reverse proxy with upstream keep-alive; in the twin, (e).
    server {
        listen 127.0.0.1:$2;
        location / {
            proxy_pass http://documents;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    # (c) the same proxy, with njs mapping the answer.
    server {
        listen 127.0.0.1:$3;
        subrequest_output_buffer_size 512k;
        location /_upstream/ {
            internal;
            proxy_pass http://documents/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location = /recipe { js_content map.recipe; }
        location = /list { js_content map.list; }
    }
    # (h) the mapped bytes from nginx's own cache: the upstream serves them (as the static file
    # (g)); after the first call, every call is a hit that never reaches it.
    proxy_cache_path $WORK/$1-cache levels=1:2 keys_zone=$1:10m max_size=256m inactive=1h;
    server {
        listen 127.0.0.1:$4;
        location / {
            proxy_pass http://documents;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache $1;
            proxy_cache_valid 200 1h;
            add_header Cache-Status \$upstream_cache_status;
        }
    }
}
EOF
}
gateway gateway "$PROXY_PORT" "$NJS_PORT" "$CACHE_PORT" >"$WORK/gateway.conf"
gateway twin "$TWIN_PORT" "$TWIN_NJS_PORT" "$TWIN_CACHE_PORT" >"$WORK/twin.conf"
mkdir -p "$WORK/data"
for instance in upstream gateway twin; do
    nginx -p "$WORK" -c "$WORK/$instance.conf" -g 'daemon off;' 2>>"$WORK/error.log" &
    PIDS+=($!)
done
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
    RECAST_LOG=warn "$RECAST" serve 2>>"$WORK/recast.log" &
PIDS+=($!)
if [ -n "$BEFORE" ]; then
    RECAST_LISTEN=127.0.0.1:$BEFORE_PORT RECAST_DATA_DIR=$WORK/before-data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
        RECAST_LOG=warn "$BEFORE" serve 2>>"$WORK/recast.log" &
    PIDS+=($!)
fi
ready=no
for _ in $(seq 1 200); do
    if curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT/readyz" >/dev/null 2>&1 \
        && curl -sf -m 10 "http://127.0.0.1:$UPSTREAM_PORT/recipe.json" >/dev/null 2>&1 \
        && curl -sf -m 10 "http://127.0.0.1:$PROXY_PORT/recipe.json" >/dev/null 2>&1 \
        && curl -sf -m 10 "http://127.0.0.1:$TWIN_PORT/recipe.json" >/dev/null 2>&1 \
        && { [ -z "$BEFORE" ] || curl -sf -m 10 "http://127.0.0.1:$BEFORE_PORT/readyz" >/dev/null 2>&1; }; then
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

register() { # $1 path, $2 upstream file, $3 rules, $4 more members; prints the route's path
    curl -sf -m 10 "http://127.0.0.1:${REGISTER_PORT:-$RECAST_PORT}/v1/mapping" -H 'content-type: application/json' -d \
        '{"path":"'"$1"'","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"'"$2"'"},"rulesAsString":'"$3${4:-}"'}' \
        | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p'
}
RECIPE_ROUTE=$(register recipe recipe.json "$RECIPE_RULES")
LIST_ROUTE=$(register list list.json "$LIST_RULES")
# (f) the same routes with a cache that outlasts the run: every call after the first is a hit.
CACHED=',"cache":{"ttlSeconds":3600}'
CACHED_RECIPE_ROUTE=$(register cached-recipe recipe.json "$RECIPE_RULES" "$CACHED")
CACHED_LIST_ROUTE=$(register cached-list list.json "$LIST_RULES" "$CACHED")
if [ -z "$RECIPE_ROUTE" ] || [ -z "$LIST_ROUTE" ] || [ -z "$CACHED_RECIPE_ROUTE" ] || [ -z "$CACHED_LIST_ROUTE" ]; then
    say "registering the routes failed; recast's log:"; cat "$WORK/recast.log" >&2; exit 1
fi

# The other build serves the same two routes, and must answer the same bytes.
if [ -n "$BEFORE" ]; then
    BEFORE_RECIPE_ROUTE=$(REGISTER_PORT=$BEFORE_PORT register recipe recipe.json "$RECIPE_RULES")
    BEFORE_LIST_ROUTE=$(REGISTER_PORT=$BEFORE_PORT register list list.json "$LIST_RULES")
    for pair in "$RECIPE_ROUTE $BEFORE_RECIPE_ROUTE" "$LIST_ROUTE $BEFORE_LIST_ROUTE"; do
        read -r now then <<<"$pair"
        if [ -z "$then" ] || ! cmp -s <(curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT$now") \
            <(curl -sf -m 10 "http://127.0.0.1:$BEFORE_PORT$then"); then
            say "LOAD_BEFORE's recast does not answer as this build does"; exit 1
        fi
    done
fi
# recast and njs must answer the very same bytes, or the comparison means nothing.
for doc in recipe list; do
    route=$RECIPE_ROUTE; [ "$doc" = list ] && route=$LIST_ROUTE
    curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT$route" >"$WORK/$doc.recast"
    curl -sf -m 10 "http://127.0.0.1:$NJS_PORT/$doc" >"$WORK/$doc.njs"
    if ! cmp -s "$WORK/$doc.recast" "$WORK/$doc.njs"; then
        say "recast and njs map $doc differently:"; head -c 400 "$WORK/$doc.recast" >&2; echo >&2
        head -c 400 "$WORK/$doc.njs" >&2; echo >&2; exit 1
    fi
done
# (g) and (h) serve recast's mapped bytes as they are; the cached route must answer them too, and
# from its cache, as must proxy_cache.
for doc in recipe list; do
    route=$CACHED_RECIPE_ROUTE; [ "$doc" = list ] && route=$CACHED_LIST_ROUTE
    cp "$WORK/$doc.recast" "$WORK/$doc-mapped.json"
    chmod 644 "$WORK/$doc-mapped.json"
    for url in "http://127.0.0.1:$RECAST_PORT$route" "http://127.0.0.1:$UPSTREAM_PORT/$doc-mapped.json" \
        "http://127.0.0.1:$CACHE_PORT/$doc-mapped.json"; do
        curl -sf -m 10 "$url" >/dev/null # fills the caches
        curl -sf -m 10 -D "$WORK/headers" "$url" >"$WORK/answer"
        if ! cmp -s "$WORK/answer" "$WORK/$doc.recast"; then
            say "$url does not answer recast's mapped $doc"; exit 1
        fi
        if [[ $url != *":$UPSTREAM_PORT/"* ]] && ! grep -qiE '^cache-status: (recast; hit|HIT)' "$WORK/headers"; then
            say "$url did not answer from its cache:"; cat "$WORK/headers" >&2; exit 1
        fi
    done
done
printf 'documents: recipe %s bytes -> %s mapped; list %s bytes -> %s mapped (recast and njs identical)\n' \
    "$(wc -c <"$WORK/recipe.json")" "$(wc -c <"$WORK/recipe.recast")" "$(wc -c <"$WORK/list.json")" "$(wc -c <"$WORK/list.recast")"

# --- Load -------------------------------------------------------------------------------------
# The processes that serve each target: an nginx instance's workers (not its cache manager and
# cache loader, which come and go), or recast.
serving() { # $1 target name
    case $1 in
        upstream | static) pgrep -P "${PIDS[0]}" -f 'worker process' || true ;;
        proxy | njs | proxy_cache) pgrep -P "${PIDS[1]}" -f 'worker process' || true ;;
        twin) pgrep -P "${PIDS[2]}" -f 'worker process' || true ;;
        recast | cached) echo "${PIDS[3]}" ;;
        before) echo "${PIDS[4]}" ;;
    esac
}
HZ=$(getconf CLK_TCK)
mkdir -p "$(dirname "$CSV")"
echo "round,document,connections,target,requests_per_s,p50_ms,p99_ms,errors,user_us_per_request,system_us_per_request" >"$CSV"
measure() { # $1 document, $2 connections, $3 target name, $4 URL; $round is the round
    local out rps p50 p99 errors requests pids before after user system
    pids=$(serving "$3")
    # shellcheck disable=SC2086 # one argument per process id
    before=$(cpu_ticks $pids)
    out=$(wrk -t"$THREADS" -c"$2" -d"$DURATION" --latency "$4")
    # shellcheck disable=SC2086
    after=$(cpu_ticks $pids)
    read -r rps p50 p99 errors requests <<<"$(wrk_figures "$out")"
    # Ticks spent during the run by the processes there before and after it (one that has gone
    # counts as zero rather than stopping the run).
    read -r user system < <(awk -v b="$before" -v a="$after" -v n="$requests" -v hz="$HZ" 'BEGIN {
        k = split(b, x, ";"); for (i = 1; i <= k; i++) if (split(x[i], f, " ") == 3) { bu[f[1]] = f[2]; bs[f[1]] = f[3] }
        k = split(a, y, ";"); for (i = 1; i <= k; i++) if (split(y[i], f, " ") == 3 && (f[1] in bu)) { u += f[2] - bu[f[1]]; s += f[3] - bs[f[1]] }
        if (n < 1) n = 1
        printf "%.2f %.2f\n", u * 1e6 / hz / n, s * 1e6 / hz / n }')
    echo "$round,$1,$2,$3,$rps,$p50,$p99,$errors,$user,$system" >>"$CSV"
    printf '  %s  %-7s %5s conns  %-9s %10s req/s  p50 %8s ms  p99 %8s ms  errors %s  CPU us/request user %s system %s\n' \
        "$round" "$1" "$2" "$3" "$rps" "$p50" "$p99" "$errors" "$user" "$system"
}
echo "wrk -t$THREADS -d$DURATION, connections: $CONNECTIONS, rounds: $ROUNDS"
for round in $(seq 1 "$ROUNDS"); do
    for doc in recipe list; do
        route=$RECIPE_ROUTE; [ "$doc" = list ] && route=$LIST_ROUTE
        before_route=${BEFORE_RECIPE_ROUTE:-}; [ "$doc" = list ] && before_route=${BEFORE_LIST_ROUTE:-}
        for c in $CONNECTIONS; do
            measure "$doc" "$c" upstream "http://127.0.0.1:$UPSTREAM_PORT/$doc.json"
            # The proxy, recast and the twin run back to back, in turn one way and the other, so
            # a drift of the machine's speed falls on each side alike.
            if ((round % 2)); then
                measure "$doc" "$c" proxy "http://127.0.0.1:$PROXY_PORT/$doc.json"
                measure "$doc" "$c" recast "http://127.0.0.1:$RECAST_PORT$route"
                [ -n "$BEFORE" ] && measure "$doc" "$c" before "http://127.0.0.1:$BEFORE_PORT$before_route"
                measure "$doc" "$c" twin "http://127.0.0.1:$TWIN_PORT/$doc.json"
            else
                measure "$doc" "$c" twin "http://127.0.0.1:$TWIN_PORT/$doc.json"
                [ -n "$BEFORE" ] && measure "$doc" "$c" before "http://127.0.0.1:$BEFORE_PORT$before_route"
                measure "$doc" "$c" recast "http://127.0.0.1:$RECAST_PORT$route"
                measure "$doc" "$c" proxy "http://127.0.0.1:$PROXY_PORT/$doc.json"
            fi
            measure "$doc" "$c" njs "http://127.0.0.1:$NJS_PORT/$doc"
            cached=$CACHED_RECIPE_ROUTE; [ "$doc" = list ] && cached=$CACHED_LIST_ROUTE
            if ((round % 2)); then
                measure "$doc" "$c" static "http://127.0.0.1:$UPSTREAM_PORT/$doc-mapped.json"
                measure "$doc" "$c" proxy_cache "http://127.0.0.1:$CACHE_PORT/$doc-mapped.json"
                measure "$doc" "$c" cached "http://127.0.0.1:$RECAST_PORT$cached"
            else
                measure "$doc" "$c" cached "http://127.0.0.1:$RECAST_PORT$cached"
                measure "$doc" "$c" proxy_cache "http://127.0.0.1:$CACHE_PORT/$doc-mapped.json"
                measure "$doc" "$c" static "http://127.0.0.1:$UPSTREAM_PORT/$doc-mapped.json"
            fi
        done
    done
done

echo
[ "$ROUNDS" -gt 1 ] && echo "Medians over $ROUNDS rounds; each ratio is the median of the ratios within a round."
echo "| document | connections | upstream req/s | nginx proxy req/s | nginx+njs req/s | recast req/s | recast/proxy | recast/njs | p99 proxy ms | p99 recast ms | CPU µs/req proxy (user+sys) | CPU µs/req recast (user+sys) | twin/proxy (control) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
# What both tables read from the CSV: each measure's values by round, and a median function.
CSV_READ='
    function median(list,    v, n, i, j, t) {
        n = split(substr(list, 2), v, " ")
        for (i = 2; i <= n; i++) { t = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    NR > 1 {
        k = $2","$3","$4; rps[k] = rps[k] " " $5; p99[k] = p99[k] " " $7; user[k] = user[k] " " $9; sys[k] = sys[k] " " $10
        one[$1","k] = $5; late[$1","k] = $7; cpu[$1","k] = $9 + $10
        if (!seen[$2","$3]++) order[n++] = $2","$3
        if (!counted[$1]++) rounds[r++] = $1
    }'
awk -F, "$CSV_READ"'
    END {
        for (i = 0; i < n; i++) {
            k = order[i]; split(k, d, ","); proxy = ""; njs = ""; twin = ""
            for (j = 0; j < r; j++) {
                q = rounds[j]","k
                proxy = proxy " " one[q",recast"] / one[q",proxy"]; njs = njs " " one[q",recast"] / one[q",njs"]
                twin = twin " " one[q",twin"] / one[q",proxy"]
            }
            printf "| %s | %s | %.0f | %.0f | %.0f | %.0f | %.2f× | %.2f× | %.2f | %.2f | %.1f+%.1f | %.1f+%.1f | %.2f× |\n", d[1], d[2],
                median(rps[k",upstream"]), median(rps[k",proxy"]), median(rps[k",njs"]), median(rps[k",recast"]),
                median(proxy), median(njs), median(p99[k",proxy"]), median(p99[k",recast"]),
                median(user[k",proxy"]), median(sys[k",proxy"]), median(user[k",recast"]), median(sys[k",recast"]), median(twin)
            line[i] = sprintf("%s, %s connections: recast/proxy %s; twin/proxy %s; p99 recast/twin/proxy ms %s", d[1], d[2],
                byround(k, "recast"), byround(k, "twin"), byround(k, "p99"))
        }
        # Round by round, so the spread behind each median shows.
        if (r > 1) { print ""; print "By round:"; for (i = 0; i < n; i++) print "  " line[i] }
    }
    function byround(k, what,    j, q, text) {
        text = ""
        for (j = 0; j < r; j++) {
            q = rounds[j]","k
            if (what == "p99") text = text sprintf(" %.2f/%.2f/%.2f", late[q",recast"], late[q",twin"], late[q",proxy"])
            else text = text sprintf(" %.2f", one[q","what] / one[q",proxy"])
        }
        return substr(text, 2)
    }' "$CSV"
echo
echo "The cache of mapped answers: a recast route with cache (every call a hit) against nginx serving the same mapped bytes."
echo "| document | connections | nginx static req/s | nginx proxy_cache req/s | recast cached req/s | recast uncached req/s | cached/uncached | cached/static | cached/proxy_cache | p99 static ms | p99 proxy_cache ms | p99 cached ms | CPU µs/req static (user+sys) | CPU µs/req proxy_cache (user+sys) | CPU µs/req cached (user+sys) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F, "$CSV_READ"'
    END {
        for (i = 0; i < n; i++) {
            k = order[i]; split(k, d, ","); uncached = ""; static = ""; pc = ""
            for (j = 0; j < r; j++) {
                q = rounds[j]","k
                uncached = uncached " " one[q",cached"] / one[q",recast"]; static = static " " one[q",cached"] / one[q",static"]
                pc = pc " " one[q",cached"] / one[q",proxy_cache"]
            }
            printf "| %s | %s | %.0f | %.0f | %.0f | %.0f | %.2f× | %.2f× | %.2f× | %.2f | %.2f | %.2f | %.1f+%.1f | %.1f+%.1f | %.1f+%.1f |\n", d[1], d[2],
                median(rps[k",static"]), median(rps[k",proxy_cache"]), median(rps[k",cached"]), median(rps[k",recast"]),
                median(uncached), median(static), median(pc), median(p99[k",static"]), median(p99[k",proxy_cache"]), median(p99[k",cached"]),
                median(user[k",static"]), median(sys[k",static"]), median(user[k",proxy_cache"]), median(sys[k",proxy_cache"]),
                median(user[k",cached"]), median(sys[k",cached"])
        }
    }' "$CSV"
if [ -n "$BEFORE" ]; then
    echo
    echo "This build against LOAD_BEFORE ($BEFORE), measured back to back in each round."
    echo "| document | connections | recast req/s | before req/s | req/s recast/before | CPU µs/req recast (user+sys) | CPU µs/req before (user+sys) | CPU recast/before | CPU recast/before by round |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    awk -F, "$CSV_READ"'
        END {
            for (i = 0; i < n; i++) {
                k = order[i]; split(k, d, ","); speed = ""; ratios = ""; text = ""
                for (j = 0; j < r; j++) {
                    q = rounds[j]","k
                    speed = speed " " one[q",recast"] / one[q",before"]
                    c = cpu[q",recast"] / cpu[q",before"]; ratios = ratios " " c; text = text sprintf(" %.3f", c)
                }
                printf "| %s | %s | %.0f | %.0f | %.3f× | %.1f+%.1f | %.1f+%.1f | %.3f× | %s |\n", d[1], d[2],
                    median(rps[k",recast"]), median(rps[k",before"]), median(speed),
                    median(user[k",recast"]), median(sys[k",recast"]), median(user[k",before"]), median(sys[k",before"]),
                    median(ratios), substr(text, 2)
            }
        }' "$CSV"
fi
echo
echo "CSV: $CSV"
