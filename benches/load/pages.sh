#!/usr/bin/env bash
# Load benchmark of a paged upstream (SPEC §2.3 "Pages", docs/composition.md): a route whose
# `originalRoute` follows ten pages of about 10 KB each (page numbers, `?page=N`), served by
# nginx from files, against ten calls of a single route on one such page. Both map every item's
# id and total. Measured:
#   - CPU per call of recast's process, under wrk: the paged call against ten single calls'
#     (aim: at most 1.1×);
#   - latency with one connection: the paged call's p50 against ten times the p50 of one page
#     asked of nginx directly (aim: at most that sum + 1 ms).
# Every run is bounded by LOAD_DURATION.
#
# Settings (environment): LOAD_DURATION (default 10s), LOAD_CONNECTIONS (default 16),
# LOAD_THREADS (wrk threads, default 2), LOAD_PORT (first of two ports, default 18190),
# LOAD_ROUNDS (paired rounds of the CPU ratio, default 5), LOAD_ROUND_DURATION (default 3s).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-10s}
CONNECTIONS=${LOAD_CONNECTIONS:-16}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18190}
ROUNDS=${LOAD_ROUNDS:-5}
ROUND_DURATION=${LOAD_ROUND_DURATION:-3s}
UPSTREAM_PORT=$PORT RECAST_PORT=$((PORT + 1))

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" wrk curl python3
ensure_free_ports $UPSTREAM_PORT $RECAST_PORT
release_build

use_work_dir

# Ten pages of 10 KB: 50 items each, `{"items": [...], "page": N, "total_pages": 10}`.
mkdir -p "$WORK/pages"
python3 - "$WORK/pages" <<'EOF'
import json, sys
for page in range(1, 11):
    items = [{"id": f"o{page:02}{i:03}", "total": page * 1000 + i, "customer": {"name": f"customer {i % 7}"},
              "note": "x" * 110} for i in range(50)]
    with open(f"{sys.argv[1]}/page{page}.json", "w") as f:
        json.dump({"items": items, "page": page, "total_pages": 10}, f, separators=(",", ":"))
EOF
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/client_body;
    proxy_temp_path $WORK/proxy;
    fastcgi_temp_path $WORK/fastcgi;
    uwsgi_temp_path $WORK/uwsgi;
    scgi_temp_path $WORK/scgi;
    keepalive_requests 1000000;
    map \$arg_page \$page_file { "" page1.json; default page\$arg_page.json; }
    server {
        listen 127.0.0.1:$UPSTREAM_PORT;
        location = /items { root $WORK/pages; default_type application/json; try_files /\$page_file =404; }
    }
}
EOF
mkdir -p "$WORK/data"
nginx -p "$WORK/" -c "$WORK/nginx.conf" -g 'daemon off;' 2>>"$WORK/error.log" &
PIDS+=($!)
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
    RECAST_LOG=warn "$RECAST" serve 2>>"$WORK/recast.log" &
PIDS+=($!)
ready=no
for _ in $(seq 1 200); do
    if curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT/readyz" >/dev/null 2>&1 \
        && curl -sf -m 10 "http://127.0.0.1:$UPSTREAM_PORT/items?page=2" >/dev/null 2>&1; then
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
FIELDS='"newBodyFields":{"id":{"key":"id","type":"String"},"total":{"key":"total","type":"Int"}},"oldBodyFields":{"id":{"keys":["id"]},"total":{"keys":["total"]}}'
register() { # $1 body; prints the route's path
    curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT/v1/mapping" -H 'content-type: application/json' -d "$1" \
        | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p'
}
PAGINATE='{"items":"items","next":{"query":{"page":"$page + `1`"}},"while":"page < total_pages"}'
# The paged route maps the joined list; the single one each page's `items`.
PAGED=$(register '{"path":"paged","originalRoute":{"originalApi":{"baseUrl":"'"$UP"'"},"path":"items","paginate":'"$PAGINATE"'},"rulesAsString":{"each":"@",'"$FIELDS"'}}')
SINGLE=$(register '{"path":"single","originalRoute":{"originalApi":{"baseUrl":"'"$UP"'"},"path":"items"},"rulesAsString":{"each":["items"],'"$FIELDS"'}}')
if [ -z "$PAGED" ] || [ -z "$SINGLE" ]; then
    say "registering the routes failed; recast's log:"; cat "$WORK/recast.log" >&2; exit 1
