//! The database as the route store of the service: each change in one transaction with the
//! next revision, its history row and its notification; listings; `recast routes import`.

use std::collections::HashSet;
use std::sync::Arc;

use uuid::Uuid;

use super::{CHANNEL, Database, DbError, PAGE};
use crate::secrets::Keyring;
use crate::storage::{self, Cursor, KeyCounts, Page, ResealStep, StorageError, StoredRoute};
use crate::store::{Held, Pending, RouteStore, StoreError, StoreHealth};

impl Database {
    /// One change in one transaction: the next revision from the counter row with its history
    /// row, the change, the notification. Nothing is written unless all of it commits.
    async fn change(&self, uuid: Uuid, change: Write) -> Result<u64, StoreError> {
        let mut client = self.pooled().await?;
        let work = async {
            let tx = client.transaction().await?;
            // Prepared once per pooled connection: the counter row stays locked from its update
            // to the commit, and each statement prepared meanwhile would hold it a round trip
            // longer, for every writer waiting behind it.
            let write = match &change {
                // A uuid given to a registration (SPEC §2.5) may be a deleted route's: its
                // tombstone becomes the new route, whose revision is later than the deletion's.
                Write::Create(_) => {
                    "INSERT INTO recast_routes (uuid, revision, created_at, updated_at, record, name)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (uuid) DO UPDATE SET revision = excluded.revision,
                         created_at = excluded.created_at, updated_at = excluded.updated_at,
                         record = excluded.record, name = excluded.name, deleted_at = NULL
                     WHERE recast_routes.record IS NULL"
                }
                Write::Replace(..) => {
                    "UPDATE recast_routes SET revision = $2, updated_at = $3, record = $4, name = $6
                     WHERE uuid = $1 AND revision = $5 AND record IS NOT NULL"
                }
                Write::Delete(None) => {
                    "UPDATE recast_routes SET revision = $2, record = NULL, name = NULL, deleted_at = now()
                     WHERE uuid = $1 AND record IS NOT NULL"
                }
                Write::Delete(Some(_)) => {
                    "UPDATE recast_routes SET revision = $2, record = NULL, name = NULL, deleted_at = now()
                     WHERE uuid = $1 AND record IS NOT NULL AND revision = $3"
                }
            };
            // The next revision and its history row in one round trip. A row already at that
            // revision is a dead timeline's (a backup from before the history was restored over
            // it): this change takes its place.
            let next = tx
                .prepare_cached(
                    "WITH next AS (UPDATE recast_meta SET revision = revision + 1 WHERE id = 1 RETURNING revision)
                     INSERT INTO recast_history (revision, change) SELECT revision, $1 FROM next
                     ON CONFLICT (revision) DO UPDATE SET change = excluded.change, at = now()
                     RETURNING revision",
                )
                .await?;
            let write = tx.prepare_cached(write).await?;
            let notify = tx.prepare_cached("SELECT pg_notify($1, $2)").await?;
            let row = tx.query_one(&next, &[&Uuid::new_v4()]).await?;
            let revision: i64 = row.get(0);
            let written = match &change {
                Write::Create(route) => {
                    let record = storage::seal_record(&self.key, route, revision as u64);
                    let times = (route.created_at as i64, route.updated_at as i64);
                    let name = name_of(route);
                    tx.execute(&write, &[&uuid, &revision, &times.0, &times.1, &record, &name]).await
                }
                Write::Replace(route, held) => {
                    let record = storage::seal_record(&self.key, route, revision as u64);
                    let name = name_of(route);
                    tx.execute(
                        &write,
                        &[&uuid, &revision, &(route.updated_at as i64), &record, &(*held as i64), &name],
                    )
                    .await
                }
                Write::Delete(None) => tx.execute(&write, &[&uuid, &revision]).await,
                Write::Delete(Some(held)) => tx.execute(&write, &[&uuid, &revision, &(*held as i64)]).await,
            };
            let changed = match written {
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                    return Ok(Err(StoreError::Conflict(
                        "another route holds this route's name (stored meanwhile, perhaps through another node)"
                            .to_owned(),
                    )));
                }
                written => written?,
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
                    (Some(_), Write::Create(_)) => {
                        StoreError::Conflict(format!("a route holds the uuid {uuid} already"))
                    }
                    (Some(row), Write::Replace(_, held)) => StoreError::Conflict(format!(
                        "route {uuid} was changed on another node meanwhile (it is at revision {}, this \
                         update was made on revision {held}); read it again and retry",
                        row.get::<_, i64>(0)
                    )),
                    (Some(row), Write::Delete(Some(held))) => StoreError::Precondition(format!(
                        "the route is at version \"{}\" now, not \"{held}\" (`ETag` of GET /v1/routes/{uuid}); read it again, and delete that version",
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
        // The history records the import at its last revision: a node that stops inside it
        // loads everything again.
        let first = self.within(next_revisions(&tx, fresh.len())).await?;
        for (n, chunk) in fresh.chunks(PAGE as usize).enumerate() {
            let mut rows = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (k, &i) in chunk.iter().enumerate() {
                let revision = first + (n * PAGE as usize + k) as i64;
                let (route, record) = storage::imported_record(&self.key, &records[i], revision as u64)
                    .map_err(|e| DbError::Failed(e.to_string()))?;
                rows.0.push(route.uuid);
                rows.1.push(revision);
                rows.2.push(route.created_at as i64);
                rows.3.push(route.updated_at as i64);
                rows.4.push(record);
                // Names kept unique by the database's index, as any change's.
                rows.5.push(name_of(&route));
            }
            self.within(tx.execute(
                "INSERT INTO recast_routes (uuid, revision, created_at, updated_at, record, name)
                 SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bytea[], $6::text[])",
                &[&rows.0, &rows.1, &rows.2, &rows.3, &rows.4, &rows.5],
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
            match storage::open_record(&self.key, uuid, &record) {
                Ok((route, _)) => stored.push(route),
                // Listed by what can be read of it without the key; the route table holds it as
                // a route that answers 503 and says why.
                Err(StorageError::KeyMissing { uuid, created_at, updated_at, .. }) => {
                    stored.push(StoredRoute {
                        v: storage::SCHEMA_VERSION,
                        uuid,
                        created_at,
                        updated_at,
                        config: String::new(),
                    })
                }
                Err(e) => return Err(e.into()),
            }
        }
        let next = (rows.len() > limit)
            .then(|| stored.last().map(|r: &StoredRoute| Cursor::after(r.created_at, r.uuid)))
            .flatten();
        Ok(Page { stored, next })
    }
}

impl Database {
    /// How many records each key sealed, read a page at a time.
    async fn key_counts(&self) -> Result<KeyCounts, StoreError> {
        let client = self.pooled().await?;
        let mut counts = KeyCounts::default();
        let mut after: Option<Uuid> = None;
        loop {
            let rows = self
                .within(client.query(
                    "SELECT uuid, record FROM recast_routes
                     WHERE record IS NOT NULL AND ($1::uuid IS NULL OR uuid > $1)
                     ORDER BY uuid LIMIT $2",
                    &[&after, &PAGE],
                ))
                .await?;
            for row in &rows {
                let uuid: Uuid = row.get(0);
                let record: Vec<u8> = row.get(1);
                match storage::record_sealed_by(&self.key, uuid, &record) {
                    Ok(id) => *counts.records.entry(id).or_default() += 1,
                    Err(_) => counts.unreadable += 1,
                }
                after = Some(uuid);
            }
            if (rows.len() as i64) < PAGE {
                return Ok(counts);
            }
        }
    }

    /// One step of a re-seal: the next `limit` routes after `after` (by uuid), those another key
    /// sealed sealed again with this node's sealing key, in one transaction with the revisions
    /// they take, a history row and a notification, so every node loads them as any change.
    /// Refused while a live node seals with another key (or lacks this one): it would seal new
    /// routes with it, or could not open what this writes.
    async fn reseal_step(&self, after: Option<Uuid>, limit: usize) -> Result<ResealStep, StoreError> {
        let sealing = self.key.sealing();
        let lacking = self.nodes_sealing_otherwise(sealing).await?;
        if !lacking.is_empty() {
            let nodes = lacking.iter().map(Uuid::to_string).collect::<Vec<_>>().join(", ");
            return Err(StoreError::ResealRefused(format!(
                "node(s) {nodes} are alive and do not seal with key {sealing}, which this node seals \
                 with: they would seal new routes with another key, or could not open what a re-seal \
                 writes. Put the key first in every node's RECAST_SECRET_KEYS and restart them first"
            )));
        }
        let mut client = self.pooled().await?;
        let work = async {
            let tx = client.transaction().await?;
            // The counter row first, as every change takes it, then the routes: locks taken in
            // the same order as a change's cannot deadlock with one.
            tx.execute("SELECT 1 FROM recast_meta WHERE id = 1 FOR UPDATE", &[]).await?;
            if after.is_none() {
                tx.execute(
                    "UPDATE recast_meta SET key_check = $1 WHERE id = 1",
                    &[&storage::seal_key_check(&self.key)],
                )
                .await?;
            }
            // Locked until the commit: a change of one of them on any node waits for the counter
            // row, then finds the route at its new revision (409 `conflict`, as for any change
            // made meanwhile).
            let rows = tx
                .query(
                    "SELECT uuid, record FROM recast_routes
                     WHERE record IS NOT NULL AND ($1::uuid IS NULL OR uuid > $1)
                     ORDER BY uuid LIMIT $2 FOR UPDATE",
                    &[&after, &(limit as i64 + 1)],
                )
                .await?;
            let mut step = ResealStep::default();
            let mut due = Vec::new();
            for row in rows.iter().take(limit) {
                let uuid: Uuid = row.get(0);
                let record: Vec<u8> = row.get(1);
                step.scanned += 1;
                match storage::route_to_reseal(&self.key, uuid, &record) {
                    Ok(Some(route)) => due.push(route),
                    Ok(None) => {}
                    Err(StorageError::KeyMissing { key, .. }) => step.missing.push((uuid, key)),
                    Err(e) => {
                        tracing::error!(%uuid, error = %e, "a stored record that does not open was left as it is");
                        step.unreadable += 1;
                    }
                }
            }
            if rows.len() > limit {
                step.next = rows.get(limit - 1).map(|row| row.get::<_, Uuid>(0).as_bytes().to_vec());
            }
            if !due.is_empty() {
                let first = next_revisions(&tx, due.len()).await?;
                let revisions: Vec<i64> = (first..).take(due.len()).collect();
                let uuids: Vec<Uuid> = due.iter().map(|route| route.uuid).collect();
                let records: Vec<Vec<u8>> = due
                    .iter()
                    .zip(&revisions)
                    .map(|(route, &revision)| storage::seal_record(&self.key, route, revision as u64))
                    .collect();
                tx.execute(
                    "UPDATE recast_routes AS r SET revision = u.revision, record = u.record
                     FROM unnest($1::uuid[], $2::bigint[], $3::bytea[]) AS u(uuid, revision, record)
                     WHERE r.uuid = u.uuid",
                    &[&uuids, &revisions, &records],
                )
                .await?;
                let last = revisions.last().copied().unwrap_or(first);
                tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &last.to_string()]).await?;
                step.resealed = due.len();
            }
            tx.commit().await?;
            Ok(step)
        };
        Ok(self.within(work).await?)
    }
}

/// Takes the next `n` revisions in `tx`, in one bump of the counter with one history row at the
/// last (a node that stops inside them loads everything again); the first of them.
async fn next_revisions(
    tx: &tokio_postgres::Transaction<'_>,
    n: usize,
) -> Result<i64, tokio_postgres::Error> {
    let row = tx
        .query_one(
            "WITH next AS (UPDATE recast_meta SET revision = revision + $1 WHERE id = 1 RETURNING revision)
             INSERT INTO recast_history (revision, change) SELECT revision, $2 FROM next
             ON CONFLICT (revision) DO UPDATE SET change = excluded.change, at = now()
             RETURNING revision",
            &[&(n as i64), &Uuid::new_v4()],
        )
        .await?;
    Ok(row.get::<_, i64>(0) - n as i64 + 1)
}

enum Write {
    Create(StoredRoute),
    /// The route, and the revision this node held it at.
    Replace(StoredRoute, u64),
    /// A deletion; of the revision given only (`If-Match`).
    Delete(Option<u64>),
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

/// A route's `name` (SPEC §2.5), for the column that keeps names unique: read from its
/// configuration's text, which the record seals.
fn name_of(route: &StoredRoute) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(default)]
        name: Option<String>,
    }
    serde_json::from_str::<Named>(&route.config).ok().and_then(|named| named.name)
}

