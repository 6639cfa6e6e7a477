//! A node from a file (SPEC §2.5, `RECAST_ROUTES_FILE`): the routes and consumers of a routes
//! file, compiled with no live call and nothing stored, served until the file changes. The file is
//! read again on SIGHUP and when it changes (its size, time or inode, looked at every second);
//! a file with any problem keeps what serves and logs every problem. Each route is swapped in
//! whole (a call holds the route it began with to its end); a route whose configuration did not
//! change keeps its compiled plan, its cached answers and its counts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{Lifecycle, State};
use crate::callers::StoredConsumer;
use crate::secrets::Keyring;
use crate::storage::{Cursor, KeyCounts, Page, ResealStep, StoredRoute};
use crate::store::{Held, Pending, RouteStore, StoreError};
use crate::table::Entry;

/// The store of a node from a file: it lists what the file gave and changes nothing (the admin
/// API answers 405 `read-only` before any change reaches it).
pub struct FileStore {
    keyring: Keyring,
    /// The routes of the file, by uuid, as listings page through them.
    listed: RwLock<Arc<Vec<StoredRoute>>>,
    /// The file's consumers.
    consumers: RwLock<Arc<Vec<StoredConsumer>>>,
    /// How many times a file was loaded: the revision of each route it made.
    loads: AtomicU64,
}

impl FileStore {
    /// A store with a key ring of its own, made now and never written: nothing is sealed.
    pub fn new() -> Result<FileStore, String> {
        let key = crate::secrets::Secret::new(crate::secrets::new_key_hex()?);
        Ok(FileStore {
            keyring: Keyring::load(Some(&key), Path::new("."), false)?,
            listed: RwLock::new(Arc::new(Vec::new())),
            consumers: RwLock::new(Arc::new(Vec::new())),
            loads: AtomicU64::new(0),
        })
    }
}

fn read_only<T>() -> Pending<'static, T>
where
    T: 'static,
{
    Box::pin(async {
        Err(StoreError::Failed("this node serves a routes file and stores nothing".to_owned()))
    })
}

impl RouteStore for FileStore {
    fn create(&self, _route: StoredRoute) -> Pending<'_, u64> {
        read_only()
    }

    fn replace(&self, _route: StoredRoute, _revision: u64) -> Pending<'_, u64> {
        read_only()
    }

    fn delete(&self, _uuid: Uuid, _revision: Option<u64>) -> Pending<'_, u64> {
        read_only()
    }

    fn page(&self, limit: usize, cursor: Option<Cursor>) -> Pending<'_, Page> {
        let listed = self.listed.read().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(async move {
            // By uuid: the file's routes were all made at its load.
            let from = match cursor.map(|c| c.route().1) {
                Some(after) => listed.partition_point(|route| route.uuid <= after),
                None => 0,
            };
            let stored: Vec<StoredRoute> = listed[from..].iter().take(limit).cloned().collect();
            let next = (from + stored.len() < listed.len())
                .then(|| stored.last().map(|last| Cursor::after(last.created_at, last.uuid)))
                .flatten();
            Ok(Page { stored, next })
        })
    }

    fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    fn key_counts(&self) -> Pending<'_, KeyCounts> {
        Box::pin(async { Ok(KeyCounts::default()) })
    }

    fn reseal_step(&self, _after: Option<Vec<u8>>, _limit: usize, _held: Held) -> Pending<'_, ResealStep> {
        read_only()
    }

    fn resealed(&self) -> Pending<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn put_consumer(&self, _consumer: StoredConsumer) -> Pending<'_, ()> {
        read_only()
    }

    fn delete_consumer(&self, _name: String) -> Pending<'_, ()> {
        read_only()
    }

    fn consumers(&self) -> Pending<'_, Vec<StoredConsumer>> {
        let consumers = self.consumers.read().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(async move { Ok(consumers.as_ref().clone()) })
    }
}

/// What a load did.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    pub routes: usize,
    pub changed: usize,
    pub removed: usize,
    pub took: Duration,
}

