//! The real `recast` binary: killed with SIGKILL after acknowledged changes and restarted on the
//! same data directory; a second process on a directory in use; a clean stop on SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;

use crate::process::Group;
use crate::support::{Json, Upstream, get, send};

const MEALS: &str = r#"{"meals":[{"idMeal":"7","strMeal":"Soup"}]}"#;
const RULES: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"name":{"keys":["strMeal"],"parents":["meals"]}}}"#;

/// A running `recast serve` on 127.0.0.1 and an ephemeral port, killed when dropped.
pub struct Binary {
    child: Group,
    pub addr: SocketAddr,
    /// Everything it logged so far, line by line.
    log: Arc<Mutex<Vec<String>>>,
}

impl Binary {
    /// Starts the binary on `dir` and waits until it is ready.
    pub async fn start(dir: &Path) -> Binary {
        Binary::start_with(dir, &[]).await
    }

    /// Starts the binary on `dir` with more environment variables and waits until it is ready.
    pub async fn start_with(dir: &Path, env: &[(&str, &str)]) -> Binary {
        let mut binary = Binary::spawn_with(dir, env);
        binary.addr = binary.logged_address().expect("the binary logs the address it listens on");
        for _ in 0..500 {
            if get(&binary.url("/readyz")).await.status == 200 {
                return binary;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the binary did not become ready; its log:\n{}", binary.log_text());
    }

    /// The address its `listening` line gives, waiting up to ten seconds for the line.
    pub fn logged_address(&self) -> Option<SocketAddr> {
        // `address=127.0.0.1:1234` in text lines, `"address":"127.0.0.1:1234"` in JSON lines.
        self.wait_for_line("listening").and_then(|line| {
            let at = line.find("address")? + "address".len();
            let rest = line[at..].trim_start_matches(['=', '"', ':']);
            rest.split(|c: char| c.is_whitespace() || c == '"').next()?.parse().ok()
        })
    }

    /// Sends it the signal `name` (`HUP`, `TERM`, ...).
    pub fn signal(&mut self, name: &str) {
        self.child.signal(name);
    }

    pub fn spawn(dir: &Path) -> Binary {
        Binary::spawn_with(dir, &[])
    }

    pub fn spawn_with(dir: &Path, env: &[(&str, &str)]) -> Binary {
        let mut command = Command::new(env!("CARGO_BIN_EXE_recast"));
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--upstream-allow", "127.0.0.0/8", "--data-dir"])
            .arg(dir);
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("RECAST_")) {
            command.env_remove(name);
        }
        command.env("RECAST_LOG", "info");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child =
            Group::spawn(command.stderr(Stdio::piped()).stdout(Stdio::null())).expect("the binary starts");
        let stderr = child.child().stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Binary { child, addr: ([127, 0, 0, 1], 0).into(), log }
    }

    /// The first logged line that contains `text`, waiting up to ten seconds for it.
    pub fn wait_for_line(&self, text: &str) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(line) = self.log.lock().unwrap().iter().find(|line| line.contains(text)) {
                return Some(line.clone());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Everything logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits up to ten seconds for the process to exit by itself.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Let the stderr reader take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The most memory the process has held resident so far (`VmHWM`), in bytes.
    pub fn peak_memory(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc/PID/status");
        let line = status.lines().find(|line| line.starts_with("VmHWM:")).expect("a VmHWM line");
        let kib: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmHWM in kB");
        kib * 1024
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill(mut self) {
        self.child.signal("KILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.child.signal("TERM");
        self.child.wait().expect("the binary exits")
    }
}

impl Drop for Binary {
    /// A test that fails while the binary runs prints what the binary logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- what the binary (pid {}) logged ----\n{}\n---- end ----",
                self.child.id(),
                self.log_text()
            );
        }
    }
}

fn registration(base: &str, path: &str) -> String {
    format!(
        r#"{{"path":"{path}","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"meal","authHeader":{{"type":"Bearer","token":"kept-{path}"}}}},"rulesAsString":{RULES}}}"#
    )
}

#[tokio::test]
async fn acknowledged_changes_survive_kill_9_and_deleted_routes_stay_gone() {
    let upstream = Upstream::json(MEALS).await;
    let dir = tempfile::TempDir::new().unwrap();
    let first = Binary::start(dir.path()).await;
    let mut kept = Vec::new();
    let mut deleted = Vec::new();
    for i in 0..6 {
        let answer = send(
            Method::POST,
            &first.url("/v1/mapping"),
            &[],
            registration(&upstream.url("/"), &format!("r{i}")),
        )
        .await;
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        let path = answer.json().get("path").and_then(Json::as_str).unwrap().to_owned();
        if i % 3 == 0 {
            let gone =
                send(Method::DELETE, &first.url(&format!("/v1/routes/{}", &path[4..40])), &[], "").await;
            assert_eq!(gone.status, 204);
            deleted.push(path);
        } else {
            kept.push(path);
        }
    }
    first.kill();

    let second = Binary::start(dir.path()).await;
    for path in &kept {
        let answer = get(&second.url(path)).await;
        assert_eq!(&answer.body[..], br#"{"id":7,"name":"Soup"}"#, "{path}");
        let name = &path[41..];
        assert_eq!(
            upstream.received().pop().unwrap().headers["authorization"],
            format!("Bearer kept-{name}").as_str()
        );
    }
    for path in &deleted {
        get(&second.url(path)).await.assert_problem(404, "not-found");
    }
    assert_eq!(
        get(&second.url("/v1/routes")).await.json().get("routes").unwrap().as_array().len(),
        kept.len()
    );
    second.kill();
}

#[tokio::test]
async fn a_second_process_on_the_same_directory_exits_at_once_with_a_clear_message() {
    let dir = tempfile::TempDir::new().unwrap();
    let first = Binary::start(dir.path()).await;
    let mut second = Binary::spawn(dir.path());
    let line = second.wait_for_line("in use by another recast process");
    assert!(line.is_some(), "the second process says why it stops");
    let status = second.child.wait().expect("the second process exits");
    assert!(!status.success(), "{status}");
    assert_eq!(get(&first.url("/readyz")).await.status, 200, "the first keeps serving");
    first.kill();
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_logs_each_state() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut binary = Binary::start(dir.path()).await;
    assert!(binary.wait_for_line("state=Idle").is_some(), "the start is logged");
    assert!(binary.wait_for_line("state=Running").is_some(), "readiness is logged");
    let status = binary.terminate();
    assert!(status.success(), "{status}");
    assert!(binary.wait_for_line("state=Stopped").is_some(), "the stop is logged");
    assert!(binary.wait_for_line("storage closed").is_some(), "storage is closed");
}

/// A client that sent half a request head and waits holds nothing up: no work has begun for it,
/// and the process exits at once on SIGTERM rather than when the client goes away (it waited for
/// the client, up to the whole grace period). The store is closed before the log says so.
#[tokio::test]
async fn sigterm_does_not_wait_for_a_client_that_sent_half_a_head() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::TempDir::new().unwrap();
    let mut binary = Binary::start_with(dir.path(), &[("RECAST_SHUTDOWN_GRACE_MS", "30000")]).await;
    let mut half = tokio::net::TcpStream::connect(binary.addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // And one that sent nothing yet.
    let idle = tokio::net::TcpStream::connect(binary.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    binary.child.signal("TERM");
    // (Blocks this test's runtime, which has nothing else to run: the log is read by a thread.)
    let status = binary.exit_status().expect("exited within 10 s, not 30");
    assert!(status.success(), "{status}");
    let closed = binary.wait_for_line("storage closed").expect("storage is closed");
    assert!(closed.contains("took_ms="), "{closed}");
    drop((half, idle));
}
