//! The cache of mapped answers (`docs/caching.md`): one per process, bounded in bytes
//! (`RECAST_CACHE_BYTES`), for the routes registered with `cache`.
//!
//! - **What is kept**: the mapped bytes and status of a 2xx answer, for as long as the route's
//!   `ttlSeconds`, or less when the upstream's own `max-age`/`s-maxage` less its `Age` is less;
//!   never an answer the upstream marks `no-store`, `private` or `no-cache`, and never an error.
//! - **The key**: the route version (each compiled [`Route`] has its own serial, so an update
//!   never reads its predecessor's answers), the upstream request's path and query (the
//!   client's query pairs, normalised, with the route's own applied), the `Accept` and
//!   `Accept-Language` sent upstream, and a SHA-256 of the caller's `X-Mapped-Auth` whenever it
//!   is passed upstream: two callers with different tokens never share an entry.
//! - **Coalescing**: the first call that misses a key makes the upstream call (the *leader*);
//!   calls for the same key meanwhile wait for its outcome, within their own deadline, and get the
//!   same answer or the same error. A leader that goes away (its client hung up) hands nothing
//!   on: its waiters start over, and one of them leads.
//! - **Dropping**: an update, a delete or a purge drops a route's entries, and an upstream call
//!   that began before the drop does not store what it brings.
//!
//! Entries live in a `quick_cache` cache, weighed by their bytes; its S3-FIFO-like policy keeps
//! what is called again over what was called once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};
use tokio::sync::watch;
use uuid::Uuid;

use super::problem::UpstreamFailure;
use crate::metrics::CacheGauges;
use crate::route::{Auth, CacheSettings, MAPPED_AUTH, Route, UpstreamRequest};
use crate::upstream::Freshness;

/// Bytes counted for each entry beyond its answer and key: the entry, the key and the cache's
/// own bookkeeping, rounded up.
const ENTRY_OVERHEAD: u64 = 256;
/// Each shard of the cache holds at least this many bytes (a shard's share bounds the largest
/// answer it takes); up to [`MAX_SHARDS`] of them.
const SHARD_BYTES: u64 = 16 << 20;
const MAX_SHARDS: u64 = 16;

/// Which answers a call may reuse, and with whom it shares an upstream call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    route: Uuid,
    /// The route version's serial ([`Route::serial`]).
    serial: u64,
    /// The upstream request's path and query.
    target: Box<str>,
    accept: Option<HeaderValue>,
    language: Option<HeaderValue>,
    /// SHA-256 of the caller's `X-Mapped-Auth`, when it goes upstream.
    auth: Option<[u8; 32]>,
}

impl Key {
    /// The key of a call of `route` that sends `request` upstream, from a client that sent
    /// `headers`.
    pub(super) fn of(route: &Route, request: &UpstreamRequest, headers: Option<&HeaderMap>) -> Key {
        // A stored token is the same for every caller; otherwise the caller's own goes upstream.
        let auth = match route.config.auth {
            Auth::Stored { .. } => None,
            Auth::Runtime | Auth::None => headers.and_then(|h| h.get(&MAPPED_AUTH)).map(|value| {
                let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
                let mut hash = [0u8; 32];
                hash.copy_from_slice(digest.as_ref());
                hash
            }),
        };
        Key {
            route: route.uuid,
            serial: route.serial,
            target: request.uri.path_and_query().map_or("/", |p| p.as_str()).into(),
            accept: request.headers.get(header::ACCEPT).cloned(),
            language: request.headers.get(header::ACCEPT_LANGUAGE).cloned(),
            auth,
        }
    }

    fn bytes(&self) -> u64 {
        let header = |value: &Option<HeaderValue>| value.as_ref().map_or(0, |v| v.len());
        (self.target.len() + header(&self.accept) + header(&self.language)) as u64
    }
}

/// A cached answer.
#[derive(Debug)]
pub(super) struct Entry {
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

