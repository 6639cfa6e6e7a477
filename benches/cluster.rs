//! Cluster benchmark: recast nodes sharing their routes through PostgreSQL, against the embedded
//! RocksDB store, with the real binary and a throwaway PostgreSQL started with `fsync` on
//! (`tests/it/postgres.rs`), all on loopback.
//!
//! - Propagation: three nodes; 1,000 changes (registrations, updates and deletes in turn, each
//!   made on one node, the writer moving round the three), each timed from the writer's answer
//!   until each of the two other nodes serves it (`GET /v1/routes/{uuid}` shows the new revision,
//!   or 404 after a delete), polled every 100 µs on a keep-alive connection per node.
//! - Route calls per second: one route called from 16 keep-alive clients for 10 s, on a RocksDB
//!   node and on a cluster node (the only node of its database by then, as the RocksDB node is
//!   alone) in turn, two rounds each.
//! - Registrations per second: then `POST /v1/mapping` from 16 clients for 10 s on each, each a
//!   live call to an upstream on 127.0.0.1 and a durable write.
//! - Start-up with 10^5 routes in the database: routes written into a RocksDB store, moved into
//!   a fresh database with `recast routes export` and `recast routes import`, then a node started
//!   three times on an empty data directory (a brand-new node, loading every route from the
//!   database) and three times on the snapshot the last of those left (after a clean stop), each
//!   timed until `/readyz` answers 200 and checked to hold every route.
//!
//! Run: `cargo bench --bench cluster` (a few minutes after the build). Under `cargo test` the same
//! code runs with small sizes. PostgreSQL's binaries come from Debian's `postgresql`, which
//! `scripts/test.sh` installs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use recast::secrets::Secret;

#[path = "common/harness.rs"]
mod harness;
// Shared with the tests, which use more of it.
#[allow(dead_code)]
#[path = "../tests/it/postgres.rs"]
mod postgres;

use harness::{
    Connection, Registered, Server, Upstream, fill, path, register_for, registration_json, resident_bytes,
    tempdir,
};
use postgres::Postgres;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sizes of a real run, and of a check under `cargo test`.
struct Sizes {
    changes: usize,
    stored: usize,
    starts: usize,
    register_for: Duration,
    calls_for: Duration,
    rounds: usize,
}

const BENCH: Sizes = Sizes {
    changes: 1000,
    stored: 100_000,
    starts: 3,
    register_for: Duration::from_secs(10),
    calls_for: Duration::from_secs(10),
    rounds: 2,
};
const CHECK: Sizes = Sizes {
    changes: 12,
    stored: 200,
    starts: 1,
    register_for: Duration::from_millis(300),
    calls_for: Duration::from_millis(300),
    rounds: 1,
};

/// Concurrent clients of the registration and call runs.
const CLIENTS: usize = 16;

/// Every node's secret key (the RocksDB node's too, so both seal the same way).
const KEY: &str = "be9c4b1f0c2d7a6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e";

