//! HTTP/2 to upstreams (`RECAST_UPSTREAM_HTTP2`, `docs/upstreams.md`): an `https` upstream that
//! picks `h2` by ALPN (or an `http` one a route speaks to with prior knowledge) is spoken to over
//! hyper's HTTP/2 client (the `h2` crate). The connections to each upstream (and route `tls`) are
//! shared by every worker ([`Connections`]); each carries as many calls at once as its server
//! allows (its `SETTINGS_MAX_CONCURRENT_STREAMS`, read off its frames by [`frames`] since hyper
//! does not tell it; at most [`MOST_STREAMS`]). When none has a stream free, one call opens
//! another while the others wait for it (`crate::flight`, in `UpstreamClient::way_to`). One
//! call's exchange is [`exchange`].

mod exchange;
mod frames;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub(super) use self::frames::Peer;
use self::frames::{Frames, TappedStream};
use super::tls::CertificateAsked;
use super::wire::{Failed, Stream};
use super::{Key, Spawner, UpstreamError, error_chain, tls};
use crate::flight::Flights;
pub(super) use exchange::exchange;

/// How many sweeps (of 30 s) an upstream that picked HTTP/1.1 is remembered with no call looking
/// for it: longer than its idle pooled connections are kept (90 s).
const HTTP1_SWEEPS: u8 = 4;

/// How many sweeps (of 30 s) an upstream's HTTP/2 connections are kept with no call looking for
/// it: as long as idle pooled HTTP/1.1 connections (90 s).
const IDLE_SWEEPS: u8 = 3;

/// How long a call waits for a new connection's first SETTINGS frame (about one round trip)
/// before it takes a stream on it by [`STREAMS_BEFORE_SETTINGS`].
const SETTINGS_WAIT: Duration = Duration::from_secs(1);

/// How often an HTTP/2 connection is pinged, and how long a ping may go unanswered before the
/// connection is closed.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP/2 connection: its sender, the calls it carries now, what its server said, and
/// whether its server asked for a client certificate (told with each answer).
struct Shared {
    sender: SendRequest<Full<Bytes>>,
    in_flight: AtomicUsize,
    peer: Arc<Peer>,
    certificate_asked: Option<CertificateAsked>,
}

impl Shared {
    /// Whether it may carry new calls: open, and its server has not begun to end it (a
    /// `GOAWAY`, RFC 9113 §6.8: the calls on it finish, new ones go elsewhere).
    fn open(&self) -> bool {
        !self.sender.is_closed() && !self.peer.going_away.load(Ordering::Acquire)
    }

    /// Whether a call may take a stream on it now: open, its server's limit known, and fewer
    /// calls on it than the server allows (a server that allows none for now gets one call on
    /// each connection, which waits in h2 until the server allows it).
    fn free(&self) -> bool {
        self.open()
            && self.peer.is_settled()
            && self.in_flight.load(Ordering::Acquire) < self.peer.streams.load(Ordering::Acquire).max(1)
    }
}

/// The HTTP/2 connections of every upstream, shared by all workers, and the opens under way.
#[derive(Default)]
pub(super) struct Connections {
    by_key: Mutex<std::collections::HashMap<Key, Upstream>>,
    /// The open of a connection to each upstream, one at a time: the calls that find no stream
    /// free wait for it, and take its failure as theirs.
    pub(super) opens: Arc<Flights<Key, Result<(), UpstreamError>>>,
}

/// An upstream that may speak HTTP/2: its connections, and what it picked last.
#[derive(Default)]
struct Upstream {
    connections: Vec<Arc<Shared>>,
    /// The last connection made to it picked HTTP/1.1: its calls go to the HTTP/1.1 pool.
    http1: bool,
    /// Sweeps since a call last looked for it.
    untouched: u8,
}

/// What a call finds for its upstream now.
pub(super) enum Availability {
    /// A place on an open connection with a stream free.
    Lease(Lease),
    /// The upstream picked HTTP/1.1.
    Http1,
    /// A new connection whose server has not said yet how many streams it allows: wait for it
    /// ([`settled`]), then look again.
    Settling(Arc<Peer>),
    /// No connection has a stream free, or none was made yet: a connection is to be opened.
    Nothing,
}

