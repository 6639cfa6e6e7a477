//! The cache of mapped answers (`docs/caching.md`): one per process, bounded in bytes
//! (`RECAST_CACHE_BYTES`), for the routes registered with `cache`. It keeps bytes and times and
//! coalesces upstream calls; it neither calls upstreams nor maps: the server does, and hands it
//! what to keep.
//!
//! - **What is kept**: the mapped bytes and status of a 2xx answer, for the route's `ttlSeconds`,
//!   or less when the upstream's own lifetime less its `Age` is less; nothing when that leaves no
//!   freshness; never an answer the upstream marks `no-store`, `private` or `no-cache`, and never
//!   an error.
//! - **The key** ([`Key`]): the route version and the digest of the whole upstream request
//!   ([`UpstreamRequest::digest`]), so a call shares only answers to the very request it would
//!   send itself.
//! - **Coalescing**: the first call that misses a key begins the upstream call (the *flight*,
//!   in a task of its own); it and the calls for the same key meanwhile wait for its outcome,
//!   within their own deadline, and get the same answer or the same error. The caller who began
//!   it may hang up: the flight goes on while any call waits for it, and is called off when none
//!   does.
//! - **Dropping**: an update, a delete or a purge drops a route's entries and detaches its
//!   flights: a call that comes after it starts a new upstream call, and the calls under way
//!   store nothing.
//!
//! Time is tokio's clock, so the tests of lifetimes run on a paused one. Entries live in a
//! `quick_cache` cache, weighed by their bytes; its S3-FIFO-like policy keeps what is called
//! again over what was called once.

mod status;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};
use tokio::time::Instant;
use uuid::Uuid;

use crate::flight::{self, Flights};
pub use crate::flight::{TimedOut, Waiter};
use crate::metrics::CacheGauges;
use crate::route::{CacheSettings, Route};
use crate::upstream::UpstreamRequest;
use crate::upstream::{Freshness, MAX_DELTA_SECONDS};
pub use status::CacheStatus;

/// Bytes counted for each entry beyond its answer: the entry, the key and the cache's own
/// bookkeeping, rounded up.
const ENTRY_OVERHEAD: u64 = 256;
/// Each shard of the cache holds at least this many bytes (a shard's share bounds the largest
/// answer it takes); up to [`MAX_SHARDS`] of them.
const SHARD_BYTES: u64 = 16 << 20;
const MAX_SHARDS: u64 = 16;

/// Which answers a call may reuse, and with whom it shares an upstream call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    route: Uuid,
    /// The route version's serial ([`Route::serial`]).
    serial: u64,
    /// [`UpstreamRequest::digest`] of the request the call sends.
    request: [u8; 32],
}

impl Key {
    /// The key of a call of `route` that sends `request` upstream.
    pub fn new(route: &Route, request: &UpstreamRequest) -> Key {
        Key { route: route.uuid, serial: route.serial, request: request.digest() }
    }

    /// [`Key::new`] for a route whose answers depend on who calls (its rules or templates read
    /// `$caller`, SPEC §2.4): the caller's identity (its `kind`, `issuer` and `id`) is part of
    /// the key, so one caller's answer is never another's.
    pub fn for_caller(route: &Route, request: &UpstreamRequest, identity: Option<&[u8; 32]>) -> Key {
        let mut key = Key::new(route, request);
        if let Some(identity) = identity {
            let mut context = ring::digest::Context::new(&ring::digest::SHA256);
            context.update(&key.request);
            context.update(identity);
            key.request.copy_from_slice(context.finish().as_ref());
        }
        key
    }
}

/// A cached answer.
#[derive(Debug)]
pub struct Entry {
    pub status: StatusCode,
    pub body: Bytes,
    stored: Instant,
    /// The upstream's `Age` when it was stored.
    age: u64,
    /// How long it is fresh from `stored`.
    fresh: Duration,
    /// How long after that it may still be answered while one refresh runs.
    stale: Duration,
}

impl Entry {
    /// Seconds of freshness left at `now`: negative once stale (RFC 9211 `ttl`).
    pub fn ttl(&self, now: Instant) -> i64 {
        let lived = now.saturating_duration_since(self.stored);
        if lived <= self.fresh {
            (self.fresh - lived).as_secs() as i64
        } else {
            -((lived - self.fresh).as_secs_f64().ceil() as i64)
        }
    }

