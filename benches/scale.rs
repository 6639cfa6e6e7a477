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
//! Run: `cargo bench --bench scale`. Under `cargo test` the same code runs with small sizes.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use recast::route::{Registration, Route};
use recast::rules::Limits;
use recast::storage::Store;
use recast::table::RouteTable;
use uuid::Uuid;

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
    criterion.final_summary();

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_recast"));
    let started = start_up(&binary, sizes.stored, &registration, &limits);
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

/// A registration of the kind a user makes: one upstream, five targets, one concatenation.
fn registration_json(upstream: SocketAddr) -> String {
    let rules = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"category":{"key":"category","type":"String"},"area":{"key":"area","type":"String"},"ingredient":{"key":"ingredient","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"name":{"keys":["strMeal"],"parents":["meals"]},"category":{"keys":["strCategory"],"parents":["meals"]},"area":{"keys":["strArea"],"parents":["meals"]},"ingredient":{"keys":["strMeasure1, strIngredient1"],"parents":["meals"]}}}"#;
    format!(
        r#"{{"path":"meal","originalRoute":{{"originalApi":{{"baseUrl":"http://{upstream}/api"}},"path":"lookup.php"}},"authHeader":{{"type":"Bearer","token":"a-secret-token"}},"rulesAsString":{rules}}}"#
    )
}

fn route(registration: &str, limits: &Limits) -> Route {
    let registration: Registration =
        serde_json::from_str(registration).expect("the registration is valid JSON");
    let config = registration.validate(false, None).expect("the registration is valid");
    Route::new(Uuid::new_v4(), 1, 1, config, limits)
}

fn table_of(n: usize, registration: &str, limits: &Limits) -> (RouteTable, Vec<Uuid>) {
    let table = RouteTable::default();
    let mut uuids = Vec::with_capacity(n);
    for _ in 0..n {
        let route = route(registration, limits);
        uuids.push(route.uuid);
        table.insert(Arc::new(route));
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

fn start_up(binary: &Path, routes: usize, registration: &str, limits: &Limits) -> StartUp {
    let empty = tempdir("empty");
    let full = tempdir("full");
    let fill_rate = fill(&full, routes, registration, limits);
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

/// Writes `n` routes into a new store at `dir` from several threads (each write synced, as a
/// registration's is; concurrent writes share their syncs). Returns routes per second.
fn fill(dir: &Path, n: usize, registration: &str, limits: &Limits) -> f64 {
    let store = Store::open(dir, None).expect("the store opens");
    let started = Instant::now();
    let next = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < n as u64 {
                    store.put(&route(registration, limits).to_stored()).expect("the route is stored");
                }
            });
        }
    });
    n as f64 / started.elapsed().as_secs_f64()
}

