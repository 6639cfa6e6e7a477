# Shared by the scripts: makes sure what building recast needs is present on a Debian machine,
# installing Debian packages when it can, or saying in one line what is missing.

say() { printf 'recast: %s\n' "$*" >&2; }

# A load script's scratch directory, $WORK (readable by nginx's workers, which run as an
# unprivileged user when started as root), and $PIDS: the processes it starts, stopped with the
# directory removed when the script exits.
use_work_dir() {
    WORK=$(mktemp -d)
    chmod 755 "$WORK"
    PIDS=()
    trap stop_work EXIT
}
stop_work() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}

# Starts nginx (one worker) in $WORK on a configuration named $1 whose http block holds $2, every
# file it writes in $WORK; adds it to $PIDS.
start_nginx() {
    local name=$1 body=$2 kind
    {
        printf 'worker_processes 1;\npid %s;\nerror_log %s warn;\nevents { worker_connections 4096; }\n' \
            "$WORK/$name.pid" "$WORK/$name-error.log"
        printf 'http {\n    access_log off;\n'
        for kind in client_body proxy fastcgi uwsgi scgi; do printf '    %s_temp_path %s;\n' "$kind" "$WORK/$name-$kind"; done
        printf '%s\n}\n' "$body"
    } >"$WORK/$name.conf"
    nginx -p "$WORK" -c "$WORK/$name.conf" -g 'daemon off;' 2>>"$WORK/$name-error.log" &
    PIDS+=($!)
}

# Waits until $1 (a URL) answers at all, for up to ten seconds; stops the script if it does not.
wait_for() {
    for _ in $(seq 1 200); do
        curl -sk -o /dev/null "$1" && return 0
        sleep 0.05
    done
    say "nothing answered at $1"
    exit 1
}

# Stops the script when any of the ports given is in use on 127.0.0.1 (a load script's range).
ensure_free_ports() {
    local port
    for port in "$@"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            say "port $port on 127.0.0.1 is in use; set LOAD_PORT to the start of a free range of $# ports"
            exit 1
        fi
    done
}

# Rust 1.88 or newer (edition 2024).
ensure_toolchain() {
    if ! command -v cargo >/dev/null 2>&1; then
        say "cargo is missing: install Rust 1.88 or newer from https://rustup.rs, then run this again"
        exit 1
    fi
    local version
    version=$(rustc --version | awk '{print $2}')
    if [ "$(printf '%s\n1.88.0\n' "$version" | sort -V | head -n 1)" != "1.88.0" ]; then
        say "rustc $version is too old: recast needs 1.88 or newer (rustup update stable)"
        exit 1
    fi
}

# Installs the Debian packages given when they are missing (as root, or with sudo).
ensure_packages() {
    local missing=() package
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local run=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            run=(sudo)
        else
            say "missing Debian packages: ${missing[*]} (install them with: apt-get install ${missing[*]})"
            exit 1
        fi
    fi
    say "installing Debian packages: ${missing[*]}"
    "${run[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Build outputs live outside the clone, so a fresh clone reuses what an earlier one built.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/recast/target}"

# Cargo judges recast's own build outputs fresh by file times, not by the directory they were built
# from: after a build in another clone, this clone's older sources would look built and tests would
# run the other clone's code. When the last build came from elsewhere, recast's own outputs (not its
# dependencies) are dropped so this clone's sources are compiled.
use_this_checkout() {
    local marker="$CARGO_TARGET_DIR/recast-checkout" here
    here=$(pwd -P)
    if [ -f "$marker" ] && [ "$(cat "$marker")" != "$here" ]; then
        say "the last build came from $(cat "$marker"): rebuilding recast itself"
        cargo clean --quiet -p recast
    fi
    mkdir -p "$CARGO_TARGET_DIR"
    printf '%s\n' "$here" >"$marker"
}

# Debian packages the build needs: C and C++ compilers (the allocator is C, the bundled RocksDB is
# C++; clang compiles RocksDB in about three quarters of gcc's time, and gcc links), libclang, which
# generates RocksDB's Rust bindings, and ccache, which keeps the compiled C and C++.
BUILD_PACKAGES=(gcc g++ clang libclang-dev ccache)

# RocksDB's C++ is compiled with the same flags in every cargo profile (Cargo.toml), so ccache,
# keeping its objects next to the target directory, lets a build in one profile reuse what a build
# in another compiled: `serve.sh` after `test.sh` (or the other way round) compiles none of it.
# Every script that builds calls this, so they all hand cargo the same compilers: RocksDB's build
# script runs again whenever CC or CXX change. Compilers set by the caller are kept.
use_ccache() {
    export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/recast/ccache}"
    # Set already by this function (a script that runs another, as test.sh runs budget.sh).
    [ "${CC:-}" = "ccache clang" ] && [ "${CXX:-}" = "ccache clang++" ] && return 0
    if [ -n "${CC:-}${CXX:-}" ]; then
        say "compiling C and C++ with CC=${CC:-(unset)} and CXX=${CXX:-(unset)} as set, not with ccache and clang"
        return 0
    fi
    export CC="ccache clang" CXX="ccache clang++"
}