impl RouteStore for ClusterStore {
    fn create(&self, route: StoredRoute) -> Pending<'_, u64> {
        Box::pin(async move { self.database.change(route.uuid, Write::Create(route)).await })
    }

    fn replace(&self, route: StoredRoute, revision: u64) -> Pending<'_, u64> {
        Box::pin(async move { self.database.change(route.uuid, Write::Replace(route, revision)).await })
    }

    fn delete(&self, uuid: Uuid, revision: Option<u64>) -> Pending<'_, u64> {
        Box::pin(async move { self.database.change(uuid, Write::Delete(revision)).await })
    }

    fn page(&self, limit: usize, cursor: Option<Cursor>) -> Pending<'_, Page> {
        Box::pin(async move { self.database.page(limit, cursor).await })
    }

    fn keyring(&self) -> &Keyring {
        self.database.key()
    }

    fn key_counts(&self) -> Pending<'_, KeyCounts> {
        Box::pin(async move { self.database.key_counts().await })
    }

    fn reseal_step(&self, after: Option<Vec<u8>>, limit: usize, held: Held) -> Pending<'_, ResealStep> {
        let after = after.and_then(|bytes| Uuid::from_slice(&bytes).ok());
        // A step dropped before its commit is rolled back: the lock may go with it.
        Box::pin(async move {
            let step = self.database.reseal_step(after, limit).await;
            drop(held);
            step
        })
    }

    /// The database keeps no copy to compact away (PostgreSQL's vacuum reclaims the old rows);
    /// each node's snapshot gets the records as any change.
    fn resealed(&self) -> Pending<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn put_consumer(&self, consumer: crate::callers::StoredConsumer) -> Pending<'_, ()> {
        Box::pin(async move { Ok(self.database.put_consumer(&consumer).await?) })
    }

    fn delete_consumer(&self, name: String) -> Pending<'_, ()> {
        Box::pin(async move {
            if self.database.delete_consumer(&name).await? { Ok(()) } else { Err(StoreError::NotFound) }
        })
    }

    fn consumers(&self) -> Pending<'_, Vec<crate::callers::StoredConsumer>> {
        Box::pin(async move { Ok(self.database.live_consumers().await?) })
    }

    fn health(&self) -> Option<StoreHealth> {
        let status = &self.database.status;
        Some(StoreHealth { up: status.is_up(), revision: status.revision(), lag: status.lag() })
    }
}