    /// The `Age` of the answer at `now`, in seconds: at most 2^31 (RFC 9111 §1.2.2).
    pub fn age(&self, now: Instant) -> u64 {
        age_after(self.age, now.saturating_duration_since(self.stored).as_secs())
    }
}

/// The age of an answer that came `age` seconds old and was kept `lived` seconds since: at most
/// 2^31, which any sum past it counts as (RFC 9111 §1.2.2).
pub fn age_after(age: u64, lived: u64) -> u64 {
    age.saturating_add(lived).min(MAX_DELTA_SECONDS)
}

/// How long an answer whose headers say `freshness` is kept by a route's `settings`: seconds
/// fresh (at least 1) and seconds stale after that; `None` when it is not kept at all. The
/// upstream's lifetime less the time the answer already spent in caches upstream counts when it
/// is less than the route's TTL; an answer with no freshness left is not kept, stale window or
/// not (`ttlSeconds: 0` and `max-age=0` keep nothing).
pub fn lifetime(freshness: &Freshness, settings: CacheSettings) -> Option<(u64, u64)> {
    if freshness.no_store {
        return None;
    }
    let fresh = freshness.fresh_for().map_or(settings.ttl_seconds, |left| left.min(settings.ttl_seconds));
    let stale = if freshness.may_be_stale() { settings.stale_while_revalidate_seconds } else { 0 };
    (fresh > 0).then_some((fresh, stale))
}

/// What a lookup found.
pub enum Lookup {
    Fresh(Arc<Entry>),
    /// Past its freshness, within its stale window.
    Stale(Arc<Entry>),
    Nothing,
}

/// A mapped answer, as a leader offers it for keeping.
pub struct Mapped<'a> {
    pub status: StatusCode,
    pub body: &'a Bytes,
    pub freshness: &'a Freshness,
}

/// A call's place in the flight of its key (`crate::flight`); `T` is what the flight's outcome
/// is.
pub enum Joined<T: Clone> {
    /// This call's flight makes the upstream call, and hands its outcome on with
    /// [`Leader::share`].
    Leader(Leader<T>),
    /// Another call's flight makes it; wait with [`Waiter::wait`].
    Waiter(Waiter<T>),
}

/// The leader of a flight. Dropped without sharing (its call panicked, or every call waiting
/// for it left), it takes its flight away, and its waiters get nothing.
pub struct Leader<T: Clone> {
    cache: Arc<AnswerCache<T>>,
    flight: flight::Leader<Key, T>,
}

impl<T: Clone> Leader<T> {
    /// Keeps `mapped` if `settings` and the upstream let it be and the route was not dropped
    /// since the flight began; returns the seconds it is fresh for when kept.
    pub fn store(&self, mapped: Mapped<'_>, settings: CacheSettings) -> Option<u64> {
        self.cache.store(&self.flight, mapped, settings)
    }

    /// A waiter on this very flight, for the call that leads it but lets a task of its own make
    /// the upstream call.
    pub fn waiter(&self) -> Waiter<T> {
        self.flight.waiter()
    }

    /// Resolves once no call waits for this flight's outcome, and takes it away from its key
    /// then ([`flight::Leader::unwaited`]).
    pub async fn unwaited(&self) {
        self.flight.unwaited().await;
    }

    /// Hands the outcome to every call waiting on this flight; calls that come after it look in
    /// the cache again.
    pub fn share(self, outcome: T) {
        self.flight.share(outcome);
    }
}

/// Weighs an entry by its bytes.
#[derive(Clone)]
struct EntryBytes;

impl Weighter<Key, Arc<Entry>> for EntryBytes {
    fn weight(&self, _: &Key, entry: &Arc<Entry>) -> u64 {
        entry.body.len() as u64 + ENTRY_OVERHEAD
    }
}

/// Counts evictions.
#[derive(Clone, Default)]
struct Evictions(Arc<AtomicU64>);

impl Lifecycle<Key, Arc<Entry>> for Evictions {
    type RequestState = ();

