//! HTTP/2 to upstreams (`RECAST_UPSTREAM_HTTP2`, `docs/upstreams.md`): an `https` upstream that
//! picks `h2` by ALPN is spoken to over hyper's HTTP/2 client (the `h2` crate). One connection per
//! upstream (and route `tls`) carries many calls at once, up to [`MAX_STREAMS`] each, then another
//! is opened. The answer is read as `wire` reads an HTTP/1.1 one: the same size bound on the body
//! as it comes, the same decoding of gzip and br, the same reading of its caching headers and
//! `Retry-After`; the body of an answer that is not 2xx is never read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::coding::{Coding, Decoding, Sink};
use super::wire::{self, Failed, Stream};
use super::{Answer, Freshness, Key};
use crate::http1;
use crate::json::PADDING;
use crate::route::UpstreamRequest;

/// The most calls one connection carries at once before another is opened (RFC 9113 §6.5.2
/// asks servers to allow at least 100).
pub(super) const MAX_STREAMS: usize = 100;

/// How often an HTTP/2 connection is pinged, and how long a ping may go unanswered before the
/// connection is closed.
const KEEP_ALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Headers HTTP/2 forbids (RFC 9113 §8.2.2), or that recast sets itself.
const NOT_SENT: [HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
    header::CONTENT_LENGTH,
    header::ACCEPT_ENCODING,
];

/// One HTTP/2 connection: its sender, and the calls it carries now.
struct Shared {
    sender: SendRequest<Full<Bytes>>,
    in_flight: AtomicUsize,
}

/// The HTTP/2 connections of every upstream, shared by all workers.
#[derive(Default)]
pub(super) struct Connections {
    by_key: Mutex<std::collections::HashMap<Key, Upstream>>,
}

/// An upstream known to speak HTTP/2 (one of its connections was made).
#[derive(Default)]
struct Upstream {
    connections: Vec<Arc<Shared>>,
    /// Held by the call opening a connection to it, so that the calls that find every
    /// connection full (or none open) wait for that one instead of each opening its own.
    opener: Arc<tokio::sync::Mutex<()>>,
}

/// What a call finds for its upstream.
pub(super) enum Found {
    /// A place on an open connection with a stream free.
    Lease(Lease),
    /// The upstream speaks HTTP/2, but no connection has a stream free: its opener's lock.
    Full(Arc<tokio::sync::Mutex<()>>),
    /// The upstream is not known to speak HTTP/2.
    Unknown,
}

/// A call's place on a connection: given back when the call ends.
pub(super) struct Lease(Arc<Shared>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connections {
    /// What there is for `key`, under one lock; closed connections are forgotten on the way.
    pub(super) fn find(&self, key: &Key) -> Found {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(upstream) = all.get_mut(key) else { return Found::Unknown };
        upstream.connections.retain(|c| !c.sender.is_closed());
        match upstream.connections.iter().find(|c| c.in_flight.load(Ordering::Acquire) < MAX_STREAMS) {
            Some(free) => {
                free.in_flight.fetch_add(1, Ordering::AcqRel);
                Found::Lease(Lease(free.clone()))
            }
            None => Found::Full(upstream.opener.clone()),
        }
    }

    /// A place on an open connection to `key` with a stream free, if there is one.
    pub(super) fn lease(&self, key: &Key) -> Option<Lease> {
        match self.find(key) {
            Found::Lease(lease) => Some(lease),
            Found::Full(_) | Found::Unknown => None,
        }
    }

    /// Takes the connection of `lease` out of use (the upstream is ending it: a `GOAWAY`, a
    /// refused stream): the calls on it finish, new ones go elsewhere.
    pub(super) fn forget(&self, lease: &Lease) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        for upstream in all.values_mut() {
            upstream.connections.retain(|c| !Arc::ptr_eq(c, &lease.0));
        }
    }

    /// Makes an HTTP/2 connection of `stream` (whose TLS picked `h2`), keeps it for `key`, and
    /// answers a place on it.
    pub(super) async fn add(&self, key: Key, stream: Stream) -> Result<Lease, Failed> {
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
                let why = format!("the HTTP/2 handshake failed: {}", super::error_chain(&e));
                if super::tls::is_tls_failure(&e) { Failed::Tls(why) } else { Failed::Broken(why) }
            })?;
        // The connection's frames are read and written by a task of its own until it closes.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %super::error_chain(&e), "an upstream HTTP/2 connection ended");
            }
        });
        let shared = Arc::new(Shared { sender, in_flight: AtomicUsize::new(1) });
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        all.entry(key).or_default().connections.push(shared.clone());
        Ok(Lease(shared))
    }
}

