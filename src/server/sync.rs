//! Cluster mode: the follower, which keeps this node's route table and its local snapshot up to
//! date with the database.
//!
//! It holds one connection of its own that `LISTEN`s, and starts listening before it catches up,
//! so no change slips between the two. A notification only wakes it: it then reads every change
//! above the last revision it applied, in revision order and in pages, inside one repeatable-read
//! transaction (one consistent view of the counter, the pruning horizon and the rows), and applies
//! each: compiled and swapped in when newer, removed on a tombstone. It also checks on a timer
//! (`RECAST_SYNC_INTERVAL_MS`) and after every reconnect, so a lost notification costs at most one
//! interval; every statement has a deadline, so a connection that swallows traffic is noticed.
//!
//! It loads everything (in pages) only when it must: a node without a snapshot, a database whose
//! epoch changed (recreated) or whose counter is below the snapshot's (restored), or tombstones
//! pruned past the snapshot's revision. Reconnects back off exponentially with jitter.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_postgres::Client;
use uuid::Uuid;

use super::{Lifecycle, State};
use crate::cluster::{Change, Database, DbError, Meta, PAGE};
use crate::metrics::{PanicSite, RulesSource};
use crate::route::Route;
use crate::storage::{self, Position};
use crate::tasks::Tasks;

/// Follows the database until the service stops; returns the reason only when no retry can mend
/// it (a wrong key, a newer schema), after which the node must stop.
pub(super) async fn follow(
    state: Arc<State>,
    database: Arc<Database>,
    mut position: Option<Position>,
) -> String {
    let mut backoff = Backoff::new(Duration::from_millis(state.config.sync_interval_ms));
    let mut failing = false;
    loop {
        let ended = session(&state, &database, &mut position, &mut backoff, &mut failing).await;
        database.status.set_up(false);
        let why = match ended {
            DbError::Fatal(why) => return why,
            DbError::Unavailable(why) | DbError::Failed(why) => why,
        };
        let wait = backoff.next();
        failing = true;
        tracing::warn!(
            error = %why,
            retry_in_ms = wait.as_millis() as u64,
            routes = state.table.len(),
            "the route database cannot be followed; the routes loaded keep serving, changes wait"
        );
        tokio::time::sleep(wait).await;
    }
}

