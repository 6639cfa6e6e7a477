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
//! Records are stored exactly as in RocksDB: sealed with the secret key (`storage::seal_record`),
//! so the database never sees a secret. `recast_meta.key_check` tells a node whether its key is
//! the one the records were sealed with.
//!
//! This module is the database's side: the pool for writes and listings ([`ClusterStore`]), the
//! dedicated listening connection and the reads the follower (`server::sync`) makes.

mod schema;

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, GenericClient, IsolationLevel, Transaction};
use tokio_postgres_rustls::MakeRustlsConnect;
use uuid::Uuid;

use crate::metrics::PanicSite;
use crate::secrets::{Secret, SecretKey};
use crate::storage::{self, Cursor, Page, StoredRoute};
use crate::store::{Pending, RouteStore, StoreError};
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
    key: SecretKey,
    /// For connecting and for each statement.
    timeout: Duration,
    /// Runs the listening connection's task behind the panic guard.
    tasks: Tasks,
    pub status: Status,
}

/// The database's counter row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub epoch: Uuid,
    pub revision: u64,
    /// Tombstones up to this revision may have been pruned.
    pub pruned_through: u64,
}

/// A row of the change feed: a route's record at `revision`, or its tombstone.
pub struct Change {
    pub uuid: Uuid,
    pub revision: u64,
    /// The sealed record (`storage::seal_record`); `None` for a deletion.
    pub record: Option<Vec<u8>>,
}

impl Change {
    /// A row of `SELECT uuid, revision, record`.
    fn from_row(row: &tokio_postgres::Row) -> Change {
        Change { uuid: row.get(0), revision: row.get::<_, i64>(1) as u64, record: row.get(2) }
    }
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
    pub fn new(url: &Secret, key: SecretKey, timeout: Duration, tasks: Tasks) -> Result<Database, String> {
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
        Ok(Database { config, tls, pool, key, timeout, tasks, status: Status::new() })
    }