    fn on_evict(&self, _: &mut (), _: Key, _: Arc<Entry>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The cache and its flights; `T` is the outcome a flight hands its waiters.
pub struct AnswerCache<T> {
    /// `None` when `RECAST_CACHE_BYTES` is 0.
    entries: Option<Cache<Key, Arc<Entry>, EntryBytes, DefaultHashBuilder, Evictions>>,
    evictions: Evictions,
    flights: Arc<Flights<Key, T>>,
    /// The routes that have stored entries since their last drop: a change of any other route
    /// (most of them, in a catch-up) has nothing to look for.
    stored: Mutex<HashSet<Uuid>>,
}

impl<T: Clone> AnswerCache<T> {
    /// A cache of at most `bytes` bytes; 0 for none (the server then sends calls of cached
    /// routes upstream like any other's, neither kept nor coalesced).
    pub fn new(bytes: u64) -> AnswerCache<T> {
        let evictions = Evictions::default();
        let entries = (bytes > 0).then(|| {
            let shards = (bytes / SHARD_BYTES).clamp(1, MAX_SHARDS).next_power_of_two() as usize;
            let options = OptionsBuilder::new()
                .estimated_items_capacity((bytes / 4096).clamp(16, 1 << 20) as usize)
                .weight_capacity(bytes)
                .shards(shards)
                .build()
                .expect("the cache options are in range");
            Cache::with_options(options, EntryBytes, DefaultHashBuilder::default(), evictions.clone())
        });
        AnswerCache { entries, evictions, flights: Arc::default(), stored: Mutex::default() }
    }

    pub fn enabled(&self) -> bool {
        self.entries.is_some()
    }

    /// The entry for `key` now.
    pub fn find(&self, key: &Key) -> Lookup {
        let Some(entry) = self.entries.as_ref().and_then(|entries| entries.get(key)) else {
            return Lookup::Nothing;
        };
        let lived = Instant::now().saturating_duration_since(entry.stored);
        if lived < entry.fresh {
            Lookup::Fresh(entry)
        } else if lived < entry.fresh.saturating_add(entry.stale) {
            Lookup::Stale(entry)
        } else {
            Lookup::Nothing
        }
    }

    /// Joins the flight of `key`, or begins it.
    pub fn join(self: &Arc<Self>, key: &Key) -> Joined<T> {
        match self.flights.join(key) {
            flight::Joined::Leader(flight) => Joined::Leader(Leader { cache: self.clone(), flight }),
            flight::Joined::Waiter(waiter) => Joined::Waiter(waiter),
        }
    }

    /// Stores `mapped` under the key of `flight` unless it may not be reused, has no freshness,
    /// or `flight` was detached by a drop of its route; returns the seconds it is fresh for when
    /// stored.
    fn store(
        &self,
        flight: &flight::Leader<Key, T>,
        mapped: Mapped<'_>,
        settings: CacheSettings,
    ) -> Option<u64> {
        let entries = self.entries.as_ref()?;
        if !mapped.status.is_success() {
            return None;
        }
        let key = flight.key();
        let (fresh, stale) = lifetime(mapped.freshness, settings)?;
        let entry = Entry {
            status: mapped.status,
            body: mapped.body.clone(),
            stored: Instant::now(),
            age: mapped.freshness.age(),
            fresh: Duration::from_secs(fresh),
            stale: Duration::from_secs(stale),
        };
        // Known as stored before it is, under the flights' lock, which a drop holds while it
        // detaches the flights and takes the route from `stored`: either the drop comes first
        // and this flight is no longer current, or it comes after and finds the route.
        flight
            .while_current(|| self.stored.lock().unwrap_or_else(PoisonError::into_inner).insert(key.route))?;
        entries.insert(key.clone(), Arc::new(entry));
        // A drop that detached the flight between the check and the insert may have missed the
        // entry: it goes now.
        if flight.while_current(|| ()).is_none() {
            entries.remove(key);
            return None;
        }
        Some(fresh)
    }

    /// Drops every entry of route `uuid` and detaches its flights: the calls waiting on them
    /// still get their outcome, but nothing of them is stored, and a call that comes after this
    /// starts a new upstream call.
    pub fn drop_route(&self, uuid: Uuid) {
        let had = self.flights.detach(
            |key| key.route == uuid,
            || self.stored.lock().unwrap_or_else(PoisonError::into_inner).remove(&uuid),
        );
        if let (true, Some(entries)) = (had, &self.entries) {
            entries.retain(|key, _| key.route != uuid);
        }
    }

    pub fn gauges(&self) -> CacheGauges {
        CacheGauges {
            entries: self.entries.as_ref().map_or(0, Cache::len),
            bytes: self.entries.as_ref().map_or(0, Cache::weight),
            evictions: self.evictions.0.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests;