# Says, before cargo starts, that this build compiles RocksDB (the long step of a first build),
# unless the target directory holds a RocksDB that PROFILE's build (debug or release) compiled with
# the compilers in use. The record of a build-script run names the C++ compiler it was given.
announce_rocksdb() {
    local profile=$1 compiler="CXX = None" record built_elsewhere=no cores minutes files
    [ -n "${CXX:-}" ] && compiler="CXX = Some($CXX)"
    for record in "$CARGO_TARGET_DIR"/*/build/librocksdb-sys-*/output; do
        [ -f "${record%/output}/out/librocksdb.a" ] && grep -qxF "$compiler" "$record" || continue
        case $record in
            "$CARGO_TARGET_DIR/$profile/"*) return 0 ;;
            *) built_elsewhere=yes ;;
        esac
    done
    files=0
    [[ ${CXX:-} == ccache* ]] && files=$(ccache --print-stats 2>/dev/null | awk '$1 == "files_in_cache" { print $2 }' || true)
    cores=$(nproc 2>/dev/null || echo 2)
    minutes=$(((ROCKSDB_CPU_MINUTES + cores - 1) / cores))
    if [ "${files:-0}" -lt "$ROCKSDB_CACHED_FILES" ]; then
        say "building RocksDB from source (about 340 C++ files), about $minutes minutes on $cores cores, once"
    elif [ "$built_elsewhere" = yes ]; then
        say "building RocksDB for the $profile profile from the C++ objects ccache kept, in seconds"
    else
        say "building RocksDB (about 340 C++ files): seconds if ccache still holds them from an earlier build, else about $minutes minutes on $cores cores"
    fi
}

# ccache keeps about two files per object: a cache that holds fewer than this many files cannot
# hold RocksDB's 343 objects.
ROCKSDB_CACHED_FILES=600

# CPU minutes RocksDB's C++ takes to compile at -O2 with clang 14, beside the Rust it builds with
# (9.4 to 10.5 minutes of wall time on a 2-core AMD EPYC VM).
ROCKSDB_CPU_MINUTES=19

# What the tests need beyond the build: curl runs the README's walk-through as written,
# PostgreSQL's server binaries start the throwaway clusters of `tests/it/postgres.rs`, and openssl
# makes the certificate authorities of `tests/it/tls.rs`; valgrind's callgrind counts the
# instructions of the performance budget (scripts/budget.sh).
TEST_PACKAGES=(curl postgresql openssl python3 valgrind)

# nginx, for the test of the load-balancing configuration in docs/cluster.md and for the load
# bench: any of Debian's flavours will do; nginx-light when there is none.
ensure_nginx() {
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || ensure_packages nginx-light
}

