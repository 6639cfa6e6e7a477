//! The way a call reaches its upstream that may speak HTTP/2, and new connections: one open at a
//! time per upstream, in a task of its own on the client's runtime, whose outcome (a stream, an
//! HTTP/1.1 connection, a failure) the calls that waited share.

use std::sync::atomic::Ordering;

use http::uri::Scheme;
use tracing::{Instrument as _, Level};

use super::connect::Connecting;
use super::{Connector, Key, Spawner, Target, UpstreamClient, UpstreamError, h2, tls, wire};
use crate::flight;
use crate::logging::logged;

impl UpstreamClient {
    /// How a call reaches `key`'s upstream that may speak HTTP/2: a stream on a connection to it
    /// with one free, else HTTP/1.1 when the upstream picked that (with the new connection that
    /// found it out, if this call's open made it). When every connection is full, none is open,
    /// or the upstream was not met yet, one call's open makes a connection and the others wait
    /// for it (`crate::flight`), and for its server to say how many streams it allows, then look
    /// again: a stream on it, HTTP/1.1, or the open's failure, which is theirs too (and not
    /// counted again by the breaker).
    pub(super) async fn way_to(&self, target: &Target<'_>, key: &Key) -> Result<Way, UpstreamError> {
        loop {
            match self.h2.available(key) {
                h2::Availability::Lease(lease) => return Ok(Way::Http2(lease)),
                h2::Availability::Http1 => return Ok(Way::Http1(None)),
                h2::Availability::Settling(peer) => {
                    h2::settled(&peer).await;
                    continue;
                }
                h2::Availability::Nothing => {}
            }
            match self.h2.opens.join(key) {
                flight::Joined::Waiter(waiter) => match waiter.outcome().await {
                    // Opened, or its task went without an outcome: look again.
                    Some(Ok(())) | None => continue,
                    Some(Err(failure)) => {
                        target.waited_for_failure.store(true, Ordering::Relaxed);
                        return Err(failure);
                    }
                },
                flight::Joined::Leader(open) => {
                    // Looked at again now that this call leads: an open may have ended since.
                    if !matches!(self.h2.available(key), h2::Availability::Nothing) {
                        continue;
                    }
                    return match self.open_shared(target, key, open).await? {
                        Opened::Http2(lease) => Ok(Way::Http2(lease)),
                        Opened::Http1(connection) => Ok(Way::Http1(Some(connection))),
                    };
                }
            }
        }
    }

    /// Opens a connection to `key`'s upstream that may speak HTTP/2, for the flight `open`
    /// leads, in a task of its own on the client's runtime, which shares the open's outcome with
    /// the calls that waited for it. A connection is driven by the event loop of the runtime
    /// that made it: one that every worker's calls may ride is made away from the workers, so
    /// that a worker busy with a mapping holds up none of them. And the open is the upstream's,
    /// not the call's: a call that gives up while it waits cancels nothing, and the calls waiting
    /// still get its outcome. A connection that picked HTTP/1.1 serves the call and is not
    /// pooled (its event loop is not its worker's).
    pub(super) async fn open_shared(
        &self,
        target: &Target<'_>,
        key: &Key,
        open: flight::Leader<Key, Result<(), UpstreamError>>,
    ) -> Result<Opened, UpstreamError> {
        let connector = self.connector_for(target.tls)?;
        let (client, key, uri) = (self.clone(), key.clone(), target.request.uri.clone());
        let (h2c, may_speak_h2) = (target.h2c, self.may_speak_h2(target));
        let (sent, outcome) = tokio::sync::oneshot::channel();
        // Logged lines of the open name the call that began it.
        let span = crate::logging::request_span!().unwrap_or_else(tracing::Span::none);
        self.spawner.spawn(
            async move {
                let opened = client.open_with(connector, &uri, &key, h2c, may_speak_h2, true).await;
                open.share(opened.as_ref().map(|_| ()).map_err(UpstreamError::clone));
                let _ = sent.send(opened);
            }
            .instrument(span),
        );
        let mut opened = outcome.await.unwrap_or_else(|_| {
            Err(UpstreamError::Broken("the connection's open ended without an outcome".to_owned()))
        })?;
        if let (Opened::Http1(connection), true) = (&mut opened, self.spawner.on.is_some()) {
            connection.poolable = false;
        }
        Ok(opened)
    }

