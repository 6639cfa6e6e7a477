//! What the benchmarks that start the real binary share: the routes they register, the child
//! process, a small blocking HTTP/1.1 client, and an upstream on loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use recast::route::{Registration, Route};
use recast::rules::Limits;
use recast::secrets::Secret;
use recast::storage::Store;
use uuid::Uuid;

/// A registration of the kind a user makes: one upstream, five targets, one concatenation.
pub fn registration_json(upstream: SocketAddr) -> String {
    let rules = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"category":{"key":"category","type":"String"},"area":{"key":"area","type":"String"},"ingredient":{"key":"ingredient","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"name":{"keys":["strMeal"],"parents":["meals"]},"category":{"keys":["strCategory"],"parents":["meals"]},"area":{"keys":["strArea"],"parents":["meals"]},"ingredient":{"keys":["strMeasure1, strIngredient1"],"parents":["meals"]}}}"#;
    format!(
        r#"{{"path":"meal","originalRoute":{{"originalApi":{{"baseUrl":"http://{upstream}/api"}},"path":"lookup.php"}},"authHeader":{{"type":"Bearer","token":"a-secret-token"}},"rulesAsString":{rules}}}"#
    )
}

/// A new route of `registration`, built in this process as registration builds it.
pub fn route(registration: &str, limits: &Limits) -> Route {
    let registration: Registration =
        serde_json::from_str(registration).expect("the registration is valid JSON");
    let config = registration.validate(false, None).expect("the registration is valid");
    Route::new(Uuid::new_v4(), 1, 1, config, limits)
}

/// Writes `n` routes of `registration` into a new store at `dir` (sealed with `secret`, else with
/// a key file the store makes) from `writers` threads, each write synced as a registration's is
/// (concurrent writes share their syncs). Returns routes per second.
pub fn fill(dir: &Path, n: usize, registration: &str, secret: Option<&Secret>, writers: usize) -> f64 {
    let limits = Limits::default();
    let store = Store::open(dir, secret).expect("the store opens");
    let started = Instant::now();
    let next = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..writers {
            scope.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < n as u64 {
                    store.put(&route(registration, &limits).to_stored()).expect("the route is stored");
                }
            });
        }
    });
    n as f64 / started.elapsed().as_secs_f64()
}

pub fn path(dir: &Path) -> &str {
    dir.to_str().expect("a UTF-8 path")
}

/// The binary, killed when dropped. What it logs is kept in a file and printed when it stops
/// with a failure, or when the bench fails while it runs.
pub struct Server {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl Server {
    /// Starts `recast serve` on a free loopback port with `env` added to the environment (logs
    /// at `warn`, kept); does not wait for it.
    pub fn spawn(binary: &Path, env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("recast-bench-{port}-{}.log", Uuid::new_v4()));
        let file = std::fs::File::create(&log).expect("the log file is made");
        let child = Command::new(binary)
            .arg("serve")
            .env("RECAST_LISTEN", format!("127.0.0.1:{port}"))
            .env("RECAST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("the binary starts");
        Server { child, port, log }
    }

    /// Waits until `/readyz` answers 200, polling every 2 ms; panics after `limit`.
    pub fn wait_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while get(self.port, "/readyz").is_none_or(|(status, _)| status != 200) {
            assert!(
                Instant::now() < deadline,
                "recast did not become ready within {limit:?}:\n{}",
                self.logged()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the binary logged so far.
    pub fn logged(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the binary as an operator does (SIGTERM), so it closes its store cleanly; kills it
    /// if it has not exited within 30 s. Panics, with what it logged, when it exits with a
    /// failure.
    pub fn stop(mut self) {
        let stopped = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while stopped.as_ref().is_ok_and(|s| s.success()) && Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "recast stopped with {status}; it logged:\n{}", self.logged());
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("recast did not stop within 30 s of SIGTERM; it logged:\n{}", self.logged());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- what recast (port {}) logged ----\n{}---- end ----", self.port, self.logged());
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A new directory under the system's temporary directory; the caller removes it.
pub fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recast-bench-{name}-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("the temporary directory is created");
    dir
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// One `GET` on a new connection; `None` when recast does not answer.
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut connection = Connection::try_open(port)?;
    connection.request("GET", path, None)
}

pub fn resident_bytes(pid: u32) -> u64 {
    resident_bytes_in(&format!("/proc/{pid}/status"))
}

pub fn resident_bytes_in(status: &str) -> u64 {
    let status = std::fs::read_to_string(status).expect("the process has a status");
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS is in the status");
    kib * 1024
}

/// One keep-alive connection to recast.
pub struct Connection {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl Connection {
    pub fn try_open(port: u16) -> Option<Connection> {
        let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        stream.set_nodelay(true).ok()?;
        Some(Connection { reader: BufReader::new(stream), port })
    }

    pub fn open(port: u16) -> Connection {
        Connection::try_open(port).expect("recast accepts connections")
    }

    /// A request whose answer must come; panics when the connection fails.
    pub fn send(&mut self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        self.request(method, path, body).unwrap_or_else(|| panic!("recast answers {method} {path}"))
    }

    pub fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
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
pub struct Upstream {
    pub address: SocketAddr,
}

impl Upstream {
    pub fn start() -> Upstream {
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

/// Registrations made in a timed run.
pub struct Registered {
    pub count: u64,
    pub elapsed: Duration,
}

/// `POST /v1/mapping` of `registration` from `clients` keep-alive connections for `run_for`;
/// every answer must be 201.
pub fn register_for(port: u16, registration: &str, clients: usize, run_for: Duration) -> Registered {
    let count = AtomicU64::new(0);
    let started = Instant::now();
    let until = started + run_for;
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                let mut connection = Connection::open(port);
                while Instant::now() < until {
                    let (status, body) = connection.send("POST", "/v1/mapping", Some(registration));
                    assert_eq!(status, 201, "{body}");
                    count.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    Registered { count: count.into_inner(), elapsed: started.elapsed() }
}
