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
        let standing = DatabaseState { epoch, revision, pruned_through, history_at_position };
        let plan = plan(position, &standing);
        let next = match (plan, position) {
            (Plan::Changes, Some(p)) => Next::After(p.revision),
            _ => Next::Routes(Uuid::nil()),
        };
        Ok(Reading { database, tx, plan, target, next })
    }

    /// Removes tombstones deleted longer than `retention` ago and moves the pruning horizon past
    /// them, and the history of revisions the database left longer than `retention` ago (its
    /// current row always stays). Returns how many tombstones were removed.
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
            // Every revision the database stood at within the retention stays (the newest row
            // older than it included), so a node away for less than the retention can still
            // vouch for where it stands, however long ago the last change was.
            tx.execute(
                "DELETE FROM recast_history WHERE revision <
                     (SELECT max(revision) FROM recast_history
                      WHERE at <= now() - $1::float8 * interval '1 millisecond')",
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

/// Where the database stands, as [`plan`] compares it with a node's position.
struct DatabaseState {
    epoch: Uuid,
    revision: u64,
    pruned_through: u64,
    /// The history's id of the change at the node's revision, if it has one.
    history_at_position: Option<Uuid>,
}

/// What a node at `position` must read, the database standing as `now` says.
fn plan(position: Option<Position>, now: &DatabaseState) -> Plan {
    match position {
        None => Plan::Reload { why: "this node has no snapshot yet", comparable: false },
        Some(p) if p.epoch != now.epoch => {
            Plan::Reload { why: "the database was recreated (its epoch changed)", comparable: false }
        }
        Some(p) if now.revision < p.revision => Plan::Reload {
            why: "the database's revision is below this node's (it was restored from a backup)",
            comparable: false,
        },
        // The database's history holds another change at this node's revision: what the node
        // applied up to there is another timeline's, whose revisions say nothing about the
        // database's.
        Some(p) if now.history_at_position.is_some() && now.history_at_position != p.history => {
            Plan::Reload {
                why: "the database's history at this node's revision is not the one it followed \
                  (it was restored from a backup and written since)",
                comparable: false,
            }
        }
        // Revisions still order versions, unless the history could not vouch for them.
        Some(p) if now.pruned_through > p.revision => Plan::Reload {
            why: "tombstones this node had not applied were pruned",
            comparable: p.history.is_some() && now.history_at_position == p.history,
        },
        // The node knew the change at its revision, and the database no longer does: that part
        // of the history was pruned (the node was away longer than the retention), or the
        // database was restored from a backup.
        Some(p) if p.history.is_some() && now.history_at_position.is_none() => Plan::Reload {
            why: "this node's revision is no longer in the database's history (it was away \
                  longer than the retention, or the database was restored from a backup)",
            comparable: false,
        },
        // Verified, or nothing to verify with: a position inside an import, or a revision that
        // a recast without the history wrote.
        Some(_) => Plan::Changes,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reads_the_changes_only_when_it_can_trust_where_it_stands() {
        let (epoch, other_epoch) = (Uuid::new_v4(), Uuid::new_v4());
        let (followed, other) = (Some(Uuid::new_v4()), Some(Uuid::new_v4()));
        let at = |revision, history| Some(Position { epoch, revision, history });
        let now = |revision, pruned_through, history_at_position| DatabaseState {
            epoch,
            revision,
            pruned_through,
            history_at_position,
        };
        let reload = |plan: Plan| match plan {
            Plan::Reload { comparable, .. } => Some(comparable),
            Plan::Changes => None,
        };
        let cases: [(&str, Option<Position>, DatabaseState, Option<bool>); 11] = [
            ("no snapshot", None, now(9, 0, None), Some(false)),
            ("the same history, further on", at(6, followed), now(9, 0, followed), None),
            ("the same history, where it stands", at(6, followed), now(6, 0, followed), None),
            (
                "recreated",
                Some(Position { epoch: other_epoch, revision: 6, history: followed }),
                now(9, 0, followed),
                Some(false),
            ),
            ("restored, not written past it", at(6, followed), now(3, 0, None), Some(false)),
            ("restored and written past it", at(6, followed), now(9, 0, other), Some(false)),
            // Restored, written past it and tombstones pruned: the history decides, and the
            // revisions of the two timelines are not compared.
            ("restored, written past it, pruned", at(6, followed), now(9, 8, other), Some(false)),
            ("tombstones pruned, the same history", at(6, followed), now(9, 8, followed), Some(true)),
            ("tombstones and history pruned", at(6, followed), now(9, 8, None), Some(false)),
            ("the history pruned", at(6, followed), now(9, 0, None), Some(false)),
            // A position inside an import, or at a revision a recast without the history wrote:
            // nothing to check it against.
            ("nothing to vouch for it", at(6, None), now(9, 0, None), None),
        ];
        for (case, position, standing, expected) in cases {
            assert_eq!(reload(plan(position, &standing)), expected, "{case}");
        }
        // A snapshot from before the history, at a revision the history now has: loaded once.
        assert_eq!(reload(plan(at(6, None), &now(9, 0, followed))), Some(false));
    }
}
