#!/usr/bin/env bash
# The performance budget: counts the instructions recast executes per call of the recipe, list,
# expression, composed and traced routes (benches/load/instructions.sh, callgrind: steady from
# run to run on a machine whose speed drifts) and fails when one is more than 3% above its count
# in benches/budget.json. A change that must cost more runs `scripts/budget.sh --update`, which
# writes this build's counts there, and says why in the same commit; one that costs more than 3%
# less is told to, so the budget follows it down. The counts are a kind of machine's: the JSON
# index takes another path without AVX2, so a budget counted with AVX2 is not compared on a CPU
# without it (nor the other way round); that is said in one line.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

BUDGET=benches/budget.json
# Per cent above its budget a count may be.
SLACK=3
update=false
case "${1:-}" in
    --update) update=true ;;
    "") ;;
    *) say "usage: scripts/budget.sh [--update]"; exit 2 ;;
esac

# The count of `$2` in the one-line JSON object of file $1.
count_of() { sed -n 's/.*"'"$2"'": *\([0-9][0-9]*\).*/\1/p' "$1"; }

avx2=0
grep -qw avx2 /proc/cpuinfo && avx2=1
if ! $update; then
    [ -f "$BUDGET" ] || { say "$BUDGET is missing: run scripts/budget.sh --update to write it"; exit 1; }
    if [ "$(count_of "$BUDGET" avx2)" != "$avx2" ]; then
        say "the budget in $BUDGET was counted on a CPU $([ "$avx2" = 1 ] && echo without || echo with) AVX2, unlike this one: not compared (scripts/budget.sh --update writes one for this machine)"
        exit 0
    fi
fi

counts=$(mktemp)
trap 'rm -f "$counts"' EXIT
LOAD_COUNTS=$counts benches/load/instructions.sh >&2

if $update; then
    sed 's/^{/{"avx2": '"$avx2"', /' "$counts" >"$BUDGET"
    say "$BUDGET now holds this build's counts: $(cat "$BUDGET")"
    exit 0
fi

over=() under=()
printf '\n| call | budget | this build | this build / budget |\n|---|---:|---:|---:|\n'
for name in recipe list expr composed traced key jwt; do
    budget=$(count_of "$BUDGET" "$name")
    now=$(count_of "$counts" "$name")
    if [ -z "$budget" ] || [ -z "$now" ] || [ "$budget" = 0 ] || [ "$now" = 0 ]; then
        say "no count of $name in $BUDGET or in this build's counts"
        exit 1
    fi
    awk -v n="$name" -v b="$budget" -v c="$now" 'BEGIN { printf "| %s | %d | %d | %.4f× |\n", n, b, c, c / b }'
    if [ $((now * 100)) -gt $((budget * (100 + SLACK))) ]; then
        over+=("$name")
    elif [ $((now * 100)) -lt $((budget * (100 - SLACK))) ]; then
        under+=("$name")
    fi
done
if [ ${#over[@]} -gt 0 ]; then
    say "over the budget by more than $SLACK%: ${over[*]}. Make the change cost less, or, if it must cost more, run scripts/budget.sh --update and say why in the commit"
    exit 1
fi
if [ ${#under[@]} -gt 0 ]; then
    say "more than $SLACK% under the budget: ${under[*]}. Well done: run scripts/budget.sh --update so the budget keeps the gain"
fi
say "no call is more than $SLACK% over its budget"