/// How often a node is asked whether it serves a change yet.
const POLL: Duration = Duration::from_micros(100);

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes = if bench { &BENCH } else { &CHECK };
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_recast"));
    let upstream = Upstream::start();
    let registration = registration_json(upstream.address);
    let postgres = Postgres::start_durable(true);

    // Three nodes on one database.
    let shared = database(&postgres, "shared");
    let dirs: Vec<PathBuf> = (0..3).map(|n| tempdir(&format!("node{n}"))).collect();
    let nodes: Vec<Server> = dirs.iter().map(|dir| node(&binary, dir, Some(&shared))).collect();
    for node in &nodes {
        node.wait_ready(Duration::from_secs(30));
    }
    let ports: Vec<u16> = nodes.iter().map(|node| node.port).collect();
    let propagated = propagation(&ports, &registration, sizes.changes);
    let mut nodes = nodes.into_iter();
    let cluster = nodes.next().expect("three nodes");
    nodes.for_each(Server::stop);

    // The cluster node, now alone, against a RocksDB node.
    let local_dir = tempdir("local");
    let local = node(&binary, &local_dir, None);
    local.wait_ready(Duration::from_secs(30));
    let mut calls_local = Vec::new();
    let mut calls_cluster = Vec::new();
    let (local_path, cluster_path) =
        (callable(local.port, &registration), callable(cluster.port, &registration));
    for round in 0..sizes.rounds {
        // In turn, the other order in odd rounds.
        if round % 2 == 0 {
            calls_local.push(call_for(local.port, &local_path, sizes.calls_for));
            calls_cluster.push(call_for(cluster.port, &cluster_path, sizes.calls_for));
        } else {
            calls_cluster.push(call_for(cluster.port, &cluster_path, sizes.calls_for));
            calls_local.push(call_for(local.port, &local_path, sizes.calls_for));
        }
    }
    // After the calls: the RocksDB node merges its table files for a while after many writes.
    let registered_local = register_for(local.port, &registration, CLIENTS, sizes.register_for);
    let registered_cluster = register_for(cluster.port, &registration, CLIENTS, sizes.register_for);
    local.stop();
    cluster.stop();

    let started = start_up(&binary, &postgres, &registration, sizes);
    for dir in dirs.iter().chain([&local_dir]) {
        let _ = std::fs::remove_dir_all(dir);
    }

    println!();
    println!("| measure | value |");
    println!("|---|---:|");
    let (all, each) = (&propagated.last, &propagated.each);
    println!(
        "| propagation of {} changes to the two other nodes, p50 / p99 / max, each node | {} / {} / {} ms |",
        sizes.changes,
        ms(percentile(each, 0.50)),
        ms(percentile(each, 0.99)),
        ms(percentile(each, 1.0))
    );
    println!(
        "| the same, until both other nodes serve it | {} / {} / {} ms |",
        ms(percentile(all, 0.50)),
        ms(percentile(all, 0.99)),
        ms(percentile(all, 1.0))
    );
    println!(
        "| registrations, {CLIENTS} clients for {:.0} s, RocksDB / PostgreSQL | {:.0} / {:.0} routes/s |",
        sizes.register_for.as_secs_f64(),
        rate(&registered_local),
        rate(&registered_cluster)
    );
    println!(
        "| route calls, {CLIENTS} clients, {} × {:.0} s each, RocksDB node / cluster node | {} / {} calls/s |",
        sizes.rounds,
        sizes.calls_for.as_secs_f64(),
        rates(&calls_local),
        rates(&calls_cluster)
    );
    println!(
        "| route call latency p50 / p99 over every round, RocksDB node / cluster node | {} / {} ms, {} / {} ms |",
        ms(percentile(&merged(&calls_local), 0.50)),
        ms(percentile(&merged(&calls_local), 0.99)),
        ms(percentile(&merged(&calls_cluster), 0.50)),
        ms(percentile(&merged(&calls_cluster), 0.99))
    );
    println!(
        "| {} routes moved into the database: export / import | {:.1} s / {:.1} s ({:.0} routes/s) |",
        sizes.stored,
        started.exported.as_secs_f64(),
        started.imported.as_secs_f64(),
        sizes.stored as f64 / started.imported.as_secs_f64()
    );
    println!(
        "| start-up with {} routes in the database until `/readyz` is 200: new node (cold) | {} |",
        sizes.stored,
        seconds(&started.cold)
    );
    println!("| the same from the node's snapshot | {} |", seconds(&started.warm));
    println!(
        "| resident memory once ready, cold starts / snapshot starts | {} / {} MiB |",
        mib(&started.cold),
        mib(&started.warm)
    );
}

/// A database of its own in the cluster, for one part of the run; its URL.
fn database(postgres: &Postgres, name: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&postgres.url(), tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL answers");
        tokio::spawn(connection);
        client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("the database is created");
    });
    format!("postgres://{}@127.0.0.1:{}/{name}", postgres::USER, postgres.port())
}

/// A node on `dir`: a cluster node of `database`, or a RocksDB node without one.
fn node(binary: &Path, dir: &Path, database: Option<&str>) -> Server {
    let mut env = vec![
        ("RECAST_DATA_DIR", path(dir)),
        ("RECAST_SECRET_KEY", KEY),
        ("RECAST_UPSTREAM_ALLOW", "127.0.0.1/32"),
    ];
    if let Some(url) = database {
        env.push(("RECAST_DATABASE_URL", url));
    }
    Server::spawn(binary, &env)
}

// ---------------------------------------------------------------------------------------------
// Propagation.