    /// A new connection to `key`'s upstream: HTTP/2 when its TLS picked `h2` (kept for the calls
    /// after), else HTTP/1.1. A connection the upstream's host refuses is tried once more (nothing
    /// was sent).
    ///
    /// Made by the calling worker for HTTP/1.1: one that picks `h2` anyway serves this call alone
    /// ([`h2::Connections::add`]) when there are several workers, since its event loop is
    /// this worker's.
    pub(super) async fn open(&self, target: &Target<'_>, key: &Key) -> Result<Opened, UpstreamError> {
        let connector = self.connector_for(target.tls)?;
        let (uri, h2c, may_speak_h2) = (&target.request.uri, target.h2c, self.may_speak_h2(target));
        self.open_with(connector, uri, key, h2c, may_speak_h2, self.spawner.on.is_none()).await
    }

    /// [`UpstreamClient::open`] by `connector` to `uri`, in HTTP/2 from the start when `h2c`;
    /// `may_speak_h2`: the upstream is remembered as one that picked HTTP/1.1 when it does. An
    /// HTTP/2 connection is kept for every call when `shared`, else it serves this one alone.
    pub(super) async fn open_with(
        &self,
        connector: Connector,
        uri: &http::Uri,
        key: &Key,
        h2c: bool,
        may_speak_h2: bool,
        shared: bool,
    ) -> Result<Opened, UpstreamError> {
        let (stream, asked) = match self.connect(connector.clone(), uri).await {
            Err(Connecting::Refused(why)) => {
                logged!(Level::DEBUG, upstream = %key.1, %why, "the connection was refused; trying once more");
                self.connect(connector, uri).await.map_err(Connecting::into_error)?
            }
            connected => connected.map_err(Connecting::into_error)?,
        };
        let asked = self.certificate_asked(key, asked, &stream);
        if h2c || h2::negotiated(&stream) {
            // A connection for this call alone is driven here, where it was made.
            let here = Spawner { tasks: self.spawner.tasks.clone(), on: None };
            let spawner = if shared { &self.spawner } else { &here };
            let lease = self
                .h2
                .add(key.clone(), stream, asked, spawner, shared)
                .await
                .map_err(|failed| self.failure(failed))?;
            logged!(Level::DEBUG, upstream = %key.1, "the upstream speaks HTTP/2");
            return Ok(Opened::Http2(lease));
        }
        if may_speak_h2 {
            self.h2.picked_http1(key);
        }
        let mut connection = wire::Connection::new(stream);
        connection.certificate_asked = asked;
        Ok(Opened::Http1(connection))
    }

    /// Whether `key`'s upstream asked for a client certificate, by what the handshake of its new
    /// connection `stream` saw (`asked`). A resumed TLS session is not asked again (RFC 8446
    /// §4.3.2): it is answered by what the last full handshake saw.
    pub(super) fn certificate_asked(
        &self,
        key: &Key,
        asked: Option<tls::CertificateAsked>,
        stream: &wire::Stream,
    ) -> Option<tls::CertificateAsked> {
        let resumed = match stream.inner() {
            hyper_rustls::MaybeHttpsStream::Https(tls) => {
                tls.inner().get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
            }
            hyper_rustls::MaybeHttpsStream::Http(_) => return None,
        };
        let seen = &self.certificates_asked;
        match asked {
            Some(asked) => {
                seen.insert(key.clone(), asked);
                Some(asked)
            }
            None if resumed => seen.get(key).map(|asked| *asked),
            None => {
                seen.remove(key);
                None
            }
        }
    }

    /// Whether `target`'s upstream may be spoken to in HTTP/2: an `https` one unless
    /// `RECAST_UPSTREAM_HTTP2=off`, an `http` one when its route asked for prior knowledge.
    pub(super) fn may_speak_h2(&self, target: &Target<'_>) -> bool {
        target.h2c || (self.settings.http2 && target.request.uri.scheme() == Some(&Scheme::HTTPS))
    }
}

/// A new connection, by the protocol its upstream picked.
pub(super) enum Opened {
    Http2(h2::Lease),
    Http1(wire::Connection),
}

/// How a call reaches an upstream that may speak HTTP/2 ([`UpstreamClient::way_to`]): a stream on
/// a shared connection, or HTTP/1.1 (on the new connection that found out, when the open the
/// call waited for made one).
pub(super) enum Way {
    Http2(h2::Lease),
    Http1(Option<wire::Connection>),
}