/// Reads the file at `path` and, when it has no problem, makes its routes and consumers the
/// ones this node serves. Its problems otherwise, each in words with its place.
pub fn load(state: &State, store: &FileStore, path: &Path) -> Result<Loaded, Vec<String>> {
    let began = Instant::now();
    let limits = state.config.limits();
    let file = crate::routes_file::read(path, &limits, None)
        .map_err(|problems| problems.iter().map(ToString::to_string).collect::<Vec<_>>())?;
    // RECAST_CALLERS_REQUIRED holds for a file's routes as for registered ones.
    if state.config.callers_required {
        let open: Vec<String> = (file.routes.iter().enumerate())
            .filter(|(_, route)| route.config.callers.is_none())
            .map(|(i, _)| format!("/routes/{i}/callers: RECAST_CALLERS_REQUIRED: say who may call this route (`consumers`, `jwt`, `certificates`), or \"callers\": \"open\""))
            .collect();
        if !open.is_empty() {
            return Err(open);
        }
    }
    let revision = store.loads.fetch_add(1, Ordering::AcqRel) + 1;
    let now = crate::callers::now_ms();
    let mut kept: HashSet<Uuid> = HashSet::with_capacity(file.routes.len());
    let mut listed = Vec::with_capacity(file.routes.len());
    let mut changed = 0;
    let mut made = Vec::with_capacity(file.routes.len());
    for route in file.routes {
        let current = state.table.get(&route.uuid).and_then(|entry| entry.route().cloned());
        let same = current.as_ref().is_some_and(|current| current.config == route.config);
        kept.insert(route.uuid);
        let created_at = current.as_ref().map_or(now, |current| current.created_at);
        listed.push(StoredRoute {
            v: crate::storage::SCHEMA_VERSION,
            uuid: route.uuid,
            created_at,
            updated_at: now,
            config: String::new(),
        });
        if same {
            continue;
        }
        let mut made_route = route.route;
        (made_route.created_at, made_route.updated_at, made_route.revision) = (created_at, now, revision);
        if let Some(current) = &current {
            made_route.statuses = current.statuses.clone();
            made_route.stats = current.stats.clone();
        }
        made.push(made_route);
        changed += 1;
    }
    // The file's consumers first, so that a route naming a new one finds it once it serves.
    for consumer in &file.consumers {
        state.door.directory.put(consumer.clone());
    }
    // Every route compiled first; then each swapped in.
    for route in made {
        let uuid = route.uuid;
        state.table.insert(Entry::Route(Arc::new(route)));
        state.cache.drop_route(uuid);
    }
    let mut gone = Vec::new();
    state.table.for_each(|entry| {
        if !kept.contains(&entry.uuid()) {
            gone.push(entry.uuid());
        }
    });
    for uuid in &gone {
        state.table.delete(*uuid, u64::MAX);
        state.cache.drop_route(*uuid);
    }
    // Then the consumers the file no longer names, once no route of it names them.
    let names: HashSet<&str> = file.consumers.iter().map(|c| c.name.as_str()).collect();
    for consumer in state.door.directory.all() {
        if !names.contains(consumer.name.as_str()) {
            state.door.directory.remove(&consumer.name);
        }
    }
    listed.sort_by_key(|route| route.uuid);
    *store.listed.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(listed);
    let routes = kept.len();
    *store.consumers.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(file.consumers);
    Ok(Loaded { routes, changed, removed: gone.len(), took: began.elapsed() })
}

/// The file's size, time and inode: what tells that it changed.
fn stamp(path: &Path) -> Option<(u64, std::time::SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?, std::os::unix::fs::MetadataExt::ino(&meta)))
}

/// Loads the file, makes the node `Running` once a load succeeded, and loads it again on SIGHUP
/// and when it changes, until the service stops.
pub async fn serve(state: Arc<State>, store: Arc<FileStore>, path: PathBuf) {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut seen = stamp(&path);
    let mut reason = "start";
    loop {
        let (loading, from, at) = (state.clone(), store.clone(), path.clone());
        let outcome = state
            .tasks
            .blocking(crate::metrics::PanicSite::Loading, move || load(&loading, &from, &at))
            .await;
        match outcome {
            Ok(Ok(loaded)) => {
                tracing::info!(
                    file = %path.display(), reason, routes = loaded.routes, changed = loaded.changed,
                    removed = loaded.removed, took_ms = loaded.took.as_millis() as u64, "routes file loaded"
                );
                state.advance(Lifecycle::Idle, Lifecycle::Running);
            }
            Ok(Err(problems)) => {
                for problem in &problems {
                    tracing::error!(file = %path.display(), problem = %problem, "routes file problem");
                }
                tracing::error!(
                    file = %path.display(), reason, problems = problems.len(),
                    "the routes file has problems: the routes that serve are kept"
                );
            }
            Err(_) => {
                tracing::error!(file = %path.display(), "loading the routes file failed (a bug, logged above)")
            }
        }
        // The next reason to read it again.
        loop {
            let signalled = async {
                match hangup.as_mut() {
                    Some(signal) => drop(signal.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = signalled => {
                    reason = "SIGHUP";
                    seen = stamp(&path);
                    break;
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    let now = stamp(&path);
                    if now != seen {
                        seen = now;
                        reason = "changed";
                        break;
                    }
                }
            }
        }
    }
}