/// A call's place on a connection: given back when the call ends.
pub(super) struct Lease(Arc<Shared>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits for the server of a new connection to say how many streams it allows, up to
/// [`SETTINGS_WAIT`] (about a round trip); one that has not said it by then is taken at the
/// default.
pub(super) async fn settled(peer: &Peer) {
    let mut settled = peer.settled.subscribe();
    let _ = tokio::time::timeout(SETTINGS_WAIT, settled.wait_for(|settled| *settled)).await;
    peer.settle();
}

impl Connections {
    /// What there is for `key` now, under one lock; closed connections are forgotten on the way.
    pub(super) fn available(&self, key: &Key) -> Availability {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(upstream) = all.get_mut(key) else { return Availability::Nothing };
        upstream.untouched = 0;
        if upstream.http1 {
            return Availability::Http1;
        }
        upstream.connections.retain(|c| c.open());
        if let Some(free) = upstream.connections.iter().find(|c| c.free()) {
            free.in_flight.fetch_add(1, Ordering::AcqRel);
            return Availability::Lease(Lease(free.clone()));
        }
        match upstream.connections.iter().find(|c| !c.peer.is_settled()) {
            Some(settling) => Availability::Settling(settling.peer.clone()),
            None => Availability::Nothing,
        }
    }

    /// Notes that a new connection to `key` picked HTTP/1.1: its calls go to the HTTP/1.1 pool
    /// without waiting for an open, until a connection picks `h2` again. Its HTTP/2 connections
    /// are let go (each closes once its calls end).
    pub(super) fn picked_http1(&self, key: &Key) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let upstream = all.entry(key.clone()).or_default();
        upstream.http1 = true;
        upstream.connections.clear();
    }

    /// Takes the connection of `lease` out of use (the upstream is ending it: a `GOAWAY`, a
    /// refused stream): the calls on it finish, new ones go elsewhere.
    pub(super) fn forget(&self, key: &Key, lease: &Lease) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(upstream) = all.get_mut(key) {
            upstream.connections.retain(|c| !Arc::ptr_eq(c, &lease.0));
        }
    }

    /// How many upstreams are known.
    pub(super) fn len(&self) -> usize {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Forgets the upstreams that no call looked for since the sweep before (an upstream that
    /// picked HTTP/1.1: in the last [`HTTP1_SWEEPS`] sweeps, as long as its idle pooled
    /// connections may last), that have no open connection and no open under way.
    pub(super) fn sweep(&self) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|key, upstream| {
            upstream.connections.retain(|c| c.open());
            upstream.untouched = upstream.untouched.saturating_add(1);
            // No call looked for it in IDLE_SWEEPS sweeps: its connections that carry no call
            // are let go, and each closes (an upstream's server may keep them open forever).
            if upstream.untouched > IDLE_SWEEPS {
                upstream.connections.retain(|c| c.in_flight.load(Ordering::Acquire) > 0);
            }
            let kept_for = if upstream.http1 { HTTP1_SWEEPS } else { 1 };
            upstream.untouched <= kept_for || !upstream.connections.is_empty() || self.opens.flying(key)
        });
    }

    /// Makes an HTTP/2 connection of `stream` (whose TLS picked `h2`) and answers a place on it
    /// (taken at once). Its frames are read and written by a task of its own on `spawner`'s
    /// runtime, whose event loop drives `stream` (it was made there). When `shared`, it is kept
    /// for `key`'s other calls: until its server's first SETTINGS come they take it at the limit
    /// its other connections' server set, or wait for them when there are none. Otherwise it
    /// serves this call alone and closes once the call ends: a connection a worker made for
    /// HTTP/1.1 that picked `h2` anyway, driven by that worker's event loop, which no other
    /// worker's calls may depend on. Either way `key` is no longer taken for an upstream that
    /// picked HTTP/1.1, so the calls after it look for (or open) a shared connection.
    pub(super) async fn add(
        &self,
        key: Key,
        stream: Stream,
        certificate_asked: Option<CertificateAsked>,
        spawner: &Spawner,
        shared: bool,
    ) -> Result<Lease, Failed> {
        let connection = self.handshake(&key, stream, certificate_asked, spawner).await?;
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let upstream = all.entry(key).or_default();
        upstream.http1 = false;
        if shared {
            upstream.connections.push(connection.clone());
        }
        Ok(Lease(connection))
    }

    /// The HTTP/2 handshake on `stream`, whose frames a task of its own on `spawner`'s runtime
    /// then reads and writes; the connection holds one call's place.
    async fn handshake(
        &self,
        key: &Key,
        stream: Stream,
        certificate_asked: Option<CertificateAsked>,
        spawner: &Spawner,
    ) -> Result<Arc<Shared>, Failed> {
        let known = {
            let all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
            let said = all.get(key).and_then(|upstream| {
                let said = |c: &&Arc<Shared>| c.open() && c.peer.said.load(Ordering::Acquire);
                upstream.connections.iter().find(said).cloned()
            });
            said.map(|c| c.peer.streams.load(Ordering::Acquire))
        };
        let peer = Arc::new(Peer::new(known));
        let stream = TappedStream { stream, frames: Frames::default(), peer: peer.clone() };
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            // A connection that went dead without a word (a NAT or firewall dropped it) is found
            // by its unanswered pings, and closed.
            .keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| {
                let why = format!("the HTTP/2 handshake failed: {}", error_chain(&e));
                if tls::is_tls_failure(&e) { Failed::Tls(why) } else { Failed::Broken(why) }
            })?;
        spawner.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %error_chain(&e), "an upstream HTTP/2 connection ended");
            }
        });
        Ok(Arc::new(Shared { sender, in_flight: AtomicUsize::new(1), peer, certificate_asked }))
    }
}

