//! A throwaway PostgreSQL cluster for the tests of cluster mode: `initdb` into a temporary
//! directory, started on a free loopback port with its socket in that directory and `fsync=off`
//! (the cluster benchmark, `benches/cluster.rs`, starts it with `fsync` on), stopped at once
//! (`-m immediate`) when dropped. `initdb` refuses to run as root, so when the
//! tests run as root the cluster's commands run through `runuser -u postgres`. The binaries come
//! from Debian's `postgresql` package, which `scripts/test.sh` installs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

/// The database user the cluster is created with (it trusts every local connection).
pub const USER: &str = "recast";

pub struct Postgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// Whether the cluster's commands run as `postgres` (the tests run as root).
    as_postgres: bool,
    /// Whether commits wait for the disk (`fsync` and full-page writes on), as in production.
    durable: bool,
}

impl Postgres {
    /// Creates a cluster that never waits for the disk, and starts it. Panics with the server's
    /// log when it cannot.
    pub fn start() -> Postgres {
        Postgres::start_durable(false)
    }

    /// Creates a cluster and starts it; `durable`: with `fsync` and full-page writes on.
    pub fn start_durable(durable: bool) -> Postgres {
        let bin =
            binaries().expect("PostgreSQL's binaries (Debian's `postgresql`; ./scripts/test.sh installs it)");
        let as_postgres = is_root();
        let dir = TempDir::new().expect("a temporary directory");
        if as_postgres {
            run(Command::new("chown").arg("postgres").arg(dir.path()));
        }
        let port = free_port();
        let postgres = Postgres { dir, bin, port, as_postgres, durable };
        let data = postgres.data();
        postgres.pg(
            "initdb",
            &["-D", path(&data), "-U", USER, "-A", "trust", "--no-sync", "--no-instructions", "-E", "UTF8"],
        );
        postgres.start_again();
        postgres
    }

    /// Starts the stopped cluster again, on the same port.
    pub fn start_again(&self) {
        let sync = if self.durable { "on" } else { "off" };
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync={sync} -c full_page_writes={sync}",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        let data = self.data();
        let started =
            self.pg_output("pg_ctl", &["-D", path(&data), "-o", &options, "-l", path(&log), "-w", "start"]);
        if !started.status.success() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("PostgreSQL did not start: {}\n{log}", String::from_utf8_lossy(&started.stderr));
        }
    }

    /// Stops the cluster at once, as a crash would (`pg_ctl -m immediate`).
    pub fn stop_immediate(&self) {
        let data = self.data();
        self.pg("pg_ctl", &["-D", path(&data), "-m", "immediate", "-w", "stop"]);
    }

    /// A URL for the database `postgres` over TCP on 127.0.0.1.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_dump` of the database `postgres`, as text.
    pub fn dump(&self) -> String {
        let port = self.port.to_string();
        let output = self.pg_output("pg_dump", &["-h", "127.0.0.1", "-p", &port, "-U", USER, "postgres"]);
        assert!(output.status.success(), "pg_dump: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// A backup of the database `postgres` in pg_dump's custom format (`pg_dump -Fc`); its file.
    pub fn backup(&self) -> PathBuf {
        let file = self.dir.path().join(format!("backup-{}.dump", uuid::Uuid::new_v4()));
        let port = self.port.to_string();
        self.pg(
            "pg_dump",
            &["-h", "127.0.0.1", "-p", &port, "-U", USER, "-Fc", "-f", path(&file), "postgres"],
        );
        file
    }

    /// Restores a [`Postgres::backup`] over the database, dropping what it holds first
    /// (`pg_restore --clean`).
    pub fn restore(&self, backup: &Path) {
        let port = self.port.to_string();
        self.pg(
            "pg_restore",
            &["-h", "127.0.0.1", "-p", &port, "-U", USER, "--clean", "-d", "postgres", path(backup)],
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn pg(&self, program: &str, args: &[&str]) {
        let output = self.pg_output(program, args);
        assert!(
            output.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn pg_output(&self, program: &str, args: &[&str]) -> Output {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        // PostgreSQL's own settings from the calling shell must not reach the throwaway cluster.
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(|name| name.starts_with("PG")) {
                command.env_remove(name);
            }
        }
        command.args(args).current_dir(self.dir.path()).output().expect("run a PostgreSQL command")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Stopped already, or never started: nothing to do; either way the directory goes.
        let data = self.data();
        let _ = self.pg_output("pg_ctl", &["-D", path(&data), "-m", "immediate", "-w", "stop"]);
    }
}

/// The directory of `initdb` and `pg_ctl`: the newest of Debian's `/usr/lib/postgresql/N/bin`.
fn binaries() -> Option<PathBuf> {
    let versions = std::fs::read_dir("/usr/lib/postgresql").ok()?;
    versions
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

fn is_root() -> bool {
    let output = Command::new("id").arg("-u").output().expect("run id -u");
    String::from_utf8_lossy(&output.stdout).trim() == "0"
}

/// A loopback port free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("a free port").port()
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

fn run(command: &mut Command) {
    let status = command.status().expect("run a command");
    assert!(status.success(), "{command:?}: {status}");
}

#[tokio::test]
async fn a_throwaway_cluster_answers_restarts_and_is_gone_when_dropped() {
    async fn one(url: &str) -> Result<i32, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client.query_one("SELECT 1 + 1", &[]).await?.try_get(0)
    }
    let postgres = tokio::task::spawn_blocking(Postgres::start).await.unwrap();
    let url = postgres.url();
    assert_eq!(one(&url).await.unwrap(), 2);
    let postgres = tokio::task::spawn_blocking(move || {
        postgres.stop_immediate();
        postgres
    })
    .await
    .unwrap();
    assert!(one(&url).await.is_err(), "stopped, yet it answered");
    let postgres = tokio::task::spawn_blocking(move || {
        postgres.start_again();
        postgres
    })
    .await
    .unwrap();
    assert_eq!(one(&url).await.unwrap(), 2, "started again");
    let dir = postgres.dir.path().to_owned();
    tokio::task::spawn_blocking(move || drop(postgres)).await.unwrap();
    assert!(one(&url).await.is_err(), "dropped, yet it answered");
    assert!(!dir.exists(), "the cluster's directory is removed");
}
