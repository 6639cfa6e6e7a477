//! Scale benchmark: how recast behaves as the number of routes grows.
//!
//! - `lookup/{hot,spread}/N` (criterion): finding a route in the route table holding N routes
//!   (1, 10^4, 10^6), for one route asked again and again (`hot`) and for 1,024 routes spread over
//!   the table, asked in turn (`spread`, time per lookup); and the resident memory the table's
//!   routes take in this process.
//! - Start-up (measured once): the real `recast` binary started on a store holding 10^5 routes,
//!   timed until `/readyz` says it is running (store opened, every route read, unsealed and
//!   compiled); and its resident memory then, against the same binary on an empty store, per route.
//! - Registration throughput (measured once): `POST /v1/mapping` from 16 clients for 10 s against
//!   the real binary, each registration making its live call to an upstream on 127.0.0.1 and
//!   stored with a synced write.
//!
//! - `call/{upstream_request,cache_key}` (criterion): building a call's upstream request, and the
//!   cache's key of it (the digest of the whole request).
//!
//! Run: `cargo bench --bench scale`. Under `cargo test` the same code runs with small sizes.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use recast::rules::Limits;
use recast::table::RouteTable;
use uuid::Uuid;

#[path = "common/harness.rs"]
mod harness;

use harness::{
    Registered, Server, Upstream, fill, get, path, register_for, registration_json, resident_bytes,
    resident_bytes_in, route, tempdir,
};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sizes of a real run, and of a check under `cargo test`.
struct Sizes {
    tables: &'static [usize],
    stored: usize,
    register_for: Duration,
}

const BENCH: Sizes =
    Sizes { tables: &[1, 10_000, 1_000_000], stored: 100_000, register_for: Duration::from_secs(10) };
const CHECK: Sizes = Sizes { tables: &[1, 100], stored: 200, register_for: Duration::from_millis(500) };

/// Concurrent clients of the registration run.
const CLIENTS: usize = 16;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes = if bench { &BENCH } else { &CHECK };
    let limits = Limits::default();
    let upstream = Upstream::start();
    let registration = registration_json(upstream.address);

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("lookup");
    for &n in sizes.tables {
        let before = own_resident_bytes();
        let (table, uuids) = table_of(n, &registration, &limits);
        if n >= 10_000 {
            // Below that, page granularity says more than the routes do.
            let per_route = own_resident_bytes().saturating_sub(before) as f64 / n as f64;
            println!(
                "lookup: {n} routes in the table, {per_route:.0} resident bytes per route in this process"
            );
        }
        let hot = uuids[0];
        group.bench_function(BenchmarkId::new("hot", n), |b| {
            b.iter(|| table.get(black_box(&hot)).expect("the route is in the table"))
        });
        // Every 977th route (coprime with the table size in practice), 1,024 of them.
        let spread: Vec<Uuid> = (0..1024).map(|i| uuids[(i * 977) % uuids.len()]).collect();
        group.throughput(criterion::Throughput::Elements(spread.len() as u64));
        group.bench_function(BenchmarkId::new("spread", n), |b| {
            b.iter(|| spread.iter().filter(|u| table.get(black_box(u)).is_some()).count())
        });
        group.throughput(criterion::Throughput::Elements(1));
    }
    group.finish();

    // What a call of a route with `cache` adds before it looks in the cache: the key, a SHA-256
    // of the whole upstream request, against building that request (which every call does).
    let mut group = criterion.benchmark_group("call");
    let route = route(&registration, &limits);
    let mut headers = http::HeaderMap::new();
    for (name, value) in [
        ("accept", "application/json"),
        ("accept-language", "en-GB,en;q=0.9"),
        ("x-mapped-auth", "Bearer 0123456789abcdef0123456789abcdef"),
        ("user-agent", "bench/1"),
    ] {
        headers.insert(name, http::HeaderValue::from_static(value));
    }
    let client = recast::route::FromClient {
        query: Some("c=Seafood&page=2"),
        headers: Some(&headers),
        body: Default::default(),
        caller: None,
    };
    group.bench_function("upstream_request", |b| {
        b.iter(|| route.upstream_request(black_box(&client)).expect("a request"))
    });
    let request = route.upstream_request(&client).expect("a request");
    group.bench_function("cache_key", |b| b.iter(|| recast::cache::Key::new(&route, black_box(&request))));
    group.finish();
    criterion.final_summary();

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_recast"));
    let started = start_up(&binary, sizes.stored, &registration);
    let registered = registration_throughput(&binary, &registration, sizes.register_for);
    println!();
    println!("| measure | value |");
    println!("|---|---:|");
    println!(
        "| routes written to the store for the start-up run | {} ({:.0} routes/s, {CLIENTS} writers) |",
        sizes.stored, started.fill_rate
    );
    let starts: Vec<String> = started.ready.iter().map(|d| format!("{:.2} s", d.as_secs_f64())).collect();
    println!(
        "| start-up with {} routes, until `/readyz` is running (three starts) | {} |",
        sizes.stored,
        starts.join(", ")
    );
    println!("| start-up with an empty store | {:.3} s |", started.ready_empty.as_secs_f64());
    println!(
        "| resident memory, empty store → {} routes | {:.1} MiB → {:.1} MiB |",
        sizes.stored,
        mib(started.rss_empty),
        mib(started.rss_full)
    );
    println!("| memory per stored route (resident) | {:.0} bytes |", started.rss_per_route());
    println!("| store on disk per route | {:.0} bytes |", started.disk as f64 / sizes.stored as f64);
    println!(
        "| registrations, {CLIENTS} clients for {:.1} s (live call + synced write each) | {} ({:.0} routes/s) |",
        sizes.register_for.as_secs_f64(),
        registered.count,
        registered.count as f64 / registered.elapsed.as_secs_f64()
    );
    assert!(registered.count > 0, "no registration succeeded");
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

