//! The route store behind one seam: every route change and listing the handlers make goes
//! through [`RouteStore`], chosen once at start-up: [`LocalStore`] (the embedded RocksDB of
//! `storage`, the default) or `cluster::ClusterStore` (PostgreSQL, shared by several nodes). The
//! handlers never ask which. The request path never calls it: route calls read only the
//! in-memory `RouteTable`.
//!
//! Each change answers with its revision: the embedded store's own counter, or the database's
//! in cluster mode. The route table orders the versions of a route by them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use uuid::Uuid;

use crate::callers::StoredConsumer;
use crate::metrics::PanicSite;
use crate::secrets::Keyring;
use crate::storage::{Cursor, KeyCounts, Page, ResealStep, StorageError, Store, StoredRoute};
use crate::tasks::{Panicked, Tasks};

/// What a store operation hands back when it is done.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A lock a store operation keeps until it is done.
pub type Held = Box<dyn std::any::Any + Send>;

/// Why a store operation did not change anything.
#[derive(Debug)]
pub enum StoreError {
    /// The store cannot be reached now (the database is down or does not answer in time).
    Unavailable(String),
    /// The route is not the version this node holds: it changed elsewhere (what it is now).
    Conflict(String),
    /// A conditional change named a version the store no longer holds (what it holds now).
    Precondition(String),
    /// No such route.
    NotFound,
    /// The store refused or failed the operation.
    Failed(String),
    /// The operation panicked (a bug, already logged and counted); the message of the panic.
    Panicked(String),
    /// A re-seal that must not run now (why).
    ResealRefused(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable(why) => write!(f, "the route store is unavailable: {why}"),
            StoreError::Conflict(why) | StoreError::Precondition(why) => f.write_str(why),
            StoreError::NotFound => f.write_str("no such route"),
            StoreError::Failed(why) => write!(f, "storage failed: {why}"),
            StoreError::Panicked(panic) => write!(f, "a store operation panicked: {panic}"),
            StoreError::ResealRefused(why) => f.write_str(why),
        }
    }
}

impl From<StorageError> for StoreError {
    fn from(e: StorageError) -> StoreError {
        StoreError::Failed(e.to_string())
    }
}

/// Where routes are kept.
pub trait RouteStore: Send + Sync {
    /// Stores a new route; answers the change's revision.
    fn create(&self, route: StoredRoute) -> Pending<'_, u64>;

    /// Replaces the route `route.uuid`, which this node holds at `revision`: [`StoreError::Conflict`]
    /// when the store holds another revision, [`StoreError::NotFound`] when it was deleted.
    fn replace(&self, route: StoredRoute, revision: u64) -> Pending<'_, u64>;

    /// Deletes a route, leaving a tombstone where there is a change feed; answers the deletion's
    /// revision, or [`StoreError::NotFound`]. With `revision`, only that version of it
    /// (`If-Match`): [`StoreError::Precondition`] when the store holds another.
    fn delete(&self, uuid: Uuid, revision: Option<u64>) -> Pending<'_, u64>;

    /// Up to `limit` routes, newest first, after `cursor`.
    fn page(&self, limit: usize, cursor: Option<Cursor>) -> Pending<'_, Page>;

    /// The keys that seal and open the records.
    fn keyring(&self) -> &Keyring;

    /// How many stored records each key sealed (`GET /v1/keys`).
    fn key_counts(&self) -> Pending<'_, KeyCounts>;

    /// One step of a re-seal (`POST /v1/keys/reseal`): of the next `limit` records after
    /// `after`, those another key sealed are sealed again with the ring's first key, as one
    /// durable change. `held` is the service's write lock, kept until the step is written or
    /// undone, whatever becomes of the future.
    fn reseal_step(&self, after: Option<Vec<u8>>, limit: usize, held: Held) -> Pending<'_, ResealStep>;

