//! Cluster mode: the follower, which keeps this node's route table, its cache and its local
//! snapshot up to date with the database. The database's side (listening, reading, deciding
//! what must be read) is `cluster::Feed`; this only applies what it yields.
//!
//! A notification only wakes the follower: it then reads the feed from where the node stands, in
//! pages and up to one consistent view of the database, and applies each change: compiled and
//! swapped in when newer, removed on a tombstone, the route's cached answers dropped either way.
//! It also reads on a timer (`RECAST_SYNC_INTERVAL_MS`) and after every reconnect, so a lost
//! notification costs at most one interval; every statement has a deadline, so a connection
//! that swallows traffic is noticed. When the feed says the node must load everything (no
//! snapshot, a recreated or restored database, pruned tombstones), it does, in pages, and then
//! removes what the database no longer holds. Reconnects back off exponentially with jitter, up to
//! one sync interval, and at once when another statement of the node succeeds.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{Lifecycle, State};
use crate::cluster::{Change, Database, DbError, Feed, Plan, Reading};
use crate::metrics::PanicSite;
use crate::route::Route;
use crate::storage::{self, Position, Store};
use crate::table::Entry;
use crate::tasks::Tasks;
use crate::upstream::UpstreamClient;

/// Rows written into the snapshot at a time after a first load.
const SNAPSHOT_PAGE: usize = 1000;

/// Follows the database until the service stops; returns the reason only when no retry can mend
/// it (a wrong key, a newer schema), after which the node must stop. `snapshot` is the node's
/// own store, standing at `position`.
pub(super) async fn follow(
    state: Arc<State>,
    database: Arc<Database>,
    snapshot: Arc<Store>,
    mut position: Option<Position>,
) -> String {
    let follower = Follower { state, database, snapshot };
    let mut backoff = Backoff::new(Duration::from_millis(follower.state.config.sync_interval_ms));
    let mut failing = false;
    loop {
        let ended = follower.session(&mut position, &mut backoff, &mut failing).await;
        follower.database.status.set_up(false);
        let why = match ended {
            DbError::Fatal(why) => return why,
            DbError::Unavailable(why) | DbError::Failed(why) => why,
        };
        let wait = backoff.next();
        failing = true;
        tracing::warn!(
            error = %why,
            retry_in_ms = wait.as_millis() as u64,
            routes = follower.state.table.len(),
            "the route database cannot be followed; the routes loaded keep serving, changes wait"
        );
        // The database answering one of this node's other statements (its heartbeat, a write)
        // ends the wait: changes made as it came back reach this node at once.
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = follower.database.status.answered() => {}
        }
    }
}

/// What the follower works on.
struct Follower {
    state: Arc<State>,
    database: Arc<Database>,
    snapshot: Arc<Store>,
}

/// What [`Follower::apply`] does with the records it applied to the table.
#[derive(Clone, Copy)]
enum Snapshot {
    /// Writes them into the snapshot, which then stands at the position, if one is given (else
    /// its position stays).
    Write(Option<Position>),
    /// Returns them, to be written once the whole load is in the table.
    Later,
}

