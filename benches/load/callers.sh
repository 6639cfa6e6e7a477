#!/usr/bin/env bash
# Load benchmark of a route with callers (docs/callers.md), on loopback, one machine: the recipe
# route (3 KB, served by nginx) called (a) open, (b) with one consumer's API key, and (c) taking
# RS256 tokens, by 1,000 distinct callers each repeating its own token (wrk's Lua picks the next
# of 1,000 tokens for each request, so every token is verified once, then answered by the memory
# of verified tokens), each for LOAD_DURATION, at each of LOAD_CONNECTIONS. Prints, for each, the
# calls per second, p50 and p99, and recast's CPU per call (user and system, all its threads,
# from /proc) against the open route's; and how many tokens recast verified (its metrics). The
# runs go open, key, jwt, then again jwt, key, open, and the table gives the mean of the two, so a
# drift of the machine's speed does not fall on one side.
#
# Settings (environment): LOAD_DURATION (default 10s), LOAD_CONNECTIONS (default "16 64"),
# LOAD_THREADS (wrk threads, default 2), LOAD_PORT (first of two ports, default 18280), LOAD_TOKENS
# (distinct callers, default 1000).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. benches/load/common.sh

DURATION=${LOAD_DURATION:-10s}
CONNECTIONS=${LOAD_CONNECTIONS:-16 64}
THREADS=${LOAD_THREADS:-2}
PORT=${LOAD_PORT:-18280}
TOKENS=${LOAD_TOKENS:-1000}
UPSTREAM_PORT=$PORT RECAST_PORT=$((PORT + 1))

ensure_toolchain
ensure_nginx
ensure_packages "${BUILD_PACKAGES[@]}" wrk curl openssl
ensure_free_ports $UPSTREAM_PORT $RECAST_PORT
release_build
use_work_dir

write_recipe >"$WORK/recipe.json"
write_signing_key "$WORK"
start_nginx upstream "    keepalive_requests 1000000;
    server { listen 127.0.0.1:$UPSTREAM_PORT; root $WORK; default_type application/json; }"
wait_for "http://127.0.0.1:$UPSTREAM_PORT/recipe.json"
mkdir -p "$WORK/data"
RECAST_LISTEN=127.0.0.1:$RECAST_PORT RECAST_DATA_DIR=$WORK/data RECAST_UPSTREAM_ALLOW=127.0.0.1/32 \
    RECAST_LOG=warn "$RECAST" serve 2>>"$WORK/recast.log" &
RECAST_PID=$!
PIDS+=($RECAST_PID)
wait_for "http://127.0.0.1:$RECAST_PORT/readyz"