impl Lease {
    /// Whether the upstream asked for a client certificate when the connection was made.
    fn certificate_asked(&self) -> Option<CertificateAsked> {
        self.0.certificate_asked
    }

    /// The connection's sender, for a stream of its own.
    fn sender(&self) -> SendRequest<Full<Bytes>> {
        self.0.sender.clone()
    }
}

/// Whether the TLS of `stream` picked `h2` by ALPN.
pub(super) fn negotiated(stream: &Stream) -> bool {
    use hyper_util::client::legacy::connect::Connection as _;
    stream.inner().connected().is_negotiated_h2()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight::Joined;

    fn key() -> Key {
        Key::of(&"https://127.0.0.1:9/".parse().unwrap(), None).unwrap()
    }

    #[tokio::test]
    async fn calls_that_waited_for_an_open_that_failed_take_its_failure_and_later_calls_open_again() {
        let (connections, key) = (Connections::default(), key());
        assert!(matches!(connections.available(&key), Availability::Nothing));
        let Joined::Leader(open) = connections.opens.join(&key) else { panic!("the first call opens") };
        let Joined::Waiter(waiting) = connections.opens.join(&key) else { panic!("the next waits") };
        let failure = UpstreamError::Connect("refused".to_owned());
        open.share(Err(failure.clone()));
        let far = tokio::time::Instant::now() + Duration::from_secs(5);
        assert_eq!(waiting.wait(far).await, Ok(Some(Err(failure))));
        assert!(matches!(connections.opens.join(&key), Joined::Leader(_)), "a later call opens");
    }

    #[test]
    fn upstreams_no_call_looked_for_since_the_last_sweep_are_forgotten() {
        let (connections, key) = (Connections::default(), key());
        // An upstream that picked HTTP/1.1 is remembered while calls look for it, and for as
        // long as its idle HTTP/1.1 connections may be pooled after.
        connections.picked_http1(&key);
        assert!(matches!(connections.available(&key), Availability::Http1));
        connections.sweep();
        assert!(matches!(connections.available(&key), Availability::Http1));
        for _ in 0..HTTP1_SWEEPS {
            connections.sweep();
        }
        assert_eq!(connections.len(), 1);
        // Not while an open to it is under way.
        let Joined::Leader(open) = connections.opens.join(&key) else { panic!("opens") };
        connections.sweep();
        assert_eq!(connections.len(), 1);
        drop(open);
        connections.sweep();
        assert_eq!(connections.len(), 0);
        // Looking for an upstream not met remembers nothing.
        assert!(matches!(connections.available(&key), Availability::Nothing));
        assert_eq!(connections.len(), 0);
    }
}