    /// The `Age` of the answer at `now`, in seconds.
    pub fn age(&self, now: Instant) -> u64 {
        self.age + now.saturating_duration_since(self.stored).as_secs()
    }
}

/// What a lookup found.
pub(super) enum Found {
    Fresh(Arc<Entry>),
    /// Past its freshness, within its stale window.
    Stale(Arc<Entry>),
    Nothing,
}

/// The outcome of one upstream call, as its leader and every waiter answer it.
#[derive(Debug, Clone)]
pub(super) struct Outcome {
    pub mapped: Result<Mapped, UpstreamFailure>,
    pub upstream: Duration,
    pub map: Duration,
}

/// A mapped 2xx answer.
#[derive(Debug, Clone)]
pub(super) struct Mapped {
    pub status: StatusCode,
    pub body: Bytes,
    pub freshness: Freshness,
    /// The seconds it was stored fresh for, when it was.
    pub stored: Option<u64>,
}

impl Mapped {
    /// Whether a caller other than the one it was fetched for may be given it.
    pub fn shareable(&self) -> bool {
        !self.freshness.no_store
    }
}

/// A call's place in the flight of its key.
pub(super) enum Joined {
    /// This call makes the upstream call, and hands its outcome on with [`Leader::land`].
    Leader(Leader),
    /// Another call makes it; wait with [`wait`].
    Waiter(watch::Receiver<Option<Outcome>>),
}

type Flights = Mutex<HashMap<Key, Arc<watch::Sender<Option<Outcome>>>>>;

/// The leader of a flight. Dropped without landing (its call was cancelled), it takes its
/// flight away, and its waiters start over.
pub(super) struct Leader {
    cache: Arc<AnswerCache>,
    key: Key,
    sender: Arc<watch::Sender<Option<Outcome>>>,
    /// The cache's epoch when the flight began.
    epoch: u64,
}

impl Leader {
    /// Stores the outcome if `settings` and the upstream let it be, then hands it to the
    /// waiters. Returns it with `stored` filled in.
    pub fn land(self, mut outcome: Outcome, settings: CacheSettings) -> Outcome {
        if let Ok(mapped) = &mut outcome.mapped {
            mapped.stored = self.cache.store(&self.key, mapped, settings, self.epoch);
        }
        self.leave();
        self.sender.send_replace(Some(outcome.clone()));
        outcome
    }