struct Propagated {
    /// Per change and other node.
    each: Vec<Duration>,
    /// Per change, until the last other node.
    last: Vec<Duration>,
}

/// What a node must show once it serves a change.
#[derive(Clone, Copy)]
enum Expect {
    /// The route at this revision or a later one.
    AtLeast(u64),
    Gone,
}

fn propagation(ports: &[u16], registration: &str, changes: usize) -> Propagated {
    let mut connections: Vec<Connection> = ports.iter().map(|&port| Connection::open(port)).collect();
    let (mut each, mut last) = (Vec::with_capacity(2 * changes), Vec::with_capacity(changes));
    let mut uuid = String::new();
    for i in 0..changes {
        let kind = i % 3;
        let writer = (i / 3 + kind) % ports.len();
        let connection = &mut connections[writer];
        let expect = match kind {
            0 => {
                let (status, body) = connection.send("POST", "/v1/mapping", Some(registration));
                assert_eq!(status, 201, "{body}");
                uuid = member(&body, "uuid").as_str().expect("a uuid").to_owned();
                Expect::AtLeast(revision(&body))
            }
            1 => {
                let (status, body) =
                    connection.send("PUT", &format!("/v1/routes/{uuid}"), Some(registration));
                assert_eq!(status, 200, "{body}");
                Expect::AtLeast(revision(&body))
            }
            _ => {
                let (status, body) = connection.send("DELETE", &format!("/v1/routes/{uuid}"), None);
                assert_eq!(status, 204, "{body}");
                Expect::Gone
            }
        };
        let acked = Instant::now();
        let path = format!("/v1/routes/{uuid}");
        let times: Vec<Duration> = std::thread::scope(|scope| {
            let polls: Vec<_> = connections
                .iter_mut()
                .enumerate()
                .filter(|(n, _)| *n != writer)
                .map(|(_, connection)| scope.spawn(|| served(connection, &path, expect, acked)))
                .collect();
            polls.into_iter().map(|poll| poll.join().expect("the poll ends")).collect()
        });
        last.push(times.iter().copied().max().expect("two other nodes"));
        each.extend(times);
    }
    Propagated { each, last }
}

/// Polls `path` until it shows what `expect` says; the time since `acked`.
fn served(connection: &mut Connection, path: &str, expect: Expect, acked: Instant) -> Duration {
    let deadline = acked + Duration::from_secs(10);
    loop {
        let (status, body) = connection.send("GET", path, None);
        let done = match expect {
            Expect::AtLeast(revision) => {
                status == 200 && member(&body, "revision").as_u64() >= Some(revision)
            }
            Expect::Gone => status == 404,
        };
        if done {
            return acked.elapsed();
        }
        assert!(Instant::now() < deadline, "{path}: not propagated within 10 s ({status} {body})");
        std::thread::sleep(POLL);
    }
}

fn member(body: &str, name: &str) -> serde_json::Value {
    let value: serde_json::Value = serde_json::from_str(body).expect("a JSON answer");
    value.get(name).cloned().unwrap_or(serde_json::Value::Null)
}

fn revision(body: &str) -> u64 {
    member(body, "revision").as_u64().expect("a cluster node's answer gives the revision")
}

// ---------------------------------------------------------------------------------------------
// Route calls.

/// The path of a new route on the node at `port`.
fn callable(port: u16, registration: &str) -> String {
    let (status, body) = Connection::open(port).send("POST", "/v1/mapping", Some(registration));
    assert_eq!(status, 201, "{body}");
    format!("/v1/{}/meal", member(&body, "uuid").as_str().expect("a uuid"))
}

/// Calls `path` from [`CLIENTS`] keep-alive connections for `run_for`; every answer must be 200.
/// The calls per second and every call's time.
fn call_for(port: u16, path: &str, run_for: Duration) -> (f64, Vec<Duration>) {
    let count = AtomicU64::new(0);
    let started = Instant::now();
    let until = started + run_for;
    let times: Vec<Duration> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                scope.spawn(|| {
                    let mut connection = Connection::open(port);
                    let mut times = Vec::new();
                    while Instant::now() < until {
                        let sent = Instant::now();
                        let (status, body) = connection.send("GET", path, None);
                        times.push(sent.elapsed());
                        assert_eq!(status, 200, "{body}");
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    times
                })
            })
            .collect();
        clients.into_iter().flat_map(|client| client.join().expect("the client ends")).collect()
    });
    (count.into_inner() as f64 / started.elapsed().as_secs_f64(), times)
}

