//! Cluster mode: several nodes share their routes through PostgreSQL (`RECAST_DATABASE_URL`).
//!
//! The database is the source of truth. Each change (create, update, delete) takes the next
//! revision from one counter row, `recast_meta.revision`, in the same transaction as the change,
//! and sends `NOTIFY recast_routes` in it too, so the notification goes out only if the change
//! commits. The counter row's lock orders the writers, so revisions commit in order: a reader
//! that follows "every row above the last revision I applied" skips none. A deletion leaves a
//! tombstone (`record` NULL) with its revision, pruned after `RECAST_TOMBSTONE_RETENTION_MS`
//! (`pruned_through` says up to which revision tombstones may be gone).
//!
//! Each change also writes a row of `recast_history` (its revision and a random id), so a node
//! can tell that the history it followed is still the database's (`feed.rs`).
//!
//! Records are stored exactly as in RocksDB: sealed with the secret key (`storage::seal_record`),
//! so the database never sees a secret. `recast_meta.key_check` tells a node whether its key is
//! the one the records were sealed with.
//!
//! This module is the only one that talks to PostgreSQL: here the connection settings, the pool
//! and the key check; in [`store`] the writes and listings ([`ClusterStore`]); in [`feed`] the
//! follower's listening connection and what it reads; in [`nodes`] the heartbeat of the nodes
//! alive; in [`schema`] the migrations.

mod consumers;
mod feed;
mod nodes;
mod schema;
mod store;

pub use consumers::ConsumerChange;
pub use feed::{Change, Feed, Page, Plan, Reading};
pub use store::ClusterStore;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::metrics::PanicSite;
use crate::secrets::{Keyring, Secret};
use crate::storage;
use crate::store::StoreError;
use crate::tasks::Tasks;

/// The channel every change is announced on.
const CHANNEL: &str = "recast_routes";

/// Rows read at a time while catching up.
pub const PAGE: i64 = 1000;

/// The database, as one node sees it.
pub struct Database {
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    pool: Pool,
    key: Keyring,
    /// For connecting and for each statement.
    timeout: Duration,
    /// Runs the listening connection's task behind the panic guard.
    tasks: Tasks,
    pub status: Status,
    /// How long a node not heard of is still counted as alive, as the heartbeat last said.
    alive_ms: std::sync::atomic::AtomicU64,
}

/// Why talking to the database failed.
#[derive(Debug)]
pub enum DbError {
    /// It cannot be reached, or did not answer in time: try again later.
    Unavailable(String),
    /// It answered with an error.
    Failed(String),
    /// Something no retry mends: the key is not the database's, or its schema is newer.
    Fatal(String),
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Unavailable(why) | DbError::Failed(why) | DbError::Fatal(why) => f.write_str(why),
        }
    }
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> StoreError {
        match e {
            DbError::Unavailable(why) => StoreError::Unavailable(why),
            DbError::Failed(why) | DbError::Fatal(why) => StoreError::Failed(why),
        }
    }
}

/// A database error sorted: connection trouble is [`DbError::Unavailable`], an answer is not.
fn sorted(e: tokio_postgres::Error) -> DbError {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code();
            let connection = code.code().starts_with("08")
                || [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW]
                    .contains(code)
                || code.code().starts_with("53");
            let why = format!("the database answered: {} ({})", db.message(), code.code());
            if connection { DbError::Unavailable(why) } else { DbError::Failed(why) }
        }
        None => DbError::Unavailable(format!(
            "the database cannot be reached: {}",
            crate::upstream::error_chain(&e)
        )),
    }
}

impl Database {
    /// Reads the URL and sets the connection up (nothing is connected yet). The URL is never
    /// printed: it may hold a password.
    pub fn new(url: &Secret, key: Keyring, timeout: Duration, tasks: Tasks) -> Result<Database, String> {
        let mut config = tokio_postgres::Config::from_str(url.expose())
            .map_err(|e| format!("RECAST_DATABASE_URL is not a valid postgres:// URL: {e}"))?;
        let statement_timeout = format!("-c statement_timeout={}", timeout.as_millis());
        config
            .application_name("recast")
            .connect_timeout(timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(3)
            .options(&statement_timeout);
        #[cfg(target_os = "linux")]
        config.tcp_user_timeout(timeout);
        let tls = MakeRustlsConnect::new(tls_config());
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig { recycling_method: RecyclingMethod::Verified },
        );
        let pool = Pool::builder(manager)
            .max_size(4)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|e| format!("the database pool cannot be built: {e}"))?;
        Ok(Database {
            config,
            tls,
            pool,
            key,
            timeout,
            tasks,
            status: Status::new(),
            alive_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn key(&self) -> &Keyring {
        &self.key
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `work` within the statement timeout (a connection that swallows traffic does not hold it).
    async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, DbError> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(done)) => {
                if !self.status.is_up() {
                    // Only a follower waiting now is woken: no permit is kept for later.
                    self.status.answered.notify_waiters();
                }
                Ok(done)
            }
            Ok(Err(e)) => Err(sorted(e)),
            Err(_) => Err(DbError::Unavailable(format!(
                "the database did not answer within {} ms (RECAST_DATABASE_TIMEOUT_MS)",
                self.timeout.as_millis()
            ))),
        }
    }

