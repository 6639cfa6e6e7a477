//! The change feed: what a node reads to follow the database, and the decision of what it must
//! read. The follower (`server::sync`) only applies what this yields: pages of changes in
//! revision order, or, when the node cannot trust where it stands, every route ("reload
//! everything"), each time up to one consistent view of the database.
//!
//! A node stands at a [`Position`]: the database's epoch, the last revision it applied, and the
//! id the database's history gave the change at that revision. Every change writes a row of
//! `recast_history` with a random id in its own transaction, so a node can tell that the
//! history it followed is still the database's: a database restored from a backup keeps its
//! epoch, and once written past the node's revision again, holds a different id there.

use std::sync::Arc;

use tokio::sync::{Notify, oneshot};
use tokio_postgres::{Client, IsolationLevel, Transaction};
use uuid::Uuid;

use super::{Database, DbError, PAGE};
use crate::storage::Position;

/// A row of the change feed: a route's record at `revision`, or its tombstone.
pub struct Change {
    pub uuid: Uuid,
    pub revision: u64,
    /// The sealed record (`storage::seal_record`); `None` for a deletion.
    pub record: Option<Vec<u8>>,
    /// The history's id of the change at `revision`, when that change ended there (an import
    /// writes many revisions and ends at its last).
    history: Option<Uuid>,
}

/// The follower's own connection to the database: it listens for changes, and reads them.
pub struct Feed<'d> {
    database: &'d Database,
    client: Client,
    /// Notified on every change announced.
    wake: Arc<Notify>,
    /// Completes when the listening connection ends, with why.
    ended: oneshot::Receiver<String>,
}

/// What a node must read to stand where the database stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The changes after its position, in revision order.
    Changes,
    /// Every route, because where it stands cannot be trusted. `comparable`: the database's
    /// revisions still order its routes against the node's (tombstones were pruned); otherwise
    /// the database's version of each route wins.
    Reload { why: &'static str, comparable: bool },
}

/// One consistent view of the database (a repeatable-read transaction), read page by page.
pub struct Reading<'c> {
    database: &'c Database,
    tx: Transaction<'c>,
    plan: Plan,
    /// Where the node stands once every page is applied.
    target: Position,
    /// Where the next page starts.
    next: Next,
}

enum Next {
    /// Changes after this revision.
    After(u64),
    /// Routes after this uuid.
    Routes(Uuid),
    Done,
}

/// A page of the feed.
pub struct Page {
    pub changes: Vec<Change>,
    /// For a page of changes: where the node stands once it is applied.
    pub position: Option<Position>,
}

impl Database {
    /// The follower's feed: a dedicated connection that listens on the changes' channel (before
    /// anything is read, so no change slips between the two), with the schema made ready and
    /// the key checked.
    pub async fn feed(&self) -> Result<Feed<'_>, DbError> {
        let wake = Arc::new(Notify::new());
        let (mut client, ended) = self.listen(wake.clone()).await?;
        self.prepare(&mut client).await?;
        Ok(Feed { database: self, client, wake, ended })
    }
}