// ---------------------------------------------------------------------------------------------
// Start-up.

struct StartUp {
    exported: Duration,
    imported: Duration,
    cold: Vec<(Duration, u64)>,
    warm: Vec<(Duration, u64)>,
}

fn start_up(binary: &Path, postgres: &Postgres, registration: &str, sizes: &Sizes) -> StartUp {
    let url = database(postgres, "startup");
    let standalone = tempdir("standalone");
    fill(&standalone, sizes.stored, registration, Some(&Secret::new(KEY)), CLIENTS);
    let records = standalone.join("routes.export");
    let started = Instant::now();
    let out = std::fs::File::create(&records).expect("the export file is created");
    let export = Command::new(binary)
        .args(["routes", "export", "--data-dir", path(&standalone), "--secret-key", KEY])
        .stdout(out)
        .output()
        .expect("recast routes export runs");
    assert!(export.status.success(), "export: {}", String::from_utf8_lossy(&export.stderr));
    let exported = started.elapsed();
    let started = Instant::now();
    let import = Command::new(binary)
        .args(["routes", "import", path(&records), "--database-url", &url, "--secret-key", KEY])
        .output()
        .expect("recast routes import runs");
    assert!(import.status.success(), "import: {}", String::from_utf8_lossy(&import.stderr));
    let imported = started.elapsed();

    let mut cold = Vec::new();
    let mut dir = None;
    for _ in 0..sizes.starts {
        let new = tempdir("cold");
        cold.push(time_start(binary, &new, &url, sizes.stored));
        if let Some(old) = dir.replace(new) {
            let _ = std::fs::remove_dir_all(old);
        }
    }
    let dir = dir.expect("at least one start");
    let warm = (0..sizes.starts).map(|_| time_start(binary, &dir, &url, sizes.stored)).collect();
    for dir in [&dir, &standalone] {
        let _ = std::fs::remove_dir_all(dir);
    }
    StartUp { exported, imported, cold, warm }
}

/// Starts a cluster node on `dir`, waits until `/readyz` answers 200, checks that it holds
/// `routes` routes, and stops it cleanly; the time until ready and the resident memory then.
fn time_start(binary: &Path, dir: &Path, url: &str, routes: usize) -> (Duration, u64) {
    let started = Instant::now();
    let server = node(binary, dir, Some(url));
    server.wait_ready(Duration::from_secs(120));
    let ready = started.elapsed();
    let (status, metrics) = Connection::open(server.port).send("GET", "/metrics", None);
    assert_eq!(status, 200, "{metrics}");
    let loaded = metrics.lines().find_map(|line| line.strip_prefix("recast_routes_loaded "));
    assert_eq!(loaded, Some(routes.to_string().as_str()), "every route is loaded once ready");
    let resident = resident_bytes(server.pid());
    server.stop();
    (ready, resident)
}

// ---------------------------------------------------------------------------------------------
// Arithmetic.

/// The value at quantile `q` (nearest rank) of `samples`.
fn percentile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn merged(runs: &[(f64, Vec<Duration>)]) -> Vec<Duration> {
    runs.iter().flat_map(|(_, times)| times.iter().copied()).collect()
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn seconds(runs: &[(Duration, u64)]) -> String {
    let runs: Vec<String> = runs.iter().map(|(d, _)| format!("{:.2} s", d.as_secs_f64())).collect();
    runs.join(", ")
}

fn mib(runs: &[(Duration, u64)]) -> String {
    let runs: Vec<String> =
        runs.iter().map(|(_, bytes)| format!("{:.0}", *bytes as f64 / 1048576.0)).collect();
    runs.join(", ")
}

fn rate(registered: &Registered) -> f64 {
    registered.count as f64 / registered.elapsed.as_secs_f64()
}

fn rates(runs: &[(f64, Vec<Duration>)]) -> String {
    let runs: Vec<String> = runs.iter().map(|(rate, _)| format!("{rate:.0}")).collect();
    runs.join(", ")
}