    /// A dedicated connection that listens for changes: `wake` is notified on every change
    /// announced; the returned receiver completes when the connection ends.
    async fn listen(
        &self,
        wake: Arc<tokio::sync::Notify>,
    ) -> Result<(Client, tokio::sync::oneshot::Receiver<String>), DbError> {
        // Named apart from the pool's connections, so an operator can tell it in pg_stat_activity.
        let mut config = self.config.clone();
        config.application_name("recast-follower");
        let connecting = config.connect(self.tls.clone());
        let (client, mut connection) = match tokio::time::timeout(self.timeout, connecting).await {
            Ok(connected) => connected.map_err(sorted)?,
            Err(_) => {
                return Err(DbError::Unavailable(format!(
                    "connecting to the database took longer than {} ms",
                    self.timeout.as_millis()
                )));
            }
        };
        let (ended, end) = tokio::sync::oneshot::channel();
        // A panic drops `ended`, which the follower sees as the connection's end.
        self.tasks.spawn(PanicSite::Background, async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            let why = loop {
                match messages.next().await {
                    Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break crate::upstream::error_chain(&e),
                    None => break "the database closed the connection".to_owned(),
                }
            };
            let _ = ended.send(why);
        });
        self.within(client.batch_execute(&format!("LISTEN {CHANNEL}"))).await?;
        Ok((client, end))
    }

    /// Creates or migrates the schema and checks the secret key against the database's key
    /// check, writing it if the database has none yet.
    async fn prepare(&self, client: &mut Client) -> Result<(), DbError> {
        match tokio::time::timeout(self.timeout * 4, schema::migrate(client)).await {
            Err(_) => return Err(DbError::Unavailable("migrating the schema took too long".to_owned())),
            Ok(Err(schema::SchemaError::Database(e))) => return Err(sorted(e)),
            Ok(Err(schema::SchemaError::TooNew(version))) => {
                return Err(DbError::Fatal(format!(
                    "the database's schema is version {version}, newer than this recast knows ({}); \
                     run a recast at least as new as the one that migrated it",
                    schema::latest()
                )));
            }
            Ok(Ok(())) => {}
        }
        let check = storage::seal_key_check(&self.key);
        self.within(
            client.execute(
                "UPDATE recast_meta SET key_check = $1 WHERE id = 1 AND key_check IS NULL",
                &[&check],
            ),
        )
        .await?;
        let row =
            self.within(client.query_one("SELECT key_check FROM recast_meta WHERE id = 1", &[])).await?;
        let sealed: Vec<u8> = row.get(0);
        if !storage::key_check_opens(&self.key, &sealed) {
            return Err(DbError::Fatal(format!(
                "the secret key ({}) is not the one the routes in the database were sealed with; \
                 start every node with the same RECAST_SECRET_KEY (nothing was changed)",
                self.key.origin
            )));
        }
        Ok(())
    }

    /// A connection of the pool, or why there is none.
    async fn pooled(&self) -> Result<deadpool_postgres::Object, DbError> {
        self.pool.get().await.map_err(|e| DbError::Unavailable(format!("no connection to the database: {e}")))
    }

    /// [`Database::prepare`] on a connection of the pool (at start).
    pub async fn prepare_now(&self) -> Result<(), DbError> {
        let mut client = self.pooled().await?;
        self.prepare(&mut client).await
    }
}

/// How a node stands with the database, for `/readyz` and `/metrics`.
pub struct Status {
    up: AtomicBool,
    /// The last revision applied.
    revision: AtomicU64,
    /// Milliseconds after `origin` when the node last knew it had every change; `u64::MAX`: never.
    synced_at: AtomicU64,
    origin: Instant,
    /// Told when a statement of this node succeeds while the follower counts the database as
    /// down (a heartbeat, a write): the follower, waiting to reconnect, tries at once.
    answered: tokio::sync::Notify,
}

impl Status {
    fn new() -> Status {
        Status {
            up: AtomicBool::new(false),
            revision: AtomicU64::new(0),
            synced_at: AtomicU64::new(u64::MAX),
            origin: Instant::now(),
            answered: tokio::sync::Notify::new(),
        }
    }

    /// Completes when a statement of this node next succeeds (see [`Status::answered`]'s field).
    pub async fn answered(&self) {
        self.answered.notified().await
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Relaxed)
    }

    pub fn set_revision(&self, revision: u64) {
        self.revision.store(revision, Ordering::Relaxed);
    }

    /// The node has every change up to the database's counter, now.
    pub fn synced(&self) {
        self.synced_at.store(self.origin.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since the node last knew it had every change (since it started, if never).
    pub fn lag(&self) -> Duration {
        let now = self.origin.elapsed();
        match self.synced_at.load(Ordering::Relaxed) {
            u64::MAX => now,
            at => now.saturating_sub(Duration::from_millis(at)),
        }
    }
}

/// TLS for `sslmode=require` and `prefer`: rustls with ring and Mozilla's roots, as upstream
/// calls use.
fn tls_config() -> rustls::ClientConfig {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}
