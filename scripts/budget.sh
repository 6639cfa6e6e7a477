#!/usr/bin/env bash
# The performance budget: counts the instructions recast executes per call of the recipe, list,
# expression, composed and traced routes (benches/load/instructions.sh, callgrind: steady from
# run to run on a machine whose speed drifts) and fails when one is more than 3% above its count
# in benches/budget.json. A change that must cost more runs `scripts/budget.sh --update`, which
# writes this build's counts there, and says why in the same commit.
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

counts=$(mktemp)
trap 'rm -f "$counts"' EXIT
LOAD_COUNTS=$counts benches/load/instructions.sh >&2

# The count of `$2` in the one-line JSON object of file $1.
count_of() { sed -n 's/.*"'"$2"'": *\([0-9][0-9]*\).*/\1/p' "$1"; }

if $update; then
    cp "$counts" "$BUDGET"
    say "$BUDGET now holds this build's counts: $(cat "$counts")"
    exit 0
fi
[ -f "$BUDGET" ] || { say "$BUDGET is missing: run scripts/budget.sh --update to write it"; exit 1; }

over=()
printf '\n| call | budget | this build | this build / budget |\n|---|---:|---:|---:|\n'
for name in recipe list expr composed traced; do
    budget=$(count_of "$BUDGET" "$name")
    now=$(count_of "$counts" "$name")
    if [ -z "$budget" ] || [ -z "$now" ]; then
        say "no count of $name in $BUDGET or in this build's counts"
        exit 1
    fi
    awk -v n="$name" -v b="$budget" -v c="$now" 'BEGIN { printf "| %s | %d | %d | %.4f× |\n", n, b, c, c / b }'
    if [ $((now * 100)) -gt $((budget * (100 + SLACK))) ]; then
        over+=("$name")
    fi
done
if [ ${#over[@]} -gt 0 ]; then
    say "over the budget by more than $SLACK%: ${over[*]}. Make the change cost less, or, if it must cost more, run scripts/budget.sh --update and say why in the commit"
    exit 1
fi
say "every call is within $SLACK% of its budget"