/// One connection's life: listen, make the schema ready, catch up, then catch up again on every
/// notification and every tick. Returns why it ended.
async fn session(
    state: &Arc<State>,
    database: &Arc<Database>,
    position: &mut Option<Position>,
    backoff: &mut Backoff,
    failing: &mut bool,
) -> DbError {
    let wake = Arc::new(Notify::new());
    let (mut client, mut ended) = match database.listen(wake.clone()).await {
        Ok(listening) => listening,
        Err(e) => return e,
    };
    if let Err(e) = database.prepare(&mut client).await {
        return e;
    }
    let mut tick = tokio::time::interval(Duration::from_millis(state.config.sync_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let retention = Duration::from_millis(state.config.tombstone_retention_ms);
    // Pruning is cheap but needs no hurry: at most once a minute, or each retention period.
    let prune_every =
        retention.clamp(Duration::from_millis(state.config.sync_interval_ms), Duration::from_secs(60));
    let mut pruned_at: Option<Instant> = None;
    loop {
        if let Err(e) = catch_up(state, database, &mut client, position).await {
            return e;
        }
        if !database.status.is_up() {
            database.status.set_up(true);
            backoff.reset();
            if std::mem::take(failing) {
                tracing::info!(
                    revision = database.status.revision(),
                    "the route database is back; caught up"
                );
            }
        }
        if pruned_at.is_none_or(|at| at.elapsed() >= prune_every) {
            match database.prune(&mut client, retention).await {
                Ok(0) => {}
                Ok(pruned) => tracing::info!(pruned, "tombstones of deleted routes pruned"),
                Err(e) => return e,
            }
            pruned_at = Some(Instant::now());
        }
        tokio::select! {
            () = wake.notified() => {}
            _ = tick.tick() => {}
            why = &mut ended => {
                return DbError::Unavailable(why.unwrap_or_else(|_| "the listening connection ended".to_owned()));
            }
        }
    }
}

/// Brings the table and the snapshot to the database's current revision.
async fn catch_up(
    state: &Arc<State>,
    database: &Arc<Database>,
    client: &mut Client,
    position: &mut Option<Position>,
) -> Result<(), DbError> {
    let tx = database.snapshot(client).await?;
    let meta = database.meta(&tx).await?;
    let reload = match position {
        None => Some("this node has no snapshot yet"),
        Some(p) if p.epoch != meta.epoch => Some("the database was recreated (its epoch changed)"),
        Some(p) if meta.revision < p.revision => {
            Some("the database's revision is below this node's (it was restored from a backup)")
        }
        Some(p) if meta.pruned_through > p.revision => {
            Some("tombstones this node had not applied were pruned")
        }
        Some(_) => None,
    };
    match (reload, *position) {
        (Some(why), previous) => {
            // Revisions of another epoch (or of a restored database) say nothing about these.
            let comparable = previous.is_some_and(|p| p.epoch == meta.epoch && meta.revision >= p.revision);
            tracing::info!(reason = why, revision = meta.revision, "loading every route from the database");
            load_all(state, database, &tx, meta, comparable, previous.is_none()).await?;
        }
        (None, Some(mut at)) => {
            // Rows, not changes: a route changed several times is read once, at its last change.
            let (from, mut rows) = (at.revision, 0);
            while at.revision < meta.revision {
                let changes = database.changes_after(&tx, at.revision).await?;
                let Some(last) = changes.last() else { break };
                at.revision = last.revision;
                rows += changes.len();
                apply(state, database, changes, Snapshot::Write(Some(at)), true).await?;
            }
            if database.status.revision() == 0 {
                // The first catch-up of this process: from the snapshot it started with.
                tracing::info!(from, to = meta.revision, rows, "caught up from the snapshot");
            } else {
                tracing::debug!(from, to = meta.revision, rows, "caught up");
            }
        }
        (None, None) => unreachable!("a node without a position reloads"),
    }
    database.within(tx.commit()).await?;
    let now = Position { epoch: meta.epoch, revision: meta.revision };
    if *position != Some(now) {
        // Tombstones pruned above the last row read: the snapshot still stands at the counter.
        let snapshot = state.local.clone();
        blocking(&state.tasks, move || snapshot.apply(&[], Some(now))).await?;
        *position = Some(now);
    }
    database.status.set_revision(meta.revision);
    database.status.synced();
    state.advance(Lifecycle::Idle, Lifecycle::Running);
    Ok(())
}

/// Loads every route of the database, page by page, then removes what it no longer holds from
/// the table and the snapshot, and sets the snapshot's position last (a crash before that
/// reloads again at the next start). `first`: this node had no snapshot, and its store's
/// compactions are held until now; it serves as soon as its table is full, and writes the
/// records into its snapshot after that (holding them meanwhile), since writing them took about a
/// third of the load's time.
async fn load_all(
    state: &Arc<State>,
    database: &Arc<Database>,
    tx: &tokio_postgres::Transaction<'_>,
    meta: Meta,
    comparable: bool,
    first: bool,
) -> Result<(), DbError> {
    if !comparable {
        state.table.forget_deletions();
    }
    let mut seen = HashSet::new();
    let mut held = Vec::new();
    let snapshot = if first { Snapshot::HandBack } else { Snapshot::Write(None) };
    let mut routes = database.routes_after(tx, Uuid::nil()).await?;
    while let Some(after) = routes.last().map(|change| change.uuid) {
        seen.extend(routes.iter().map(|change| change.uuid));
        // The next page is read while this one is compiled and applied.
        let (next, applied) = tokio::join!(
            database.routes_after(tx, after),
            apply(state, database, routes, snapshot, comparable)
        );
        held.extend(applied?);
        routes = next?;
    }
    let position = Position { epoch: meta.epoch, revision: meta.revision };
    let loaded = state.clone();
    let database = database.clone();
    blocking(&state.tasks, move || {
        // Routes this node wrote after the reload's view was taken stay.
        let removed = loaded.table.retain(meta.revision, |route| {
            seen.contains(&route.uuid) || (comparable && route.revision > meta.revision)
        });
        tracing::info!(
            routes = loaded.table.len(),
            removed,
            revision = meta.revision,
            "every route loaded from the database"
        );
        if first {
            database.status.set_revision(meta.revision);
            database.status.synced();
            database.status.set_up(true);
            loaded.advance(Lifecycle::Idle, Lifecycle::Running);
            // Changes made meanwhile are applied once the snapshot is written (about a second
            // for 10^5 routes); a crash before then loads everything again at the next start.
            loaded.local.mark_loading()?;
        }
        loaded.local.retain(|uuid| seen.contains(&uuid))?;
        // Written a page at a time from the end, each page's memory freed once it is written.
        while !held.is_empty() {
            let page = held.split_off(held.len().saturating_sub(PAGE as usize));
            loaded.local.apply(&page, None)?;
        }
        loaded.local.apply(&[], Some(position))?;
        if first {
            tracing::info!(revision = meta.revision, "snapshot written: the next start serves from it");
            // Held since the start, so that merging did not share the cores with the load.
            super::resume_compactions(&loaded.local);
        }
        Ok::<(), storage::StorageError>(())
    })
    .await
}

/// What [`apply`] does with the records it applied to the table.
#[derive(Clone, Copy)]
enum Snapshot {
    /// Writes them into the snapshot, which then stands at the position, if one is given (else
    /// its position stays).
    Write(Option<Position>),
    /// Hands them back to be written later.
    HandBack,
}

/// Applies changes to the table and then, as `snapshot` says, to the snapshot, decoding and
/// compiling on the blocking pool, spread over the cores; the records handed back, if any.
/// `comparable`: revisions decide which version wins; otherwise (a reload after the database was
/// recreated or restored) the database's version does.
async fn apply(
    state: &Arc<State>,
    database: &Arc<Database>,
    changes: Vec<Change>,
    snapshot: Snapshot,
    comparable: bool,
) -> Result<Vec<(Uuid, Option<Vec<u8>>)>, DbError> {
    let (tasks, state, database) = (state.tasks.clone(), state.clone(), database.clone());
    blocking(&tasks, move || {
        let compiled = compile(&state, &database, &changes);
        for (change, route) in changes.iter().zip(compiled) {
            match route {
                None => {
                    if state.table.bury(change.uuid, change.revision) {
                        state.cache.drop_route(change.uuid);
                    }
                }
                Some(Ok(mut route)) => {
                    route.revision = change.revision;
                    if let Some(why) = route.broken() {
                        if route.rules.is_err() {
                            state.metrics.compile_failure(RulesSource::Stored);
                        }
                        tracing::error!(uuid = %route.uuid, %why, "route from the database cannot serve calls; it answers 503");
                    }
                    let uuid = route.uuid;
                    let changed = if comparable {
                        state.table.apply(route)
                    } else {
                        state.table.insert(Arc::new(route));
                        true
                    };
                    if changed {
                        state.cache.drop_route(uuid);
                    }
                }
                Some(Err(why)) => tracing::error!(uuid = %change.uuid, %why, "route from the database skipped"),
            }
        }
        let records: Vec<(Uuid, Option<Vec<u8>>)> = changes.into_iter().map(|c| (c.uuid, c.record)).collect();
        match snapshot {
            Snapshot::Write(position) => state.local.apply(&records, position).map(|()| Vec::new()),
            Snapshot::HandBack => Ok(records),
        }
    })
    .await
}

/// Unseals and compiles each change's route (`None` for a tombstone), on one thread per core.
fn compile(state: &State, database: &Database, changes: &[Change]) -> Vec<Option<Result<Route, String>>> {
    let limits = state.config.limits();
    let key = database.key();
    let threads = crate::config::cores().min(changes.len().div_ceil(64)).max(1);
    let chunk = changes.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = changes
            .chunks(chunk)
            .map(|part| {
                let limits = &limits;
                scope.spawn(move || {
                    part.iter()
                        .map(|change| {
                            change.record.as_ref().map(|record| {
                                storage::open_record(key, change.uuid, record)
                                    .map_err(|e| e.to_string())
                                    .and_then(|(stored, _)| Route::from_stored(stored, limits))
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        // A panic in a part is a bug: carried on to the caller's guard.
        parts
            .into_iter()
            .flat_map(|part| part.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Runs table and snapshot work on the blocking pool. A panic there is a bug: counted, and the
/// session ends as if the database had failed, so the work is tried again.
async fn blocking<T: Send + 'static, E: std::fmt::Display>(
    tasks: &Tasks,
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, DbError> {
    match tasks.blocking(PanicSite::Follower, move || work().map_err(|e| e.to_string())).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(why)) => Err(DbError::Failed(format!("the local snapshot could not be written: {why}"))),
        Err(panic) => Err(DbError::Failed(format!("applying changes from the database failed: {panic}"))),
    }
}

/// Waits between reconnects: doubling from 100 ms up to 10 s (or the sync interval, if longer),
/// each wait drawn between half and all of it so that many nodes do not come back at once.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);

    fn new(interval: Duration) -> Backoff {
        Backoff { next: Backoff::FIRST, max: interval.max(Duration::from_secs(10)) }
    }

    fn next(&mut self) -> Duration {
        let full = self.next;
        self.next = (self.next * 2).min(self.max);
        let mut bytes = [0u8; 8];
        let random = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .map(|()| u64::from_le_bytes(bytes))
            .unwrap_or(0);
        let half = full / 2;
        half + Duration::from_nanos(random % (half.as_nanos() as u64 + 1))
    }

    fn reset(&mut self) {
        self.next = Backoff::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_ceiling_with_jitter_and_starts_again_after_a_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(1000));
        let mut ceilings = Vec::new();
        for _ in 0..10 {
            let full = backoff.next;
            let wait = backoff.next();
            assert!(wait >= full / 2 && wait <= full, "{wait:?} outside [{:?}, {full:?}]", full / 2);
            ceilings.push(full.as_millis());
        }
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000]);
        backoff.reset();
        assert!(backoff.next() <= Duration::from_millis(100));
    }
}
