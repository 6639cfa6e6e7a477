//! The idle HTTP/1.1 connections each worker keeps, by where they go ([`Key`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use tokio::time::Instant;

use super::{RouteTls, UpstreamError, wire};

/// How long a pooled connection may stay idle before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The most idle connections kept per upstream host.
const MAX_IDLE_PER_HOST: usize = 1024;
/// Where a pooled connection goes: scheme and authority, and the route TLS it was made with (0:
/// none), so that a connection that presented one route's certificate carries no other's call.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Key(pub(super) Scheme, pub(super) Authority, pub(super) u64);

impl Key {
    pub(super) fn of(uri: &http::Uri, tls: Option<&RouteTls>) -> Result<Key, UpstreamError> {
        match (uri.scheme(), uri.authority()) {
            (Some(scheme), Some(authority)) => {
                Ok(Key(scheme.clone(), authority.clone(), tls.map_or(0, RouteTls::id)))
            }
            _ => Err(UpstreamError::Connect(format!("`{uri}` is not an absolute URL"))),
        }
    }
}

/// The idle connections of each worker (index = worker number), and of other threads (0).
pub(super) struct Pools(pub(super) Box<[Pool]>);

impl Pools {
    /// The calling thread's pool.
    pub(super) fn here(&self) -> &Pool {
        // Both counts come from the same setting; a client made for fewer workers would share.
        let worker = crate::workers::current();
        debug_assert!(worker < self.0.len(), "worker {worker} has no pool of its own");
        &self.0[worker % self.0.len()]
    }
}

/// Idle connections by upstream, newest last.
#[derive(Default)]
pub(super) struct Pool {
    idle: Mutex<HashMap<Key, Vec<wire::Connection>, BuildHasherDefault<Fnv>>>,
}

impl Pool {
    /// The most recently used idle connection to `key` that is still open at `now`.
    pub(super) fn take(&self, key: &Key, now: Instant) -> Option<wire::Connection> {
        loop {
            let connection = self.idle.lock().unwrap_or_else(PoisonError::into_inner).get_mut(key)?.pop();
            let mut connection = connection?;
            if now.saturating_duration_since(connection.idle_since) < IDLE_TIMEOUT && connection.is_open() {
                return Some(connection);
            }
        }
    }

    /// Closes the connections idle since before `now - IDLE_TIMEOUT`, and forgets upstreams with
    /// none left.
    pub(super) fn sweep(&self, now: Instant) {
        let mut closed = Vec::new();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|_, connections| {
            closed.extend(connections.drain(..expired(connections, now)));
            !connections.is_empty()
        });
        drop(idle);
        drop(closed);
    }

    /// Keeps a connection for the next request to `key`, idle from `now` (the start of the
    /// exchange it served, a little early, so it expires no later than it should); closes those
    /// idle too long.
    pub(super) fn put(&self, key: Key, mut connection: wire::Connection, now: Instant) {
        connection.idle_since = now;
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let connections = idle.entry(key).or_default();
        let over = (connections.len() + 1).saturating_sub(MAX_IDLE_PER_HOST);
        let closed: Vec<_> = connections.drain(..expired(connections, now).max(over)).collect();
        connections.push(connection);
        drop(idle);
        drop(closed);
    }
}

/// How many of an upstream's idle connections (oldest first) have been idle too long at `now`.
fn expired(connections: &[wire::Connection], now: Instant) -> usize {
    connections.iter().take_while(|c| now.saturating_duration_since(c.idle_since) >= IDLE_TIMEOUT).count()
}

/// FNV-1a for the pool's keys: a handful of upstream authorities named by registered routes, so a
/// keyed hash buys nothing, and an `Authority` is hashed a byte at a time.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