    fn leave(&self) {
        let mut flights = self.cache.flights.lock().unwrap_or_else(PoisonError::into_inner);
        if flights.get(&self.key).is_some_and(|current| Arc::ptr_eq(current, &self.sender)) {
            flights.remove(&self.key);
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Waits for the leader's outcome until `deadline`; `Ok(None)` when the leader went away
/// without one, `Err(())` when the deadline passed.
pub(super) async fn wait(
    mut receiver: watch::Receiver<Option<Outcome>>,
    deadline: tokio::time::Instant,
) -> Result<Option<Outcome>, ()> {
    match tokio::time::timeout_at(deadline, receiver.wait_for(Option::is_some)).await {
        Ok(Ok(outcome)) => Ok(outcome.clone()),
        Ok(Err(_)) => Ok(None),
        Err(_) => Err(()),
    }
}

/// Weighs an entry by its bytes.
#[derive(Clone)]
struct Weigh;

impl Weighter<Key, Arc<Entry>> for Weigh {
    fn weight(&self, key: &Key, entry: &Arc<Entry>) -> u64 {
        key.bytes() + entry.body.len() as u64 + ENTRY_OVERHEAD
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

/// The cache and its flights.
pub struct AnswerCache {
    /// `None` when `RECAST_CACHE_BYTES` is 0.
    entries: Option<Cache<Key, Arc<Entry>, Weigh, DefaultHashBuilder, Evictions>>,
    evictions: Evictions,
    flights: Flights,
    /// Moves on at every drop of entries: a flight that began before does not store.
    epoch: AtomicU64,
    /// The routes that have stored entries since their last drop: a change of any other route
    /// (most of them, in a catch-up) has nothing to look for.
    stored: Mutex<HashSet<Uuid>>,
}

impl AnswerCache {
    /// A cache of at most `bytes` bytes; 0 for none (`call` then sends calls of cached routes
    /// upstream like any other's, neither kept nor coalesced).
    pub fn new(bytes: u64) -> AnswerCache {
        let evictions = Evictions::default();
        let entries = (bytes > 0).then(|| {
            let shards = (bytes / SHARD_BYTES).clamp(1, MAX_SHARDS).next_power_of_two() as usize;
            let options = OptionsBuilder::new()
                .estimated_items_capacity((bytes / 4096).clamp(16, 1 << 20) as usize)
                .weight_capacity(bytes)
                .shards(shards)
                .build()
                .expect("the cache options are in range");
            Cache::with_options(options, Weigh, DefaultHashBuilder::default(), evictions.clone())
        });
        AnswerCache {
            entries,
            evictions,
            flights: Mutex::default(),
            epoch: AtomicU64::new(0),
            stored: Mutex::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.entries.is_some()
    }

    /// The entry for `key` as of `now`.
    pub(super) fn find(&self, key: &Key, now: Instant) -> Found {
        let Some(entry) = self.entries.as_ref().and_then(|entries| entries.get(key)) else {
            return Found::Nothing;
        };
        let lived = now.saturating_duration_since(entry.stored);
        if lived < entry.fresh {
            Found::Fresh(entry)
        } else if lived < entry.fresh + entry.stale {
            Found::Stale(entry)
        } else {
            Found::Nothing
        }
    }

    /// Joins the flight of `key`, or begins it.
    pub(super) fn join(self: &Arc<Self>, key: &Key) -> Joined {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = flights.get(key) {
            return Joined::Waiter(sender.subscribe());
        }
        let sender = Arc::new(watch::Sender::new(None));
        flights.insert(key.clone(), sender.clone());
        // Read under the lock: a drop that moves the epoch on after this is seen by `store`.
        let epoch = self.epoch.load(Ordering::Acquire);
        Joined::Leader(Leader { cache: self.clone(), key: key.clone(), sender, epoch })
    }

    /// Stores `mapped` under `key` unless it may not be reused, has no lifetime, or entries were
    /// dropped since its flight began; returns the seconds it is fresh for when stored.
    fn store(&self, key: &Key, mapped: &Mapped, settings: CacheSettings, epoch: u64) -> Option<u64> {
        let entries = self.entries.as_ref()?;
        let freshness = &mapped.freshness;
        if !mapped.status.is_success() || freshness.no_store {
            return None;
        }
        // The upstream's lifetime less the time the answer already spent in caches upstream,
        // and never longer than the route's own.
        let upstream = freshness.max_age.map(|max_age| max_age.saturating_sub(freshness.age));
        let fresh = upstream.map_or(settings.ttl_seconds, |left| left.min(settings.ttl_seconds));
        let stale = if freshness.must_revalidate { 0 } else { settings.stale_while_revalidate_seconds };
        if fresh == 0 && stale == 0 {
            return None;
        }
        let entry = Entry {
            status: mapped.status,
            body: mapped.body.clone(),
            stored: Instant::now(),
            age: freshness.age,
            fresh: Duration::from_secs(fresh),
            stale: Duration::from_secs(stale),
        };
        // Known as stored before it is: a drop from here on finds it.
        self.stored.lock().unwrap_or_else(PoisonError::into_inner).insert(key.route);
        if self.epoch.load(Ordering::Acquire) != epoch {
            return None;
        }
        entries.insert(key.clone(), Arc::new(entry));
        // A drop that ran between the check and the insert may have missed this entry.
        if self.epoch.load(Ordering::Acquire) != epoch {
            entries.remove(key);
            return None;
        }
        Some(fresh)
    }

    /// Drops every entry of route `uuid`, and keeps flights under way from storing theirs.
    pub fn drop_route(&self, uuid: Uuid) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let had = self.stored.lock().unwrap_or_else(PoisonError::into_inner).remove(&uuid);
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