    /// After a re-seal: what must follow (the embedded store compacts, so the old sealed copies
    /// leave its files).
    fn resealed(&self) -> Pending<'_, ()>;

    /// Stores a consumer in place of what was stored of it (SPEC §2.4).
    fn put_consumer(&self, consumer: StoredConsumer) -> Pending<'_, ()>;

    /// Removes a consumer; [`StoreError::NotFound`] when there was none.
    fn delete_consumer(&self, name: String) -> Pending<'_, ()>;

    /// Every stored consumer.
    fn consumers(&self) -> Pending<'_, Vec<StoredConsumer>>;

    /// How this node stands with a store it shares with others, for `/readyz` and `/metrics`;
    /// `None` for a store of its own, which is always at hand.
    fn health(&self) -> Option<StoreHealth> {
        None
    }
}

/// How a node stands with a shared store.
#[derive(Debug, Clone, Copy)]
pub struct StoreHealth {
    /// Whether the store answers now.
    pub up: bool,
    /// The last revision this node applied.
    pub revision: u64,
    /// How long since the node last knew it had every change.
    pub lag: std::time::Duration,
}

/// The embedded store: RocksDB in the data directory, each change one synced write, run off the
/// async workers.
pub struct LocalStore {
    store: Arc<Store>,
    tasks: Tasks,
}

impl LocalStore {
    pub fn new(store: Arc<Store>, tasks: Tasks) -> LocalStore {
        LocalStore { store, tasks }
    }

    fn blocking<T: Send + 'static>(
        &self,
        operation: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Pending<'_, T> {
        let store = self.store.clone();
        Box::pin(async move {
            match self.tasks.blocking(PanicSite::Storage, move || operation(&store)).await {
                Ok(result) => result,
                Err(Panicked(panic)) => Err(StoreError::Panicked(panic)),
            }
        })
    }
}

impl RouteStore for LocalStore {
    fn create(&self, route: StoredRoute) -> Pending<'_, u64> {
        self.blocking(move |store| Ok(store.put(&route)?))
    }

    fn replace(&self, route: StoredRoute, _revision: u64) -> Pending<'_, u64> {
        // One writer: the service applies replacements one at a time and checks the table first.
        self.blocking(move |store| Ok(store.put(&route)?))
    }

    fn delete(&self, uuid: Uuid, _revision: Option<u64>) -> Pending<'_, u64> {
        // One writer: the service deletes under its write lock, after checking the version in
        // the table, which no other process changes.
        self.blocking(move |store| store.delete(uuid)?.ok_or(StoreError::NotFound))
    }

    fn page(&self, limit: usize, cursor: Option<Cursor>) -> Pending<'_, Page> {
        self.blocking(move |store| Ok(store.page(limit, cursor.as_ref())?))
    }

    fn keyring(&self) -> &Keyring {
        self.store.keyring()
    }

    fn key_counts(&self) -> Pending<'_, KeyCounts> {
        self.blocking(move |store| Ok(store.key_counts()?))
    }

    fn reseal_step(&self, after: Option<Vec<u8>>, limit: usize, held: Held) -> Pending<'_, ResealStep> {
        self.blocking(move |store| {
            let step = store.reseal_step(after.as_deref(), limit);
            drop(held);
            Ok(step?)
        })
    }

    fn resealed(&self) -> Pending<'_, ()> {
        self.blocking(move |store| Ok(store.forget_old_seals()?))
    }

    fn put_consumer(&self, consumer: StoredConsumer) -> Pending<'_, ()> {
        self.blocking(move |store| Ok(store.put_consumer(&consumer)?))
    }

    fn delete_consumer(&self, name: String) -> Pending<'_, ()> {
        self.blocking(
            move |store| if store.delete_consumer(&name)? { Ok(()) } else { Err(StoreError::NotFound) },
        )
    }

    fn consumers(&self) -> Pending<'_, Vec<StoredConsumer>> {
        self.blocking(move |store| Ok(store.consumers()?))
    }
}