fi
# The paged answer is the ten single answers' lists joined.
curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT$PAGED" >"$WORK/paged.out"
for page in $(seq 1 10); do curl -sf -m 10 "http://127.0.0.1:$RECAST_PORT$SINGLE?page=$page"; echo; done >"$WORK/singles.out"
python3 - "$WORK/paged.out" "$WORK/singles.out" <<'EOF'
import json, sys
paged = json.load(open(sys.argv[1]))
singles = [row for line in open(sys.argv[2]) if line.strip() for row in json.loads(line)]
assert paged == singles and len(paged) == 500, (len(paged), len(singles))
print(f"paged answer: {len(paged)} items, the ten single answers joined")
EOF

HZ=$(getconf CLK_TCK)
RECAST_PID=${PIDS[1]}
measure() { # $1 connections, $2 URL, $3 duration; prints "requests/s p50_ms p99_ms errors CPU_us_per_request"
    local out before after rps p50 p99 errors requests
    before=$(cpu_ticks "$RECAST_PID")
    out=$(wrk -t"$((THREADS < $1 ? THREADS : $1))" -c"$1" -d"$3" --latency "$2")
    after=$(cpu_ticks "$RECAST_PID")
    read -r rps p50 p99 errors requests <<<"$(wrk_figures "$out")"
    awk -v b="$before" -v a="$after" -v n="$requests" -v hz="$HZ" -v rps="$rps" -v p50="$p50" -v p99="$p99" -v e="$errors" 'BEGIN {
        split(b, x, " "); split(a, y, " "); t = (y[2] + y[3]) - (x[2] + x[3]); if (n < 1) n = 1
        printf "%s %s %s %s %.1f\n", rps, p50, p99, e, t * 1e6 / hz / n }'
}
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION; recast's CPU per call (ten pages of $(stat -c %s "$WORK/pages/page5.json") bytes)"
read -r prps pp50 pp99 perr pcpu <<<"$(measure "$CONNECTIONS" "http://127.0.0.1:$RECAST_PORT$PAGED" "$DURATION")"
read -r srps sp50 sp99 serr scpu <<<"$(measure "$CONNECTIONS" "http://127.0.0.1:$RECAST_PORT$SINGLE?page=5" "$DURATION")"
echo "| route | req/s | p50 ms | p99 ms | errors | CPU µs/call |"
echo "|---|---:|---:|---:|---:|---:|"
echo "| paged (10 pages) | $prps | $pp50 | $pp99 | $perr | $pcpu |"
echo "| single (1 page) | $srps | $sp50 | $sp99 | $serr | $scpu |"
awk -v p="$pcpu" -v s="$scpu" 'BEGIN { printf "CPU: paged call %.1f µs against ten single calls %.1f µs: %.3f× (aim ≤ 1.1×)\n", p, 10 * s, p / (10 * s) }'

echo
echo "latency, one connection (wrk -t1 -c1 -d$DURATION):"
read -r _ lp50 lp99 _ _ <<<"$(measure 1 "http://127.0.0.1:$RECAST_PORT$PAGED" "$DURATION")"
read -r _ np50 np99 _ _ <<<"$(measure 1 "http://127.0.0.1:$UPSTREAM_PORT/items?page=5" "$DURATION")"
awk -v l="$lp50" -v n="$np50" 'BEGIN { printf "paged call p50 %.3f ms; one page from nginx p50 %.3f ms, ten: %.3f ms; paged - (ten pages + 1 ms) = %+.3f ms (aim ≤ 0)\n", l, n, 10 * n, l - (10 * n + 1) }'

if [ "$ROUNDS" -gt 0 ]; then
    echo
    echo "paired: $ROUNDS rounds of $ROUND_DURATION, paged then single, -c$CONNECTIONS"
    ratios=()
    for r in $(seq 1 "$ROUNDS"); do
        read -r _ _ _ _ pc <<<"$(measure "$CONNECTIONS" "http://127.0.0.1:$RECAST_PORT$PAGED" "$ROUND_DURATION")"
        read -r _ _ _ _ sc <<<"$(measure "$CONNECTIONS" "http://127.0.0.1:$RECAST_PORT$SINGLE?page=5" "$ROUND_DURATION")"
        ratio=$(awk -v p="$pc" -v s="$sc" 'BEGIN { printf "%.3f", p / (10 * s) }')
        echo "  round $r: paged $pc µs, ten singles $(awk -v s="$sc" 'BEGIN { printf "%.1f", 10 * s }') µs: ${ratio}×"
        ratios+=("$ratio")
    done
    printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { printf "median %.3f× (lowest %.3f, highest %.3f)\n", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2), a[1], a[NR] }'
fi