// ---------------------------------------------------------------------------------------------
// Routes.

fn table_of(n: usize, registration: &str, limits: &Limits) -> (RouteTable, Vec<Uuid>) {
    let table = RouteTable::default();
    let mut uuids = Vec::with_capacity(n);
    for _ in 0..n {
        let route = route(registration, limits);
        uuids.push(route.uuid);
        table.insert(route.into());
    }
    (table, uuids)
}

// ---------------------------------------------------------------------------------------------
// Start-up and memory.

struct StartUp {
    fill_rate: f64,
    ready: Vec<Duration>,
    ready_empty: Duration,
    rss_empty: u64,
    rss_full: u64,
    disk: u64,
    routes: usize,
}

impl StartUp {
    fn rss_per_route(&self) -> f64 {
        self.rss_full.saturating_sub(self.rss_empty) as f64 / self.routes as f64
    }
}

fn start_up(binary: &Path, routes: usize, registration: &str) -> StartUp {
    let empty = tempdir("empty");
    let full = tempdir("full");
    let fill_rate = fill(&full, routes, registration, None, CLIENTS);
    let (ready_empty, rss_empty) = time_start(binary, &empty, 0);
    // Three starts on the full store: the first after the writer closed it, then after recast's
    // own clean stops.
    let starts: Vec<(Duration, u64)> = (0..3).map(|_| time_start(binary, &full, routes)).collect();
    let ready: Vec<Duration> = starts.iter().map(|s| s.0).collect();
    let rss_full = starts.iter().map(|s| s.1).max().unwrap_or(0);
    let disk = dir_size(&full);
    for dir in [&empty, &full] {
        let _ = std::fs::remove_dir_all(dir);
    }
    StartUp { fill_rate, ready, ready_empty, rss_empty, rss_full, disk, routes }
}

/// Starts the binary on `dir`, waits until it is running with `routes` routes loaded; returns the
/// time that took and the process's resident memory then.
fn time_start(binary: &Path, dir: &Path, routes: usize) -> (Duration, u64) {
    let started = Instant::now();
    let server = Server::spawn(binary, &[("RECAST_DATA_DIR", path(dir))]);
    server.wait_ready(Duration::from_secs(120));
    let ready = started.elapsed();
    let listed = get(server.port, "/v1/routes?limit=1").expect("the listing answers");
    assert_eq!(listed.0, 200, "{}", listed.1);
    assert_eq!(routes == 0, listed.1.contains(r#""routes":[]"#), "{}", listed.1);
    let rss = resident_bytes(server.pid());
    server.stop();
    (ready, rss)
}

fn own_resident_bytes() -> u64 {
    resident_bytes_in("/proc/self/status")
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Registration throughput.

fn registration_throughput(binary: &Path, registration: &str, run_for: Duration) -> Registered {
    let dir = tempdir("register");
    let server =
        Server::spawn(binary, &[("RECAST_DATA_DIR", path(&dir)), ("RECAST_UPSTREAM_ALLOW", "127.0.0.1/32")]);
    server.wait_ready(Duration::from_secs(30));
    let registered = register_for(server.port, registration, CLIENTS, run_for);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    registered
}
