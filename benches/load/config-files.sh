#!/usr/bin/env bash
# Routes as files (SPEC §2.5), on loopback, with the release build:
#  - `recast config apply` of a file of LOAD_ROUTES routes (default 1,000) to an empty service:
#    each one registered with its live call to a local nginx upstream (the recipe document);
#  - `recast config diff` of the same file against it afterwards (a dry run per route, no call);
#  - `apply` again (nothing to change, no call);
#  - a node from a file of LOAD_FILE_ROUTES routes (default 10,000): time from its start to
#    `/readyz` answering 200, and the reload after the file changed in every route (SIGHUP to the
#    log line saying it loaded), with its resident memory.
# Each step is one command that ends by itself; the script stops what it started.
#
# Settings (environment): LOAD_ROUTES, LOAD_FILE_ROUTES, LOAD_PORT (first of two ports, default
# 18390).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

ROUTES=${LOAD_ROUTES:-1000}
FILE_ROUTES=${LOAD_FILE_ROUTES:-10000}
PORT=${LOAD_PORT:-18390}
UPSTREAM_PORT=$PORT RECAST_PORT=$((PORT + 1))

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" curl python3
ensure_free_ports $UPSTREAM_PORT $RECAST_PORT
release_build

use_work_dir
write_recipe >"$WORK/recipe.json"
start_nginx upstream "
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$UPSTREAM_PORT; root $WORK; default_type application/json; }"
wait_for "http://127.0.0.1:$UPSTREAM_PORT/recipe.json"

# A file of $1 routes, each calling the recipe with its own rules; $2 the name of its one output
# member (so that a second file changes every route).
write_file() {
    python3 - "$1" "$2" "$UPSTREAM_PORT" <<'EOF'
import sys
n, member, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
print("routes:")
for i in range(n):
    print(f"""  - name: route-{i}
    path: meals/{i}
    originalRoute:
      originalApi: {{baseUrl: "http://127.0.0.1:{port}/"}}
      path: recipe.json
    authHeader: {{type: Bearer, token: "${{env:LOAD_UPSTREAM_TOKEN}}"}}
    rulesAsString:
      newBodyFields:
        id: {{key: id, type: Int}}
        {member}: {{key: {member}, type: String}}
        area: {{key: area, type: String}}
      oldBodyFields:
        id: {{keys: [idMeal], parents: [meals]}}
        {member}: {{keys: [strMeal], parents: [meals]}}
        area: {{keys: [strArea], parents: [meals]}}""")
EOF
}
export LOAD_UPSTREAM_TOKEN=load-token
seconds() { python3 -c "import time; print(f'{time.monotonic():.3f}')"; }
elapsed() { python3 -c "print(f'{$2 - $1:.2f}')"; }

write_file "$ROUTES" name >"$WORK/routes.yaml"
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 RECAST_LOG=warn \
    "$RECAST" serve >"$WORK/recast.log" 2>&1 &
RECAST_PID=$!
PIDS+=("$RECAST_PID")
wait_for "http://127.0.0.1:$RECAST_PORT/readyz"
export RECAST_URL=http://127.0.0.1:$RECAST_PORT

"$RECAST" config validate "$WORK/routes.yaml"
t0=$(seconds)
"$RECAST" config apply "$WORK/routes.yaml" --owner load | tail -n 1
t1=$(seconds)
"$RECAST" config diff "$WORK/routes.yaml" --owner load | tail -n 1
t2=$(seconds)
"$RECAST" config apply "$WORK/routes.yaml" --owner load | tail -n 1
t3=$(seconds)
echo "apply of $ROUTES routes to an empty service: $(elapsed "$t0" "$t1") s (one live call each)"
echo "diff of the same file afterwards: $(elapsed "$t1" "$t2") s"
echo "apply again (nothing to change, no call): $(elapsed "$t2" "$t3") s"
kill "$RECAST_PID"
wait "$RECAST_PID" 2>/dev/null || true

# A node from a file.
write_file "$FILE_ROUTES" name >"$WORK/big.yaml"
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_ROUTES_FILE=$WORK/big.yaml RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
    RECAST_LOG=info RECAST_DATA_DIR=$WORK/unused "$RECAST" serve >"$WORK/node.log" 2>&1 &
NODE_PID=$!
PIDS+=("$NODE_PID")
t0=$(seconds)
for _ in $(seq 1 6000); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RECAST_PORT/readyz")" = 200 ] && break
    sleep 0.01
done
t1=$(seconds)
echo "node from a file of $FILE_ROUTES routes: ready $(elapsed "$t0" "$t1") s after its start ($(grep -o 'took_ms=[0-9]*' "$WORK/node.log" | head -n 1) to load)"
uuid=$(python3 -c "import uuid; print(uuid.uuid5(uuid.UUID(int=0x72656361737440008000726f75746573), 'route-7'))")
curl -s "http://127.0.0.1:$RECAST_PORT/v1/$uuid/meals/7"; echo
write_file "$FILE_ROUTES" title >"$WORK/big.next"
mv "$WORK/big.next" "$WORK/big.yaml"
t0=$(seconds)
kill -HUP "$NODE_PID"
for _ in $(seq 1 6000); do
    [ "$(grep -c 'routes file loaded' "$WORK/node.log")" -ge 2 ] && break
    sleep 0.01
done
t1=$(seconds)
echo "reload of $FILE_ROUTES changed routes: $(elapsed "$t0" "$t1") s from SIGHUP to loaded ($(grep 'routes file loaded' "$WORK/node.log" | tail -n 1 | grep -o 'took_ms=[0-9]*'))"
curl -s "http://127.0.0.1:$RECAST_PORT/v1/$uuid/meals/7"; echo
echo "node's resident memory: $(awk '/VmRSS/ {print $2, $3}' "/proc/$NODE_PID/status")"
