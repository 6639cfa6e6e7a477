//! Loading the stored routes at start: every record is read from the data directory's RocksDB
//! (the routes themselves, or a cluster node's snapshot), unsealed, parsed and compiled into the
//! route table before the service leaves `Idle`.

use std::sync::{Arc, Mutex, PoisonError};

use super::State;
use crate::route::{LockedRoute, Route};
use crate::storage::{RawRecord, StorageError, Store};
use crate::table::Entry;

/// Puts every consumer `store` holds in the directory the request path reads (a cluster node's
/// are its copy of the database's, which the consumer follower keeps up to date).
fn load_consumers(state: &State, store: &Store) {
    match store.each_consumer(|consumer| state.door.directory.put(consumer)) {
        Ok(count) => {
            if count > 0 {
                tracing::info!(
                    consumers = count,
                    keys = state.door.directory.key_count(),
                    "consumers loaded"
                );
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "the stored consumers could not be read; their keys are refused")
        }
    }
}

/// Loads and compiles every route `store` holds into the table, decoding and compiling on one thread
/// per core while this one reads the store. A route that no longer compiles stays, and answers
/// 503 with the reason; an unreadable record is logged.
pub(super) fn load_routes(state: &State, store: &Store) {
    load_consumers(state, store);
    /// Records handed to a decoding thread at a time.
    const BATCH: usize = 256;
    let limits = state.config.limits();
    let threads = crate::config::cores();
    let (batches, receiver) = std::sync::mpsc::sync_channel::<Vec<RawRecord>>(threads * 2);
    // Only the decoders hold the receiver, so if they all ended, sending fails instead of blocking.
    let receiver = Arc::new(Mutex::new(receiver));
    let counts = std::thread::scope(|scope| {
        let decoders: Vec<_> = (0..threads)
            .map(|_| {
                let receiver = receiver.clone();
                let limits = &limits;
                std::thread::Builder::new()
                    .name("recast-loader".to_owned())
                    .spawn_scoped(scope, move || {
                        let mut counts = Loaded::default();
                        loop {
                            // The lock is held only while waiting for the next batch.
                            let next = receiver.lock().unwrap_or_else(PoisonError::into_inner).recv();
                            let Ok(batch) = next else { break };
                            for record in batch {
                                let route = match store.decode_revised(&record) {
                                    Ok((stored, revision)) => {
                                        Route::from_stored(stored, limits).map(|mut route| {
                                            route.revision = revision;
                                            Entry::from(route)
                                        })
                                    }
                                    // Sealed by a key the ring lacks: listed, answering 503.
                                    Err(e) => locked(&e, None).ok_or_else(|| e.to_string()),
                                };
                                counts.add(state, route);
                            }
                        }
                        counts
                    })
                    // As `scope.spawn` would; the loader's caller counts and logs the panic.
                    .unwrap_or_else(|e| panic!("a thread to load routes could not start: {e}"))
            })
            .collect();
        drop(receiver);
        let mut counts = Loaded::default();
        let mut batch = Vec::with_capacity(BATCH);
        for record in store.records() {
            match record {
                Ok(record) => batch.push(record),
                Err(e) => counts.add(state, Err(e.to_string())),
            }
            if batch.len() == BATCH
                && batches.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))).is_err()
            {
                break;
            }
        }
        let _ = batches.send(batch);
        drop(batches);
        // A decoder that panicked is a bug; carry it on rather than serve with routes missing.
        decoders
            .into_iter()
            .map(|decoder| decoder.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .fold(counts, Loaded::sum)
    });
    tracing::info!(
        loaded = counts.loaded,
        broken = counts.broken,
        unreadable = counts.unreadable,
        "routes loaded"
    );
}

/// What the table holds for a record sealed by a key the ring lacks ([`LockedRoute`]), at
/// `revision` when the caller knows it (a change of the database), else at the record's own.
pub(super) fn locked(e: &StorageError, revision: Option<u64>) -> Option<Entry> {
    match e {
        StorageError::KeyMissing { uuid, created_at, updated_at, revision: sealed, .. } => {
            Some(Entry::from(LockedRoute {
                uuid: *uuid,
                created_at: *created_at,
                updated_at: *updated_at,
                revision: revision.or(*sealed).unwrap_or(0),
                why: e.to_string(),
            }))
        }
        _ => None,
    }
}

/// What loading the stored routes found.
#[derive(Default)]
struct Loaded {
    loaded: usize,
    broken: usize,
    unreadable: usize,
}

impl Loaded {
    /// Puts a loaded route in the table, or logs why it could not be loaded.
    fn add(&mut self, state: &State, entry: Result<Entry, String>) {
        match entry {
            Ok(entry) => {
                let why = state.stored_problem(&entry);
                if let Some(why) = why {
                    self.broken += 1;
                    tracing::error!(uuid = %entry.uuid(), %why, "stored route cannot serve calls; it answers 503");
                }
                self.loaded += 1;
                state.table.insert(entry);
            }
            Err(why) => {
                self.unreadable += 1;
                tracing::error!(%why, "stored route skipped");
            }
        }
    }

    fn sum(self, other: Loaded) -> Loaded {
        Loaded {
            loaded: self.loaded + other.loaded,
            broken: self.broken + other.broken,
            unreadable: self.unreadable + other.unreadable,
        }
    }
}

/// Turns the store's background compactions back on (they are held while routes load).
pub(super) fn resume_compactions(store: &Store) {
    if let Err(e) = store.resume_compactions() {
        tracing::error!(
            error = %e,
            "turning the store's background compactions back on failed; if they are still off, table files pile up until a restart"
        );
    }
}
