#!/usr/bin/env bash
# The previews of the review that found one preview could take the process down, sent to a
# running recast one at a time: for each, the answer's status and problem type, how long it took,
# and how much the process's peak resident memory (VmHWM) grew. Each case is bounded in time
# (curl gives up after LOAD_CASE_SECONDS) and the process in memory (it runs under `prlimit
# --as`, LOAD_MEMORY_MB of address space), so a binary without the bounds is stopped, not the
# machine.
#
#   benches/load/bounds.sh [BINARY]    (default: this checkout's release build, built first)
#
# Settings (environment): LOAD_PORT (default 18290), LOAD_CASE_SECONDS (default 20),
# LOAD_MEMORY_MB (default 6144).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh

PORT=${LOAD_PORT:-18290}
CASE_SECONDS=${LOAD_CASE_SECONDS:-20}
MEMORY_MB=${LOAD_MEMORY_MB:-6144}

ensure_packages curl python3 util-linux
ensure_free_ports "$PORT"
if [ $# -ge 1 ]; then
    RECAST=$1
else
    ensure_toolchain
    use_ccache
    announce_rocksdb release
    cargo build --release --locked --bin recast
    RECAST="$CARGO_TARGET_DIR/release/recast"
fi

use_work_dir

start() {
    RECAST_LISTEN=127.0.0.1:$PORT RECAST_DATA_DIR=$WORK/data RECAST_LOG=warn \
        prlimit --as=$((MEMORY_MB << 20)) "$RECAST" serve >>"$WORK/recast.log" 2>&1 &
    RECAST_PID=$!
    PIDS+=("$RECAST_PID")
    wait_for "http://127.0.0.1:$PORT/healthz"
}

peak_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$RECAST_PID/status" 2>/dev/null || echo 0; }

# The preview bodies: a sample and rules with one target `v` read by an expression.
python3 - "$WORK" <<'PYTHON'
import json, sys
work = sys.argv[1]
numbers = {"xs": list(range(20000))}
doubled = "xs" + " | [@, @]" * 30
text = {"s": "x" * 20000, "n": ["ab"] * 20000}
pairs = {"p": [["k%d" % i, i] for i in range(40000)]}
slices = {"xs": [0, 1, 2, 3]}
cases = [
    ("doubled-30-json", numbers, doubled, "Json", ""),
    ("doubled-30-traced", numbers, doubled, "Json", "?trace=true"),
    ("doubled-30-compared", numbers, doubled + " | @ == @", "Boolean", ""),
    ("doubled-30-to_string", numbers, doubled + " | to_string(@)", "String", ""),
    ("replace-empty-20k", text, "replace(s, '', s)", "String", ""),
    ("contains-filter-20k", numbers, "length(xs[?contains($.xs, @)])", "Int", ""),
    ("from_items-40k", pairs, "length(keys(from_items(p)))", "Int", ""),
    ("slice-step-max", slices, "xs[1::9223372036854775807]", "Json", ""),
    ("regex-any-length-200k", {"s": "A" * 200000}, "regex_replace(s, '.*[^A-Z]|[A-Z]', '')", "String", ""),
    ("needle-500k-per-element", {"s": "ab" * 250000, "xs": ["ab"] * 20000},
     "length(xs[?replace(@, $.s, '') == 'ab'])", "Int", ""),
]
# Rules that read and write with `keys` alone.
big = {"b": "y" * 100000, "blank": " " * 200000}
def keys_rules(names, ignore=False, parents=None):
    old = {"keys": names}
    if parents:
        old["parents"] = parents
    return {"ignoreEmptyValues": ignore, "newBodyFields": {"v": {"key": "v", "type": "String"}},
            "oldBodyFields": {"v": old}}
long_name = "n" * 100000
ruled = [
    ("keys-repeated-1500", big, keys_rules(["b"] * 1500), ""),
    ("keys-blank-20000", big, keys_rules(["blank"] * 20000, ignore=True), ""),
    ("trace-long-name-5000", {long_name: {"x": 1}}, keys_rules(["x"] * 5000, parents=[long_name]), "?trace=true"),
]
with open(f"{work}/cases", "w") as listing:
    for name, sample, rules, query in ruled:
        with open(f"{work}/{name}.json", "w") as f:
            json.dump({"originalResponse": sample, "mappingRules": rules}, f)
        listing.write(f"{name} {query}\n")
    for name, sample, expr, ty, query in cases:
        body = {"originalResponse": sample, "mappingRules": {
            "newBodyFields": {"v": {"key": "v", "type": ty}},
            "oldBodyFields": {"v": {"expr": expr}}}}
        with open(f"{work}/{name}.json", "w") as f:
            json.dump(body, f)
        listing.write(f"{name} {query}\n")
PYTHON

start
curl -s -o /dev/null "http://127.0.0.1:$PORT/v1/preview" -H 'content-type: application/json' \
    -d '{"originalResponse":{"a":1},"mappingRules":{"newBodyFields":{"v":{"key":"v","type":"Int"}},"oldBodyFields":{"v":{"expr":"a"}}}}'
printf '| case | answer | time | peak memory grew by |\n|---|---|---:|---:|\n'
while read -r name query; do
    if ! kill -0 "$RECAST_PID" 2>/dev/null; then
        start
    fi
    before=$(peak_kib)
    out=$(curl -s -m "$CASE_SECONDS" -o "$WORK/answer" -w '%{http_code} %{time_total}' \
        "http://127.0.0.1:$PORT/v1/preview$query" -H 'content-type: application/json' \
        --data-binary "@$WORK/$name.json" || true)
    code=${out%% *} seconds=${out##* }
    kind=$(python3 -c 'import json,sys
try:
    print(json.load(open(sys.argv[1])).get("type", "").rsplit("/", 1)[-1] or "-")
except Exception:
    print("-")' "$WORK/answer" 2>/dev/null || echo -)
    after=$(peak_kib)
    if ! kill -0 "$RECAST_PID" 2>/dev/null; then
        what="process died (${MEMORY_MB} MiB of address space)"
    elif [ "$code" = "000" ]; then
        what="no answer within ${CASE_SECONDS} s"
    else
        what="$code $kind"
    fi
    grown="$(( (after - before) / 1024 )) MiB"
    [ "$after" -gt 0 ] || grown=-
    printf '| %s | %s | %s ms | %s |\n' "$name$query" "$what" "$(awk -v s="$seconds" 'BEGIN { printf "%.0f", s * 1000 }')" "$grown"
    if [ "$code" = "000" ] && kill -0 "$RECAST_PID" 2>/dev/null; then
        # Still mapping: stopped, and started again for the next case.
        kill -9 "$RECAST_PID" 2>/dev/null || true
        wait "$RECAST_PID" 2>/dev/null || true
    fi
done <"$WORK/cases"
