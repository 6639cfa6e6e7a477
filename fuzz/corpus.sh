#!/usr/bin/env bash
# The seed corpus of each fuzz target is one compressed archive, fuzz/corpus/TARGET.tar.gz (what
# OSS-Fuzz calls a seed corpus), which `cargo test` replays (tests/it/fuzz_corpus.rs). This
# unpacks one to a directory the fuzzer grows, runs the fuzzer on it, merges what it found down to
# the inputs that keep its coverage, and packs it again.
#
#   fuzz/corpus.sh unpack TARGET            fuzz/corpus/TARGET.tar.gz -> fuzz/corpus/TARGET/
#   fuzz/corpus.sh run TARGET SECONDS [--] [libFuzzer options...]
#                                           unpacks if needed, then fuzzes fuzz/corpus/TARGET/
#   fuzz/corpus.sh merge TARGET             shrinks fuzz/corpus/TARGET/ to the inputs that keep
#                                           its edge coverage (the fuzz build must exist)
#   fuzz/corpus.sh pack TARGET              fuzz/corpus/TARGET/ -> fuzz/corpus/TARGET.tar.gz
#
# Run from anywhere in the repository; `run` builds with `cargo fuzz` (no sanitizer; set
# SANITIZER=address for AddressSanitizer, which needs RUSTC_BOOTSTRAP=1 on stable). The unpacked
# directories are not committed (.gitignore): only the archives are.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    sed -n '2,17p' "$0" >&2
    exit 2
}

[ $# -ge 2 ] || usage
command=$1 target=$2
shift 2
archive=fuzz/corpus/$target.tar.gz
dir=fuzz/corpus/$target
# cargo fuzz builds where CARGO_TARGET_DIR says, when it is set (scripts/lib.sh sets it).
binary=${CARGO_TARGET_DIR:-fuzz/target}/x86_64-unknown-linux-gnu/release/$target

unpack() {
    [ -f "$archive" ] || { echo "no corpus archive $archive" >&2; exit 1; }
    rm -rf "$dir"
    mkdir -p "$dir"
    tar -xzf "$archive" -C "$dir"
    echo "$dir: $(find "$dir" -type f | wc -l) inputs" >&2
}

pack() {
    [ -d "$dir" ] || { echo "no corpus directory $dir (unpack it first)" >&2; exit 1; }
    # Sorted names, no owners or times: the same inputs make the same archive.
    (cd "$dir" && find . -type f -printf '%P\n' | LC_ALL=C sort |
        tar --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=0644 -cf - -T -) | gzip -n -9 >"$archive"
    echo "$archive: $(tar -tzf "$archive" | wc -l) inputs, $(du -h "$archive" | cut -f1)" >&2
}

merge() {
    [ -x "$binary" ] || { echo "build the target first: cargo fuzz build -s none $target" >&2; exit 1; }
    local merged
    merged=$(mktemp -d)
    "$binary" -merge=1 -use_counters=0 "$merged" "$dir" >&2
    rm -rf "$dir"
    mv "$merged" "$dir"
}

case $command in
    unpack) unpack ;;
    pack) pack ;;
    merge) merge ;;
    run)
        [ $# -ge 1 ] || usage
        seconds=$1
        shift
        [ "${1:-}" = "--" ] && shift
        [ -d "$dir" ] || unpack
        cargo fuzz run -s "${SANITIZER:-none}" "$target" "$dir" -- -max_total_time="$seconds" "$@"
        ;;
    *) usage ;;
esac