/// Sends `request` on the leased connection and reads the whole answer, the body at most `limit`
/// bytes (decoded, when it comes in a content coding).
pub(super) async fn exchange(
    lease: &Lease,
    request: &UpstreamRequest,
    authorization: Option<&HeaderValue>,
    compression: bool,
    limit: usize,
) -> Result<Answer, Failed> {
    let mut outgoing =
        Request::builder().method(request.method.clone()).uri(request.uri.clone()).version(Version::HTTP_2);
    if let Some(headers) = outgoing.headers_mut() {
        for (name, value) in &request.headers {
            let replaced = authorization.is_some() && name == header::AUTHORIZATION;
            if !NOT_SENT.contains(name) && !replaced {
                headers.append(name, value.clone());
            }
        }
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, value.clone());
        }
        let codings = if compression { "gzip, br" } else { "identity" };
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(codings));
    }
    let outgoing = outgoing
        .body(Full::new(request.body.clone()))
        .map_err(|e| Failed::Broken(format!("the request cannot be sent over HTTP/2: {e}")))?;
    let mut sender = lease.0.sender.clone();
    let response = sender.send_request(outgoing).await.map_err(|e| sent_failure(&e))?;
    let (head, mut body) = response.into_parts();
    let mut freshness = Freshness::default();
    let mut coding = Coding::Identity;
    let mut retry_after = None;
    for (name, value) in &head.headers {
        freshness.line(name.as_str().as_bytes(), value.as_bytes());
        if name == header::CONTENT_ENCODING {
            coding = match coding {
                Coding::Identity => Coding::of(value.as_bytes()),
                earlier => Coding::Unknown(format!(
                    "{earlier}, {}",
                    String::from_utf8_lossy(value.as_bytes().trim_ascii())
                )),
            };
        } else if name == header::RETRY_AFTER {
            retry_after = wire::retry_after_of(value.as_bytes());
        }
    }
    let status = head.status;
    if !status.is_success() {
        // Never read: dropping it resets the stream.
        return Ok(Answer { status, body: Vec::new(), freshness, retry_after });
    }
    let mut plain = Vec::new();
    let mut decoding = match &coding {
        Coding::Identity => None,
        Coding::Unknown(name) => return Err(Failed::UnknownCoding(name.clone())),
        coding => Decoding::new(coding, limit),
    };
    while let Some(frame) = body.frame().await {
        // The upstream has answered: whatever breaks now, it may have acted on the request.
        let frame = frame.map_err(|e| {
            let why = super::error_chain(&e);
            if super::tls::is_tls_failure(&e) { Failed::Tls(why) } else { Failed::Broken(why) }
        })?;
        let Ok(data) = frame.into_data() else { continue };
        match &mut decoding {
            None => {
                if plain.len() + data.len() > limit {
                    return Err(Failed::TooLarge);
                }
                http1::reserve_within(&mut plain, data.len() + PADDING, limit + PADDING);
                plain.extend_from_slice(&data);
            }
            Some(decoding) => {
                if decoding.taken() + data.len() > limit {
                    return Err(Failed::TooLarge);
                }
                decoding.take_slice(&data)?;
            }
        }
    }
    let mut body = match decoding {
        None => plain,
        Some(decoding) => decoding.finish()?,
    };
    let most = body.len() + PADDING;
    http1::reserve_within(&mut body, PADDING, most);
    Ok(Answer { status, body, freshness, retry_after })
}

/// How an HTTP/2 exchange that failed before the answer's head is reported. A stream the
/// upstream refused (`REFUSED_STREAM`, RFC 9113 §8.7), or a request the connection dropped before
/// sending it, was never processed ([`Failed::Unsent`]: sent again on another connection whatever
/// its method). TLS refusing is [`Failed::Tls`]. Anything else (a `GOAWAY`, a connection error, a
/// reset) may have come after the upstream took the request: only an idempotent request is sent
/// again ([`Failed::Stale`]).
fn sent_failure(error: &hyper::Error) -> Failed {
    let why = super::error_chain(error);
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<::h2::Error>());
    let refused =
        h2.and_then(::h2::Error::reason).is_some_and(|reason| reason == ::h2::Reason::REFUSED_STREAM);
    if refused || error.is_canceled() {
        Failed::Unsent(why)
    } else if super::tls::is_tls_failure(error) {
        Failed::Tls(why)
    } else {
        Failed::Stale(why)
    }
}

/// Whether the TLS of `stream` picked `h2` by ALPN.
pub(super) fn negotiated(stream: &Stream) -> bool {
    use hyper_util::client::legacy::connect::Connection as _;
    stream.inner().connected().is_negotiated_h2()
}