impl Feed<'_> {
    /// Waits for a change to be announced, or for `tick`; fails when the listening connection
    /// ended.
    pub async fn wait(&mut self, tick: &mut tokio::time::Interval) -> Result<(), DbError> {
        tokio::select! {
            () = self.wake.notified() => Ok(()),
            _ = tick.tick() => Ok(()),
            why = &mut self.ended => Err(DbError::Unavailable(
                why.unwrap_or_else(|_| "the listening connection ended".to_owned()),
            )),
        }
    }

    /// Begins reading from `position` (`None`: a node with no snapshot) up to the database's
    /// current revision, and decides whether that takes the changes since or every route.
    pub async fn read(&mut self, position: Option<Position>) -> Result<Reading<'_>, DbError> {
        let database = self.database;
        let tx = database
            .within(
                self.client
                    .build_transaction()
                    .isolation_level(IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start(),
            )
            .await?;
        let at = position.map_or(0, |p| p.revision) as i64;
        let row = database
            .within(tx.query_one(
                "SELECT epoch, revision, pruned_through,
                        (SELECT change FROM recast_history h WHERE h.revision = m.revision),
                        (SELECT change FROM recast_history h WHERE h.revision = $1)
                 FROM recast_meta m WHERE id = 1",
                &[&at],
            ))
            .await?;
        let epoch: Uuid = row.get(0);
        let revision = row.get::<_, i64>(1) as u64;
        let pruned_through = row.get::<_, i64>(2) as u64;
        let target = Position { epoch, revision, history: row.get(3) };
        let history_at_position: Option<Uuid> = row.get(4);
        let plan = match position {
            None => Plan::Reload { why: "this node has no snapshot yet", comparable: false },
            Some(p) if p.epoch != epoch => {
                Plan::Reload { why: "the database was recreated (its epoch changed)", comparable: false }
            }
            Some(p) if revision < p.revision => Plan::Reload {
                why: "the database's revision is below this node's (it was restored from a backup)",
                comparable: false,
            },
            Some(p) if pruned_through > p.revision => {
                Plan::Reload { why: "tombstones this node had not applied were pruned", comparable: true }
            }
            Some(p) if p.history.is_none() || p.history != history_at_position => Plan::Reload {
                why: "the database's history at this node's revision is not the one it followed \
                      (the database was restored from a backup and written since, or that part of \
                      its history was pruned)",
                comparable: false,
            },
            Some(_) => Plan::Changes,
        };
        let next = match (plan, position) {
            (Plan::Changes, Some(p)) => Next::After(p.revision),
            _ => Next::Routes(Uuid::nil()),
        };
        Ok(Reading { database, tx, plan, target, next })
    }

    /// Removes tombstones deleted, and history recorded, longer than `retention` ago, and moves
    /// the pruning horizon past the tombstones. The history's current row always stays. Returns
    /// how many tombstones were removed.
    pub async fn prune(&mut self, retention: std::time::Duration) -> Result<u64, DbError> {
        let work = async {
            let tx = self.client.transaction().await?;
            let millis = retention.as_millis() as f64;
            let rows = tx
                .query(
                    "DELETE FROM recast_routes
                     WHERE record IS NULL AND deleted_at <= now() - $1::float8 * interval '1 millisecond'
                     RETURNING revision",
                    &[&millis],
                )
                .await?;
            if let Some(horizon) = rows.iter().map(|row| row.get::<_, i64>(0)).max() {
                tx.execute(
                    "UPDATE recast_meta SET pruned_through = greatest(pruned_through, $1) WHERE id = 1",
                    &[&horizon],
                )
                .await?;
            }
            tx.execute(
                "DELETE FROM recast_history
                 WHERE at <= now() - $1::float8 * interval '1 millisecond'
                   AND revision < (SELECT revision FROM recast_meta WHERE id = 1)",
                &[&millis],
            )
            .await?;
            tx.commit().await?;
            Ok(rows.len() as u64)
        };
        self.database.within(work).await
    }
}

impl Reading<'_> {
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// Where the node stands once every page is applied: the database's revision, and the
    /// history's id there.
    pub fn target(&self) -> Position {
        self.target
    }

    /// The next page: up to [`PAGE`] changes in revision order (a route changed several times is
    /// read once, at its last change), or for a reload up to [`PAGE`] routes in uuid order;
    /// `None` once everything up to the target is read.
    pub async fn next_page(&mut self) -> Result<Option<Page>, DbError> {
        let changes = match self.next {
            Next::Done => return Ok(None),
            Next::After(revision) if revision >= self.target.revision => {
                self.next = Next::Done;
                return Ok(None);
            }
            Next::After(revision) => self.changes_after(revision).await?,
            Next::Routes(uuid) => self.routes_after(uuid).await?,
        };
        let Some(last) = changes.last() else {
            self.next = Next::Done;
            return Ok(None);
        };
        let position = match self.next {
            Next::After(_) => {
                self.next = Next::After(last.revision);
                Some(Position { epoch: self.target.epoch, revision: last.revision, history: last.history })
            }
            _ => {
                self.next = Next::Routes(last.uuid);
                None
            }
        };
        Ok(Some(Page { changes, position }))
    }

    /// Ends the view.
    pub async fn finish(self) -> Result<(), DbError> {
        self.database.within(self.tx.commit()).await
    }

    async fn changes_after(&self, revision: u64) -> Result<Vec<Change>, DbError> {
        let rows = self
            .database
            .within(self.tx.query(
                "SELECT r.uuid, r.revision, r.record, h.change FROM recast_routes r
                 LEFT JOIN recast_history h ON h.revision = r.revision
                 WHERE r.revision > $1 ORDER BY r.revision LIMIT $2",
                &[&(revision as i64), &PAGE],
            ))
            .await?;
        Ok(rows.iter().map(Change::from_row).collect())
    }

    async fn routes_after(&self, uuid: Uuid) -> Result<Vec<Change>, DbError> {
        let rows = self
            .database
            .within(self.tx.query(
                "SELECT uuid, revision, record, NULL::uuid AS change FROM recast_routes
                 WHERE record IS NOT NULL AND uuid > $1 ORDER BY uuid LIMIT $2",
                &[&uuid, &PAGE],
            ))
            .await?;
        Ok(rows.iter().map(Change::from_row).collect())
    }
}

impl Change {
    /// A row of `SELECT uuid, revision, record, history`.
    fn from_row(row: &tokio_postgres::Row) -> Change {
        Change {
            uuid: row.get(0),
            revision: row.get::<_, i64>(1) as u64,
            record: row.get(2),
            history: row.get(3),
        }
    }
}
