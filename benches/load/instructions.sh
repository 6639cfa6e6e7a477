#!/usr/bin/env bash
# The user-space instructions recast executes per route call, counted by valgrind's callgrind:
# unlike CPU time under load, the count hardly moves from run to run, so a change of a few per
# cent in the fixed cost of a call shows, on a machine whose speed drifts. An nginx upstream on
# loopback serves the recipe (3 KB) and list (97 KB) documents of run.sh; recast runs under
# callgrind with instrumentation off, serves the same routes as run.sh, and for each document the
# count starts after 205 calls (so that what is done once, such as the first batch of spans
# sent to a collector, is done before it) and covers LOAD_CALLS more, one after another on one
# kept-alive connection; and for the list read by one expression that names one of its two top-level
# members (`expr`: the other, the items, is skipped). Then the same for compose.sh's three-source
# composition of the recipe against the single route that maps the same fields, three times (the
# aim: a composed call at most 1.1× its three single calls). Last, `traced`: the recipe route of
# a second process of the same build that records every call's spans and exports them to a local
# receiver (nginx answering 200 to `POST /v1/traces`). And the recipe route with `callers`,
# called with a consumer's API key, and with one RS256 token again and again (each repeated on
# the one connection, as a client does), against the open recipe call and against the open
# recipe call sent with the same header, which leaves out the header's own reading. The
# kernel's work (sockets) and the upstream's are not counted: this measures recast's own code,
# not a call's whole cost (run.sh does).
#
# Settings (environment): LOAD_CALLS (default 200), LOAD_PORT (first of five ports, default
# 18180), LOAD_BEFORE (the path of another recast binary, counted the same way; a column gives
# this build's count against it), LOAD_PROFILES (a directory: each count's callgrind file is kept
# there as <build>-<count>.callgrind, for `callgrind_annotate`), LOAD_COUNTS (a file: this
# build's counts are written there as JSON, `{"recipe": N, ...}`, which scripts/budget.sh reads).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

CALLS=${LOAD_CALLS:-200}
PORT=${LOAD_PORT:-18180}
BEFORE=${LOAD_BEFORE:-}
PROFILES=${LOAD_PROFILES:-}
COUNTS=${LOAD_COUNTS:-}
[ -z "$PROFILES" ] || mkdir -p "$PROFILES"
UPSTREAM_PORT=$PORT RECEIVER_PORT=$((PORT + 3))
if [ -n "$BEFORE" ] && [ ! -x "$BEFORE" ]; then
    say "LOAD_BEFORE=$BEFORE is not an executable recast binary"
    exit 1
fi

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" valgrind curl
ensure_free_ports $PORT $((PORT + 1)) $((PORT + 2)) $RECEIVER_PORT $((PORT + 4))
use_ccache
announce_rocksdb release
cargo build --release --locked --bin recast
use_work_dir

write_recipe >"$WORK/recipe.json"
write_list >"$WORK/list.json"
# compose.sh's sources: the recipe at a, b and c/52772 (its idMeal).
mkdir -p "$WORK/c"
cp "$WORK/recipe.json" "$WORK/a"
cp "$WORK/recipe.json" "$WORK/b"
cp "$WORK/recipe.json" "$WORK/c/52772"
start_nginx upstream "    keepalive_requests 1000000;
    client_max_body_size 64m;
    server { listen 127.0.0.1:$UPSTREAM_PORT; root $WORK; default_type application/json; }
    server { listen 127.0.0.1:$RECEIVER_PORT; location = /v1/traces { return 200; } }"
wait_for "http://127.0.0.1:$UPSTREAM_PORT/recipe.json"