# Chromium, Node.js and playwright-core for the playground's browser test (tests/browser). They
# are installed like the packages above, or the script stops saying what is missing. Once they are
# in place, a marker in the target directory tells that test it must run: from then on a missing
# part fails it instead of skipping it. A node or npm already on the PATH (from NodeSource or nvm,
# say) is kept: Debian's packages would replace it with an older one.
ensure_browser() {
    ensure_npm_test tests/browser "$BROWSER_MARKER" "the browser tests of the playground and the console need playwright-core and axe-core" chromium
}

# Its name, which tests/it/playground.rs knows too.
BROWSER_MARKER=browser-test-required

# The OAuth2 tests' authorization server (oidc-provider) and resource server, on Node.js.
ensure_oauth_server() {
    ensure_npm_test tests/oauth "$OAUTH_MARKER" "the OAuth2 tests need oidc-provider"
}

# Its name, which tests/it/oauth.rs knows too.
OAUTH_MARKER=oauth-test-required

# Installs Node.js and npm (unless they are on the PATH), the Debian packages named after $3, and
# the npm packages of the test directory $1 when missing or stale, then writes the marker $2 in
# the target directory: the test that needs them must run. $3 says what fails without them.
ensure_npm_test() {
    local dir=$1 marker=$2 needs=$3 packages=("${@:4}")
    command -v node >/dev/null 2>&1 || packages+=(nodejs)
    command -v npm >/dev/null 2>&1 || packages+=(npm)
    ensure_packages "${packages[@]}"
    # npm ci keeps its own copy of the lock file in node_modules; an older copy means a stale install.
    if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
        say "installing the npm packages of $dir (npm ci --prefix $dir)"
        if ! npm ci --prefix "$dir" --no-audit --no-fund >/dev/null; then
            say "npm ci --prefix $dir failed: $needs from the npm registry"
            exit 1
        fi
    fi
    mkdir -p "$CARGO_TARGET_DIR/tmp"
    printf 'installed by scripts/test.sh: the test must run\n' >"$CARGO_TARGET_DIR/tmp/$marker"
}

# The mark of a test run: `scripts/test.sh` puts `SUITE_RUN=<mark>` in the environment of the
# suite, and every process a test starts inherits it, also one that leaves its parent (as
# `pg_ctl` leaves the PostgreSQL server) or starts its own process group. A process the suite did
# not start (a developer's own `recast serve`, an editor's `node`, a browser) does not carry it.
SUITE_MARK_NAME=SUITE_RUN

# Prints, one per line (pid, then command line), the processes still running that carry
# `SUITE_RUN=$1` in their environment: what a test run with that mark left behind. This shell
# and what it runs now (the check itself) are not counted; zombies hold nothing and are not either.
suite_leftovers() {
    local mark="$SUITE_MARK_NAME=$1" dir pid ancestor state
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        # One grep over the NUL-separated file: no pipe whose writer an early match could kill.
        grep -qzxF -- "$mark" "$dir/environ" 2>/dev/null || continue
        # The state is the field after the command name, which is in parentheses and may hold
        # spaces.
        state=$(sed -n 's/^.*) \([A-Za-z]\).*$/\1/p' "$dir/stat" 2>/dev/null) || continue
        [ -n "$state" ] && [ "$state" != Z ] || continue
        ancestor=$pid
        while [ -n "$ancestor" ] && [ "$ancestor" != 0 ] && [ "$ancestor" != 1 ] && [ "$ancestor" != "$$" ]; do
            ancestor=$(sed -n 's/^.*) [A-Za-z] \([0-9]*\).*$/\1/p' "/proc/$ancestor/stat" 2>/dev/null)
        done
        [ "$ancestor" = "$$" ] && continue
        printf '%s %s\n' "$pid" "$(tr '\0' ' ' <"$dir/cmdline" 2>/dev/null)"
    done
}