/// Starts the binary on `dir`, waits until it is running with `routes` routes loaded; returns the
/// time that took and the process's resident memory then.
fn time_start(binary: &Path, dir: &Path, routes: usize) -> (Duration, u64) {
    let port = free_port();
    let started = Instant::now();
    let server = Server(
        Command::new(binary)
            .arg("serve")
            .env("RECAST_LISTEN", format!("127.0.0.1:{port}"))
            .env("RECAST_DATA_DIR", dir)
            .env("RECAST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts"),
    );
    let deadline = started + Duration::from_secs(120);
    loop {
        if let Some((200, _)) = get(port, "/readyz") {
            break;
        }
        assert!(Instant::now() < deadline, "recast did not become ready within 120 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    let ready = started.elapsed();
    let listed = get(port, "/v1/routes?limit=1").expect("the listing answers");
    assert_eq!(listed.0, 200, "{}", listed.1);
    assert_eq!(routes == 0, listed.1.contains(r#""routes":[]"#), "{}", listed.1);
    let rss = resident_bytes(server.0.id());
    server.stop();
    (ready, rss)
}

fn own_resident_bytes() -> u64 {
    resident_bytes_in("/proc/self/status")
}

fn resident_bytes(pid: u32) -> u64 {
    resident_bytes_in(&format!("/proc/{pid}/status"))
}

fn resident_bytes_in(status: &str) -> u64 {
    let status = std::fs::read_to_string(status).expect("the process has a status");
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS is in the status");
    kib * 1024
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

struct Registered {
    count: u64,
    elapsed: Duration,
}

fn registration_throughput(binary: &Path, registration: &str, run_for: Duration) -> Registered {
    let dir = tempdir("register");
    let port = free_port();
    let server = Server(
        Command::new(binary)
            .arg("serve")
            .env("RECAST_LISTEN", format!("127.0.0.1:{port}"))
            .env("RECAST_DATA_DIR", &dir)
            .env("RECAST_UPSTREAM_ALLOW", "127.0.0.1/32")
            .env("RECAST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(port, "/readyz").is_none_or(|(status, _)| status != 200) {
        assert!(Instant::now() < deadline, "recast did not become ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    let count = AtomicU64::new(0);
    let started = Instant::now();
    let until = started + run_for;
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                let mut connection = Connection::open(port);
                while Instant::now() < until {
                    let (status, body) = connection.post("/v1/mapping", registration);
                    assert_eq!(status, 201, "{body}");
                    count.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let elapsed = started.elapsed();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Registered { count: count.into_inner(), elapsed }
}

// ---------------------------------------------------------------------------------------------
// Plumbing: the child process, a small HTTP/1.1 client, an upstream on loopback.

/// The binary, killed when dropped.
struct Server(Child);

impl Server {
    /// Stops the binary as an operator does (SIGTERM), so it closes its store cleanly; kills it
    /// if it has not exited within 30 s.
    fn stop(mut self) {
        let stopped = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while stopped.as_ref().is_ok_and(|s| s.success()) && Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                assert!(status.success(), "recast stopped with {status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recast-scale-{name}-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("the temporary directory is created");
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut connection = Connection::try_open(port)?;
    connection.request("GET", path, None)
}

/// One keep-alive connection to recast.
struct Connection {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl Connection {
    fn try_open(port: u16) -> Option<Connection> {
        let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        stream.set_nodelay(true).ok()?;
        Some(Connection { reader: BufReader::new(stream), port })
    }

    fn open(port: u16) -> Connection {
        Connection::try_open(port).expect("recast accepts connections")
    }

    fn post(&mut self, path: &str, body: &str) -> (u16, String) {
        self.request("POST", path, Some(body)).expect("recast answers")
    }

    fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
        let body = body.unwrap_or("");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.port,
            body.len()
        );
        // One write: a second small one would wait for the peer's delayed ACK.
        self.reader.get_mut().write_all([head.as_bytes(), body.as_bytes()].concat().as_slice()).ok()?;
        let (status, length) = read_head(&mut self.reader)?;
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).ok()?;
        Some((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// Reads a response or request head; returns the status (0 for a request) and `Content-Length`.
fn read_head(reader: &mut impl BufRead) -> Option<(u16, usize)> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut length = 0;
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Some((status, length));
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
}

/// A recipe API on 127.0.0.1: answers every request with the same JSON document, keep-alive, a
/// thread per connection, until the process ends.
struct Upstream {
    address: SocketAddr,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("the upstream binds");
        let address = listener.local_addr().expect("the upstream has an address");
        let body = r#"{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken Casserole","strCategory":"Chicken","strArea":"Japanese","strIngredient1":"soy sauce","strMeasure1":"3/4 cup"}]}"#;
        let answer = Arc::new(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let answer = answer.clone();
                std::thread::spawn(move || {
                    let Ok(writer) = stream.try_clone() else { return };
                    let mut reader = BufReader::new(stream);
                    let mut writer = writer;
                    loop {
                        let Some((_, length)) = read_head(&mut reader) else { return };
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err()
                            || writer.write_all(answer.as_bytes()).is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Upstream { address }
    }
}