impl Follower {
    /// One connection's life: listen, make the schema ready, catch up, then catch up again on
    /// every notification and every tick. Returns why it ended.
    async fn session(
        &self,
        position: &mut Option<Position>,
        backoff: &mut Backoff,
        failing: &mut bool,
    ) -> DbError {
        let config = &self.state.config;
        let mut feed = match self.database.feed().await {
            Ok(feed) => feed,
            Err(e) => return e,
        };
        let mut tick = tokio::time::interval(Duration::from_millis(config.sync_interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let retention = Duration::from_millis(config.tombstone_retention_ms);
        // Pruning is cheap but needs no hurry: at most once a minute, or each retention period.
        // (Not `clamp`: a sync interval longer than a minute would be a floor above its ceiling.)
        let prune_every =
            retention.min(Duration::from_secs(60)).max(Duration::from_millis(config.sync_interval_ms));
        let mut pruned_at: Option<Instant> = None;
        loop {
            if let Err(e) = self.catch_up(&mut feed, position).await {
                return e;
            }
            let status = &self.database.status;
            if !status.is_up() {
                status.set_up(true);
                backoff.reset();
                if std::mem::take(failing) {
                    tracing::info!(revision = status.revision(), "the route database is back; caught up");
                }
            }
            if pruned_at.is_none_or(|at| at.elapsed() >= prune_every) {
                match feed.prune(retention).await {
                    Ok(0) => {}
                    Ok(pruned) => tracing::info!(pruned, "tombstones of deleted routes pruned"),
                    Err(e) => return e,
                }
                pruned_at = Some(Instant::now());
            }
            if let Err(e) = feed.wait(&mut tick).await {
                return e;
            }
        }
    }

    /// Brings the table and the snapshot to where the database stands.
    async fn catch_up(&self, feed: &mut Feed<'_>, position: &mut Option<Position>) -> Result<(), DbError> {
        let mut reading = feed.read(*position).await?;
        let target = reading.target();
        match reading.plan() {
            Plan::Reload { why, comparable } => {
                tracing::info!(
                    reason = why,
                    revision = target.revision,
                    "loading every route from the database"
                );
                self.load_all(&mut reading, comparable, position.is_none()).await?;
            }
            Plan::Changes => {
                let (from, mut rows) = (position.map_or(0, |p| p.revision), 0);
                while let Some(page) = reading.next_page().await? {
                    rows += page.changes.len();
                    self.apply(page.changes, Snapshot::Write(page.position), true).await?;
                }
                if self.database.status.revision() == 0 {
                    // The first catch-up of this process: from the snapshot it started with.
                    tracing::info!(from, to = target.revision, rows, "caught up from the snapshot");
                } else {
                    tracing::debug!(from, to = target.revision, rows, "caught up");
                }
            }
        }
        reading.finish().await?;
        if *position != Some(target) {
            // Tombstones pruned above the last row read: the snapshot still stands at the counter.
            let snapshot = self.snapshot.clone();
            self.blocking(move || snapshot.apply(&[], Some(target))).await?;
            *position = Some(target);
        }
        let status = &self.database.status;
        status.set_revision(target.revision);
        status.synced();
        self.state.advance(Lifecycle::Idle, Lifecycle::Running);
        Ok(())
    }

    /// Loads every route of the database, page by page, then removes what it no longer holds from
    /// the table and the snapshot, and sets the snapshot's position last (a crash before that
    /// loads again at the next start). `first`: this node had no snapshot, and its store's
    /// compactions are held until now; it serves as soon as its table is full, and writes the
    /// records into its snapshot after that (holding them meanwhile), so that serving does not
    /// wait for the snapshot's writes.
    async fn load_all(
        &self,
        reading: &mut Reading<'_>,
        comparable: bool,
        first: bool,
    ) -> Result<(), DbError> {
        let (state, target) = (&self.state, reading.target());
        if !comparable {
            state.table.forget_deletions();
        }
        let mut seen = HashSet::new();
        let mut held = Vec::new();
        let snapshot = if first { Snapshot::Later } else { Snapshot::Write(None) };
        let mut page = reading.next_page().await?;
        while let Some(routes) = page {
            seen.extend(routes.changes.iter().map(|change| change.uuid));
            // The next page is read while this one is compiled and applied.
            let (next, applied) =
                tokio::join!(reading.next_page(), self.apply(routes.changes, snapshot, comparable));
            held.extend(applied?);
            page = next?;
        }
        let (loaded, database, snapshot) = (state.clone(), self.database.clone(), self.snapshot.clone());
        self.blocking(move || {
            // Routes this node wrote after the reload's view was taken stay.
            let removed = loaded.table.retain(target.revision, |entry| {
                seen.contains(&entry.uuid()) || (comparable && entry.revision() > target.revision)
            });
            tracing::info!(
                routes = loaded.table.len(),
                removed,
                revision = target.revision,
                "every route loaded from the database"
            );
            if first {
                database.status.set_revision(target.revision);
                database.status.synced();
                database.status.set_up(true);
                loaded.advance(Lifecycle::Idle, Lifecycle::Running);
                // Changes made meanwhile are applied once the snapshot is written; a crash before
                // then loads everything again at the next start.
                snapshot.mark_loading()?;
            }
            snapshot.retain(|uuid| seen.contains(&uuid))?;
            // Written a page at a time from the end, each page's memory freed once it is written.
            // A stop ends it between pages: the snapshot is still marked loading, so the next
            // start loads everything again, and the stop does not wait for the rest.
            while !held.is_empty() {
                if loaded.lifecycle() == Lifecycle::Stopped {
                    tracing::info!("stopping: the snapshot is left to the next start, which loads again");
                    return Ok(());
                }
                let page = held.split_off(held.len().saturating_sub(SNAPSHOT_PAGE));
                snapshot.apply(&page, None)?;
            }
            snapshot.apply(&[], Some(target))?;
            if first {
                tracing::info!(revision = target.revision, "snapshot written: the next start serves from it");
                // Held since the start, so that merging did not share the cores with the load.
                super::load::resume_compactions(&snapshot);
            }
            Ok::<(), storage::StorageError>(())
        })
        .await
    }

    /// Applies changes to the table and the cache and then, as `snapshot` says, to the snapshot,
    /// decoding and compiling on the blocking pool, spread over the cores; the records kept for
    /// later, if any. `comparable`: revisions decide which version wins; otherwise (a reload
    /// after the database was recreated or restored) the database's version does.
    async fn apply(
        &self,
        changes: Vec<Change>,
        snapshot: Snapshot,
        comparable: bool,
    ) -> Result<Vec<(Uuid, Option<Vec<u8>>)>, DbError> {
        let (state, database, store) = (self.state.clone(), self.database.clone(), self.snapshot.clone());
        self.blocking(move || {
            let compiled = compile(&state, &database, &changes);
            for (change, route) in changes.iter().zip(compiled) {
                match route {
                    None => {
                        if state.table.delete(change.uuid, change.revision) {
                            state.cache.drop_route(change.uuid);
                        }
                    }
                    Some(Ok(entry)) => {
                        let why = state.stored_problem(&entry);
                        let uuid = entry.uuid();
                        if let Some(why) = why {
                            tracing::error!(%uuid, %why, "route from the database cannot serve calls; it answers 503");
                        }
                        let changed = if comparable {
                            state.table.apply(entry)
                        } else {
                            state.table.insert(entry);
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
                Snapshot::Write(position) => store.apply(&records, position).map(|()| Vec::new()),
                Snapshot::Later => Ok(records),
            }
        })
        .await
    }

    /// Runs table and snapshot work on the blocking pool, behind the panic guard. A panic there
    /// is a bug: counted, and the session ends as if the database had failed, so the work is
    /// tried again.
    async fn blocking<T: Send + 'static, E: std::fmt::Display>(
        &self,
        work: impl FnOnce() -> Result<T, E> + Send + 'static,
    ) -> Result<T, DbError> {
        let tasks: &Tasks = &self.state.tasks;
        match tasks.blocking(PanicSite::Follower, move || work().map_err(|e| e.to_string())).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(why)) => Err(DbError::Failed(format!("the local snapshot could not be written: {why}"))),
            Err(panic) => Err(DbError::Failed(format!("applying changes from the database failed: {panic}"))),
        }
    }
}

/// Unseals and compiles each change's route (`None` for a tombstone), on one thread per core.
fn compile(state: &State, database: &Database, changes: &[Change]) -> Vec<Option<Result<Entry, String>>> {
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
                                match storage::open_record(key, change.uuid, record) {
                                    Ok((stored, _)) => Route::from_stored(stored, limits).map(|mut route| {
                                        route.revision = change.revision;
                                        Entry::from(route)
                                    }),
                                    // Sealed by a key this node's ring lacks: listed, answering 503.
                                    Err(e) => super::load::locked(&e, Some(change.revision))
                                        .ok_or_else(|| e.to_string()),
                                }
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

/// Waits between reconnects: doubling from 100 ms up to the sync interval, each wait drawn between half and all of it so that many nodes do not come back at once.
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);

    /// Waits that double from [`Backoff::FIRST`] up to the sync interval: however long the
    /// database was away, the node tries again within one interval of its return.
    fn new(interval: Duration) -> Backoff {
        Backoff { next: Backoff::FIRST, max: interval.max(Backoff::FIRST) }
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

/// Cluster mode: this node's place among the nodes alive (`recast_nodes`), which every outbound
/// rate limit is shared by.
pub(super) struct Membership {
    pub database: Arc<Database>,
    pub node: Uuid,
    /// How often the node says it is alive.
    pub every: Duration,
    /// How long a node not heard of is still counted: three heartbeats, and at least one
    /// heartbeat and the database's timeout (a slow beat is not a node gone).
    pub alive: Duration,
    pub client: UpstreamClient,
}

impl Membership {
    /// Says the node is alive, and hands the count of nodes alive to the upstream client. A beat
    /// that fails keeps the last count (logged once until one works again).
    pub async fn beat(&self, failing: &mut bool) {
        match self.database.heartbeat(self.node, self.alive).await {
            Ok(nodes) => {
                if nodes != self.client.nodes() {
                    tracing::info!(
                        nodes,
                        "nodes alive in the cluster changed: each takes 1/nodes of every outbound rate limit"
                    );
                }
                self.client.set_nodes(nodes);
                if std::mem::take(failing) {
                    tracing::info!(nodes, "the heartbeat reaches the route database again");
                }
            }
            Err(e) if !*failing => {
                *failing = true;
                tracing::warn!(error = %e, nodes = self.client.nodes(), "the heartbeat cannot reach the route database; rate limits keep the last share");
            }
            Err(_) => {}
        }
    }

    /// Beats every `every` until the task is stopped.
    pub async fn keep(self) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            self.beat(&mut failing).await;
        }
    }
}

/// Cluster mode: keeps this node's consumers as the database holds them (SPEC §2.4). Every
/// `RECAST_SYNC_INTERVAL_MS` it reads the changes after the last one it applied and puts each in
/// the directory and in the node's own store (so a restart while the database is away keeps
/// them); the first reading, from nothing, sees every consumer and every deletion. `first` is
/// told once the first reading is applied, or failed.
pub(super) async fn follow_consumers(
    state: Arc<State>,
    database: Arc<Database>,
    local: Arc<Store>,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let interval = Duration::from_millis(state.config.sync_interval_ms);
    let mut after = 0i64;
    let mut first = Some(first);
    while state.lifecycle() != Lifecycle::Stopped {
        loop {
            match database.consumer_changes(after).await {
                Ok(changes) if changes.is_empty() => break,
                Ok(changes) => {
                    for change in changes {
                        let kept = match &change.consumer {
                            Some(consumer) => {
                                state.door.directory.put(consumer.clone());
                                local.put_consumer(consumer)
                            }
                            None => {
                                state.door.directory.remove(&change.name);
                                local.delete_consumer(&change.name).map(|_| ())
                            }
                        };
                        if let Err(e) = kept {
                            tracing::warn!(error = %e, consumer = %change.name, "a consumer's change could not be kept in this node's store");
                        }
                        after = change.revision;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the consumers could not be read; trying again");
                    break;
                }
            }
        }
        if let Some(first) = first.take() {
            first.send(()).ok();
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_sync_interval_with_jitter_and_starts_again_after_a_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(1000));
        let mut ceilings = Vec::new();
        for _ in 0..10 {
            let full = backoff.next;
            let wait = backoff.next();
            assert!(wait >= full / 2 && wait <= full, "{wait:?} outside [{:?}, {full:?}]", full / 2);
            ceilings.push(full.as_millis());
        }
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000, 1000]);
        backoff.reset();
        assert!(backoff.next() <= Duration::from_millis(100));
        // A longer interval is the ceiling; a shorter one than the first wait, the first wait.
        let mut long = Backoff::new(Duration::from_secs(60));
        let ceiling = (0..12).map(|_| (long.next, long.next()).0).max().unwrap();
        assert_eq!(ceiling, Duration::from_secs(60));
        assert_eq!(Backoff::new(Duration::from_millis(10)).max, Backoff::FIRST);
    }
}