    pub fn key(&self) -> &SecretKey {
        &self.key
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `work` within the statement timeout (a connection that swallows traffic does not hold it).
    pub async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, DbError> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(done) => done.map_err(sorted),
            Err(_) => Err(DbError::Unavailable(format!(
                "the database did not answer within {} ms (RECAST_DATABASE_TIMEOUT_MS)",
                self.timeout.as_millis()
            ))),
        }
    }

    /// A dedicated connection that listens for changes: `wake` is notified on every change
    /// announced; the returned receiver completes when the connection ends.
    pub async fn listen(
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
    pub async fn prepare(&self, client: &mut Client) -> Result<(), DbError> {
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

    /// Opens a read-only transaction that sees one snapshot of the database for all its reads.
    pub async fn snapshot<'c>(&self, client: &'c mut Client) -> Result<Transaction<'c>, DbError> {
        self.within(
            client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start(),
        )
        .await
    }

    pub async fn meta(&self, client: &impl GenericClient) -> Result<Meta, DbError> {
        let row = self
            .within(
                client.query_one("SELECT epoch, revision, pruned_through FROM recast_meta WHERE id = 1", &[]),
            )
            .await?;
        Ok(Meta {
            epoch: row.get(0),
            revision: row.get::<_, i64>(1) as u64,
            pruned_through: row.get::<_, i64>(2) as u64,
        })
    }

    /// Up to [`PAGE`] changes after `revision`, in revision order.
    pub async fn changes_after(
        &self,
        client: &impl GenericClient,
        revision: u64,
    ) -> Result<Vec<Change>, DbError> {
        let rows = self
            .within(client.query(
                "SELECT uuid, revision, record FROM recast_routes WHERE revision > $1 ORDER BY revision LIMIT $2",
                &[&(revision as i64), &PAGE],
            ))
            .await?;
        Ok(rows.iter().map(Change::from_row).collect())
    }

    /// Up to [`PAGE`] routes (no tombstones) after `uuid`, in uuid order: a full load, page by page.
    pub async fn routes_after(
        &self,
        client: &impl GenericClient,
        uuid: Uuid,
    ) -> Result<Vec<Change>, DbError> {
        let rows = self
            .within(client.query(
                "SELECT uuid, revision, record FROM recast_routes
                 WHERE record IS NOT NULL AND uuid > $1 ORDER BY uuid LIMIT $2",
                &[&uuid, &PAGE],
            ))
            .await?;
        Ok(rows.iter().map(Change::from_row).collect())
    }

    /// Removes tombstones deleted longer than `retention` ago and moves the pruning horizon past
    /// them. Returns how many were removed.
    pub async fn prune(&self, client: &mut Client, retention: Duration) -> Result<u64, DbError> {
        let work = async {
            let tx = client.transaction().await?;
            let rows = tx
                .query(
                    "DELETE FROM recast_routes
                     WHERE record IS NULL AND deleted_at <= now() - $1::float8 * interval '1 millisecond'
                     RETURNING revision",
                    &[&(retention.as_millis() as f64)],
                )
                .await?;
            if let Some(horizon) = rows.iter().map(|row| row.get::<_, i64>(0)).max() {
                tx.execute(
                    "UPDATE recast_meta SET pruned_through = greatest(pruned_through, $1) WHERE id = 1",
                    &[&horizon],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(rows.len() as u64)
        };
        self.within(work).await
    }

    /// One change in one transaction: the next revision from the counter row, the change, the
    /// notification. Nothing is written unless all of it commits.
    async fn change(&self, uuid: Uuid, change: Write) -> Result<u64, StoreError> {
        let mut client = self.pooled().await?;
        let work = async {
            let tx = client.transaction().await?;
            // Prepared once per pooled connection: the counter row stays locked from its update
            // to the commit, and each statement prepared meanwhile would hold it a round trip
            // longer, for every writer waiting behind it.
            let write = match &change {
                Write::Create(_) => {
                    "INSERT INTO recast_routes (uuid, revision, created_at, updated_at, record)
                     VALUES ($1, $2, $3, $4, $5)"
                }
                Write::Replace(..) => {
                    "UPDATE recast_routes SET revision = $2, updated_at = $3, record = $4
                     WHERE uuid = $1 AND revision = $5 AND record IS NOT NULL"
                }
                Write::Delete => {
                    "UPDATE recast_routes SET revision = $2, record = NULL, deleted_at = now()
                     WHERE uuid = $1 AND record IS NOT NULL"
                }
            };
            let next = tx
                .prepare_cached(
                    "UPDATE recast_meta SET revision = revision + 1 WHERE id = 1 RETURNING revision",
                )
                .await?;
            let write = tx.prepare_cached(write).await?;
            let notify = tx.prepare_cached("SELECT pg_notify($1, $2)").await?;
            let row = tx.query_one(&next, &[]).await?;
            let revision: i64 = row.get(0);
            let changed = match &change {
                Write::Create(route) => {
                    let record = storage::seal_record(&self.key, route, revision as u64);
                    let times = (route.created_at as i64, route.updated_at as i64);
                    tx.execute(&write, &[&uuid, &revision, &times.0, &times.1, &record]).await?
                }
                Write::Replace(route, held) => {
                    let record = storage::seal_record(&self.key, route, revision as u64);
                    tx.execute(
                        &write,
                        &[&uuid, &revision, &(route.updated_at as i64), &record, &(*held as i64)],
                    )
                    .await?
                }
                Write::Delete => tx.execute(&write, &[&uuid, &revision]).await?,
            };
            if changed == 0 {
                // Rolled back when `tx` is dropped. Why: deleted, or changed since this node read it.
                let now = tx
                    .query_opt(
                        "SELECT revision FROM recast_routes WHERE uuid = $1 AND record IS NOT NULL",
                        &[&uuid],
                    )
                    .await?;
                return Ok(Err(match (now, &change) {
                    (Some(row), Write::Replace(_, held)) => StoreError::Conflict(format!(
                        "route {uuid} was changed on another node meanwhile (it is at revision {}, this \
                         update was made on revision {held}); read it again and retry",
                        row.get::<_, i64>(0)
                    )),
                    _ => StoreError::NotFound,
                }));
            }
            tx.execute(&notify, &[&CHANNEL, &revision.to_string()]).await?;
            tx.commit().await?;
            Ok(Ok(revision as u64))
        };
        match self.within(work).await {
            Ok(done) => done,
            Err(e) => Err(e.into()),
        }
    }

    /// `recast routes import`: stores records exported from a standalone node, as they are (each
    /// gets its revision), in one transaction with one notification. A route the database
    /// already holds (or held: a tombstone) is skipped. Returns (imported, skipped).
    pub async fn import(&self, records: &[Vec<u8>]) -> Result<(usize, usize), DbError> {
        // Every record must open with this key before anything is written.
        let routes = records
            .iter()
            .map(|bytes| storage::imported_record(&self.key, bytes, 0).map(|(route, _)| route))
            .collect::<Result<Vec<StoredRoute>, _>>()
            .map_err(|e| DbError::Failed(e.to_string()))?;
        let mut client = self.pooled().await?;
        self.prepare(&mut client).await?;
        let tx = self.within(client.transaction()).await?;
        let mut there = HashSet::new();
        for chunk in routes.chunks(PAGE as usize) {
            let uuids: Vec<Uuid> = chunk.iter().map(|route| route.uuid).collect();
            let rows = self
                .within(tx.query("SELECT uuid FROM recast_routes WHERE uuid = ANY($1)", &[&uuids]))
                .await?;
            there.extend(rows.iter().map(|row| row.get::<_, Uuid>(0)));
        }
        // A route given twice is imported once.
        let fresh: Vec<usize> = (0..routes.len()).filter(|&i| there.insert(routes[i].uuid)).collect();
        let skipped = routes.len() - fresh.len();
        if fresh.is_empty() {
            return Ok((0, skipped));
        }
        // One bump of the counter for them all: a row updated once per record in one transaction
        // leaves a chain of versions that every later update walks.
        let row = self
            .within(tx.query_one(
                "UPDATE recast_meta SET revision = revision + $1 WHERE id = 1 RETURNING revision",
                &[&(fresh.len() as i64)],
            ))
            .await?;
        let first = row.get::<_, i64>(0) - fresh.len() as i64 + 1;
        for (n, chunk) in fresh.chunks(PAGE as usize).enumerate() {
            let mut rows = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (k, &i) in chunk.iter().enumerate() {
                let revision = first + (n * PAGE as usize + k) as i64;
                let (route, record) = storage::imported_record(&self.key, &records[i], revision as u64)
                    .map_err(|e| DbError::Failed(e.to_string()))?;
                rows.0.push(route.uuid);
                rows.1.push(revision);
                rows.2.push(route.created_at as i64);
                rows.3.push(route.updated_at as i64);
                rows.4.push(record);
            }
            self.within(tx.execute(
                "INSERT INTO recast_routes (uuid, revision, created_at, updated_at, record)
                 SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bytea[])",
                &[&rows.0, &rows.1, &rows.2, &rows.3, &rows.4],
            ))
            .await?;
        }
        self.within(tx.execute("SELECT pg_notify($1, 'import')", &[&CHANNEL])).await?;
        self.within(tx.commit()).await?;
        Ok((fresh.len(), skipped))
    }

    async fn page(&self, limit: usize, cursor: Option<Cursor>) -> Result<Page, StoreError> {
        let client = self.pooled().await?;
        let (after_time, after_uuid) = match &cursor {
            Some(cursor) => {
                let (time, uuid) = cursor.route();
                (Some(time as i64), uuid)
            }
            None => (None, Uuid::nil()),
        };
        let rows = self
            .within(client.query(
                "SELECT uuid, record FROM recast_routes
                 WHERE record IS NOT NULL
                   AND ($1::bigint IS NULL OR created_at < $1 OR (created_at = $1 AND uuid > $2))
                 ORDER BY created_at DESC, uuid ASC LIMIT $3",
                &[&after_time, &after_uuid, &(limit as i64 + 1)],
            ))
            .await?;
        let mut stored = Vec::with_capacity(rows.len().min(limit));
        for row in rows.iter().take(limit) {
            let uuid: Uuid = row.get(0);
            let record: Vec<u8> = row.get(1);
            stored.push(storage::open_record(&self.key, uuid, &record)?.0);
        }
        let next = (rows.len() > limit)
            .then(|| stored.last().map(|r: &StoredRoute| Cursor::after(r.created_at, r.uuid)))
            .flatten();
        Ok(Page { stored, next })
    }
}