register() { # $1 path, $2 callers (JSON, or empty): the route's public path
    local callers=
    [ -n "$2" ] && callers=',"callers":'"$2"
    curl -sf -m 60 "http://127.0.0.1:$RECAST_PORT/v1/mapping" -H 'content-type: application/json' -d \
        '{"path":"'"$1"'","originalRoute":{"originalApi":{"baseUrl":"http://127.0.0.1:'"$UPSTREAM_PORT"'/"},"path":"recipe.json"}'"$callers"',"rulesAsString":'"$RECIPE_RULES"'}' \
        | sed -n 's/.*"path":"\(\/v1\/[^"]*\)".*/\1/p'
}
OPEN=$(register open '')
KEYED=$(register keyed '{"consumers":["*"]}')
SIGNED=$(register signed "$(jwt_callers "http://127.0.0.1:$UPSTREAM_PORT/keys.json")")
curl -sf -m 10 -o /dev/null "http://127.0.0.1:$RECAST_PORT/v1/consumers" -H 'content-type: application/json' -d '{"name":"load"}'
KEY=$(curl -sf -m 10 -X POST "http://127.0.0.1:$RECAST_PORT/v1/consumers/load/keys" | sed -n 's/.*"key":"\(rk_[^"]*\)".*/\1/p')

# The tokens of TOKENS callers (`sub` caller-1 …), as a Lua table wrk's script picks from in turn.
say "signing $TOKENS tokens"
expires=$(($(date +%s) + 86400))
{
    echo 'local tokens = {'
    for ((i = 1; i <= TOKENS; i++)); do
        printf '"%s",\n' "$(sign_token "$WORK/jwt.pem" '{"iss":"'"$LOAD_ISSUER"'","aud":"load","sub":"caller-'"$i"'","exp":'"$expires"'}')"
    done
    cat <<'EOF'
}
local n = 0
request = function()
    n = n + 1
    return wrk.format(nil, nil, { ["authorization"] = "Bearer " .. tokens[(n % #tokens) + 1] })
end
EOF
} >"$WORK/tokens.lua"
printf 'wrk.headers["x-api-key"] = "%s"\n' "$KEY" >"$WORK/key.lua"
for url in "$OPEN" "$KEYED" "$SIGNED"; do
    [ -n "$url" ] || { say "a route was not registered; recast's log:"; cat "$WORK/recast.log" >&2; exit 1; }
done
code=$(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $KEY" "http://127.0.0.1:$RECAST_PORT$KEYED")
[ "$code" = 200 ] || { say "the keyed route answered $code"; exit 1; }

ticks_of() { cpu_ticks "$RECAST_PID" | awk '{ split($0, a, " "); print a[2] + a[3] }'; }

# One run: $1 name, $2 path, $3 connections, $4 the Lua script (or none). Sets RUN_<name>="rps p50 p99 cpu_us"
run() {
    local script=() before after text figures
    [ -n "$4" ] && script=(-s "$4")
    before=$(ticks_of)
    text=$(wrk -t"$THREADS" -c"$3" -d"$DURATION" --latency "${script[@]}" "http://127.0.0.1:$RECAST_PORT$2")
    after=$(ticks_of)
    figures=$(wrk_figures "$text")
    read -r rps p50 p99 errors requests <<<"$figures"
    if [ "$errors" != 0 ]; then
        say "$1: $errors answers were not 2xx"; echo "$text" >&2; exit 1
    fi
    local hz
    hz=$(getconf CLK_TCK)
    awk -v r="$requests" -v t=$((after - before)) -v hz="$hz" -v rps="$rps" -v p50="$p50" -v p99="$p99" \
        'BEGIN { printf "%s %s %s %.2f\n", rps, p50, p99, t / hz * 1e6 / r }'
}

echo "the recipe route, open, with an API key, and taking RS256 tokens from $TOKENS callers ($DURATION a run, the mean of two)"
echo "| connections | route | calls/s | p50 ms | p99 ms | CPU µs per call | CPU against the open route |"
echo "|---:|---|---:|---:|---:|---:|---:|"
for c in $CONNECTIONS; do
    declare -A SUM=()
    for order in "open keyed signed" "signed keyed open"; do
        for name in $order; do
            case $name in
                open) path=$OPEN script= ;;
                keyed) path=$KEYED script=$WORK/key.lua ;;
                signed) path=$SIGNED script=$WORK/tokens.lua ;;
            esac
            result=$(run "$name" "$path" "$c" "$script")
            SUM[$name]="${SUM[$name]:-} $result"
        done
    done
    open_cpu=$(awk '{ print ($4 + $8) / 2 }' <<<"${SUM[open]}")
    for name in open keyed signed; do
        awk -v c="$c" -v n="$name" -v o="$open_cpu" '{ printf "| %s | %s | %.0f | %.3f | %.3f | %.2f | %.3f× |\n", c, n, ($1 + $5) / 2, ($2 + $6) / 2, ($3 + $7) / 2, ($4 + $8) / 2, ($4 + $8) / 2 / o }' <<<"${SUM[$name]}"
    done
done
echo
curl -sf "http://127.0.0.1:$RECAST_PORT/metrics" | grep -E '^recast_(callers_admitted_total|verified_tokens|key_set_fetches_total\{reason="new")' || true