# Starts a recast binary ($2) under callgrind on port $3, named $1, with its routes (and the
# environment assignments after them); sets <name>_PID, <name>_recipe, <name>_list, <name>_expr,
# <name>_composed and <name>_single.
start() {
    local name=$1 binary=$2 port=$3 doc rules file path body
    shift 3
    env RECAST_LISTEN=127.0.0.1:$port RECAST_DATA_DIR=$WORK/$name-data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 RECAST_LOG=warn "$@" \
        valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/$name.callgrind" \
        "$binary" serve 2>>"$WORK/$name.log" &
    PIDS+=($!)
    printf -v "${name}_PID" '%s' "$!"
    for _ in $(seq 1 600); do
        curl -sf -m 5 -o /dev/null "http://127.0.0.1:$port/readyz" && break
        sleep 0.1
    done
    for doc in recipe list expr; do
        rules=$RECIPE_RULES file=$doc
        [ "$doc" = list ] && rules=$LIST_RULES
        [ "$doc" = expr ] && rules=$EXPR_RULES file=list
        path=$(curl -sf -m 60 "http://127.0.0.1:$port/v1/mapping" -H 'content-type: application/json' -d \
            '{"path":"'"$doc"'","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"'"$file"'.json"},"rulesAsString":'"$rules"'}' \
            | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p')
        if [ -z "$path" ]; then
            say "$name did not register the $doc route; its log:"; cat "$WORK/$name.log" >&2; exit 1
        fi
        printf -v "${name}_$doc" '%s' "http://127.0.0.1:$port$path"
    done
    for doc in composed single; do
        body=$(composition composed "http://127.0.0.1:$UPSTREAM_PORT/" 0)
        [ "$doc" = single ] && body='{"path":"single","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"a"},"rulesAsString":'"$COMPOSED_SINGLE_RULES"'}'
        path=$(curl -sf -m 60 "http://127.0.0.1:$port/v1/mapping" -H 'content-type: application/json' -d "$body" \
            | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p')
        if [ -z "$path" ]; then
            say "$name did not register the $doc route; its log:"; cat "$WORK/$name.log" >&2; exit 1
        fi
        printf -v "${name}_$doc" '%s' "http://127.0.0.1:$port$path"
    done
}

# Routes with `callers` on the instance named $1 (port $2): `key`, the recipe route taking any
# consumer's key, called with one (KEY_HEADER); `jwt`, the recipe route taking RS256 tokens whose
# key set nginx serves, called with one token again and again (JWT_HEADER). Sets <name>_key and
# <name>_jwt.
start_callers() {
    local name=$1 port=$2 path key token
    write_signing_key "$WORK"
    for doc in key jwt; do
        callers='{"consumers":["*"]}'
        [ "$doc" = jwt ] && callers=$(jwt_callers "http://127.0.0.1:$UPSTREAM_PORT/keys.json")
        path=$(curl -sf -m 60 "http://127.0.0.1:$port/v1/mapping" -H 'content-type: application/json' -d \
            '{"path":"'"$doc"'","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"recipe.json"},"callers":'"$callers"',"rulesAsString":'"$RECIPE_RULES"'}' \
            | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p')
        if [ -z "$path" ]; then
            say "$name did not register the $doc route; its log:"; cat "$WORK/$name.log" >&2; exit 1
        fi
        printf -v "${name}_$doc" '%s' "http://127.0.0.1:$port$path"
    done
    curl -sf -m 10 -o /dev/null "http://127.0.0.1:$port/v1/consumers" -H 'content-type: application/json' -d '{"name":"load"}'
    key=$(curl -sf -m 10 -X POST "http://127.0.0.1:$port/v1/consumers/load/keys" | sed -n 's/.*"key":"\(rk_[^"]*\)".*/\1/p')
    token=$(sign_token "$WORK/jwt.pem" '{"iss":"'"$LOAD_ISSUER"'","aud":"load","sub":"caller-1","exp":'"$(($(date +%s) + 86400))"'}')
    KEY_HEADER="x-api-key: $key" JWT_HEADER="authorization: Bearer $token"
}

HEADER=
calls() { # $1 URL, $2 how many: one after another on one connection (with HEADER when set), each answer a 200
    local urls=() i codes headers=()
    # `-o` holds for the one URL after it: each is given its own.
    for ((i = 0; i < $2; i++)); do urls+=(-o /dev/null "$1"); done
    [ -n "$HEADER" ] && headers=(-H "$HEADER")
    if ! codes=$(curl -s "${headers[@]}" -w '%{http_code}\n' "${urls[@]}") || grep -qv '^200$' <<<"$codes"; then
        say "a call of $1 did not answer 200"; exit 1
    fi
}

count() { # $1 name, $2 URL, $3 what is counted: instructions per call
    local pid=${1}_PID file
    pid=${!pid}
    calls "$2" 200
    callgrind_control -i on "$pid" >/dev/null 2>&1
    calls "$2" 5
    callgrind_control -z "$pid" >/dev/null 2>&1
    calls "$2" "$CALLS"
    rm -f "$WORK/$1.callgrind".*
    callgrind_control -d "$pid" >/dev/null 2>&1
    callgrind_control -i off "$pid" >/dev/null 2>&1
    for _ in $(seq 1 100); do
        file=$(ls "$WORK/$1.callgrind".* 2>/dev/null | head -n 1)
        [ -n "$file" ] && break
        sleep 0.1
    done
    [ -z "$PROFILES" ] || cp "$file" "$PROFILES/$1-$3.callgrind"
    local counted
    counted=$(callgrind_annotate "$file" 2>/dev/null | awk -v n="$CALLS" '/PROGRAM TOTALS/ { gsub(",", "", $1); printf "%.0f", $1 / n }')
    if ! [[ "$counted" =~ ^[1-9][0-9]*$ ]]; then
        say "callgrind counted nothing for $3 ($1): its file is ${file:-missing}"; exit 1
    fi
    printf '%s' "$counted"
}

start now "$CARGO_TARGET_DIR/release/recast" $((PORT + 1))
start_callers now $((PORT + 1))
[ -n "$BEFORE" ] && start before "$BEFORE" $((PORT + 2))
# Every span recorded and exported (the default sampler, a call with no `traceparent` starting
# a sampled trace).
start traced "$CARGO_TARGET_DIR/release/recast" $((PORT + 4)) OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$RECEIVER_PORT"
declare -A MEASURED
echo "instructions per route call (callgrind, user space, $CALLS calls after 205 on one connection)"
if [ -n "$BEFORE" ]; then
    echo "| document | this build | LOAD_BEFORE | this build / LOAD_BEFORE |"
    echo "|---|---:|---:|---:|"
else
    echo "| document | this build |"
    echo "|---|---:|"
fi
for doc in recipe list expr; do
    url=now_$doc
    now=$(count now "${!url}" "$doc")
    MEASURED[$doc]=$now
    if [ -n "$BEFORE" ]; then
        url=before_$doc
        then=$(count before "${!url}" "$doc")
        awk -v d="$doc" -v a="$now" -v b="$then" 'BEGIN { printf "| %s | %d | %d | %.4f× |\n", d, a, b, a / b }'
    else
        printf '| %s | %d |\n' "$doc" "$now"
    fi
done
echo
echo "compose.sh's three-source composition of the recipe against its single route (instructions per call)"
echo "| build | composed call | single-route call | composed / 3 singles |"
echo "|---|---:|---:|---:|"
for name in now ${BEFORE:+before}; do
    url=${name}_composed
    composed=$(count "$name" "${!url}" composed)
    url=${name}_single
    single=$(count "$name" "${!url}" single)
    label="this build"; [ "$name" = before ] && label=LOAD_BEFORE
    [ "$name" = now ] && MEASURED[composed]=$composed
    awk -v l="$label" -v c="$composed" -v s="$single" 'BEGIN { printf "| %s | %d | %d | %.3f× |\n", l, c, s, c / (3 * s) }'
done
echo
echo "the recipe route with callers: a consumer's API key, and one RS256 token repeated (instructions per call);"
echo "against the open recipe call, and against the open recipe call sent with the same header (which it"
echo "ignores): the second leaves out reading the header itself, and so gives what the check costs"
echo "| credential | instructions | / open call | open call with the header | / that |"
echo "|---|---:|---:|---:|---:|"
MEASURED[key]=$(HEADER=$KEY_HEADER count now "$now_key" key)
open_key=$(HEADER=$KEY_HEADER count now "$now_recipe" recipe-key)
MEASURED[jwt]=$(HEADER=$JWT_HEADER count now "$now_jwt" jwt)
open_jwt=$(HEADER=$JWT_HEADER count now "$now_recipe" recipe-jwt)
awk -v k="${MEASURED[key]}" -v ok="$open_key" -v j="${MEASURED[jwt]}" -v oj="$open_jwt" -v r="${MEASURED[recipe]}" \
    'BEGIN { printf "| key | %d | %.4f× | %d | %.4f× |\n| jwt | %d | %.4f× | %d | %.4f× |\n", k, k / r, ok, k / ok, j, j / r, oj, j / oj }'
HEADER=
echo
echo "the recipe route with every span recorded and exported (instructions per call)"
MEASURED[traced]=$(count traced "$traced_recipe" traced)
awk -v t="${MEASURED[traced]}" -v r="${MEASURED[recipe]}" 'BEGIN { printf "| traced | %d | %.3f× the untraced recipe call |\n", t, t / r }'
if [ -n "$COUNTS" ]; then
    printf '{"recipe": %d, "list": %d, "expr": %d, "composed": %d, "traced": %d, "key": %d, "jwt": %d}\n' \
        "${MEASURED[recipe]}" "${MEASURED[list]}" "${MEASURED[expr]}" "${MEASURED[composed]}" "${MEASURED[traced]}" \
        "${MEASURED[key]}" "${MEASURED[jwt]}" >"$COUNTS"
fi