enum Write {
    Create(StoredRoute),
    /// The route, and the revision this node held it at.
    Replace(StoredRoute, u64),
    Delete,
}

/// The database as the route store of the service.
pub struct ClusterStore {
    database: Arc<Database>,
}

impl ClusterStore {
    pub fn new(database: Arc<Database>) -> ClusterStore {
        ClusterStore { database }
    }
}

impl RouteStore for ClusterStore {
    fn create(&self, route: StoredRoute) -> Pending<'_, u64> {
        Box::pin(async move { self.database.change(route.uuid, Write::Create(route)).await })
    }

    fn replace(&self, route: StoredRoute, revision: u64) -> Pending<'_, u64> {
        Box::pin(async move { self.database.change(route.uuid, Write::Replace(route, revision)).await })
    }

    fn delete(&self, uuid: Uuid) -> Pending<'_, u64> {
        Box::pin(async move { self.database.change(uuid, Write::Delete).await })
    }

    fn page(&self, limit: usize, cursor: Option<Cursor>) -> Pending<'_, Page> {
        Box::pin(async move { self.database.page(limit, cursor).await })
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
}

impl Status {
    fn new() -> Status {
        Status {
            up: AtomicBool::new(false),
            revision: AtomicU64::new(0),
            synced_at: AtomicU64::new(u64::MAX),
            origin: Instant::now(),
        }
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
