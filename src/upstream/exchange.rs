//! One exchange, on the connection the opener found or made: HTTP/1.1 on a pooled connection or
//! a new one, HTTP/2 on a shared one, and when each sends a request again (a stale pooled
//! connection, a stream the upstream never processed).

use http::Method;
use tokio::time::Instant;
use tracing::Level;

use super::open::{Opened, Way};
use super::{Answer, Extra, Key, Target, UpstreamClient, UpstreamError, h2, wire};
use crate::logging::logged;

impl UpstreamClient {
    /// One exchange on a pooled connection, or a new one. When a pooled connection fails before
    /// any byte of the answer (the upstream closed it while idle), the request is sent once more
    /// on a new connection: any request when not one byte of it was written, an idempotent one
    /// otherwise. A new connection the upstream's host refuses is tried once more for any
    /// request.
    pub(super) async fn exchange_pooled(
        &self,
        target: &Target<'_>,
        extra: Extra<'_>,
        started: Instant,
    ) -> Result<Answer, UpstreamError> {
        let request = target.request;
        let key = Key::of(&request.uri, target.tls)?;
        // An upstream that may speak HTTP/2 (an `http` upstream's only for a route that asked
        // for it): a connection to it with a stream free carries the call.
        if !self.may_speak_h2(target) {
            return self.exchange_h1(target, &key, extra, started, None).await;
        }
        match self.way_to(target, &key).await? {
            Way::Http2(lease) => self.exchange_h2(lease, target, &key, extra).await,
            Way::Http1(connection) => self.exchange_h1(target, &key, extra, started, connection).await,
        }
    }

    /// An HTTP/1.1 exchange: on `connection` when given, else on a pooled connection or a new one
    /// (which may turn out to be HTTP/2).
    pub(super) async fn exchange_h1(
        &self,
        target: &Target<'_>,
        key: &Key,
        extra: Extra<'_>,
        started: Instant,
        connection: Option<wire::Connection>,
    ) -> Result<Answer, UpstreamError> {
        let request = target.request;
        let key = key.clone();
        let bytes = wire::encode(request, extra, self.settings.compression);
        let head_only = request.method == Method::HEAD;
        let limit = self.settings.max_body;
        let pool = self.pools.here();
        // A route that asked for HTTP/2 from the start never takes an HTTP/1.1 connection.
        // A new connection given (the one that found out the upstream speaks HTTP/1.1) goes
        // first: a pooled one stays in the pool.
        let mut pooled = if target.h2c || connection.is_some() { None } else { pool.take(&key, started) };
        let mut given = connection;
        loop {
            let reused = pooled.is_some();
            let mut connection = match pooled.take().or_else(|| given.take()) {
                Some(connection) => connection,
                // Boxed: opening a connection (resolving, connecting, a TLS handshake) holds
                // ten times the state of an exchange, and most calls take a pooled connection;
                // inline, every call's future would carry that room and be copied with it.
                None => match crate::tasks::boxed(|| self.open(target, &key)).await? {
                    Opened::Http2(lease) => {
                        return self.exchange_h2(lease, target, &key, extra).await;
                    }
                    Opened::Http1(connection) => connection,
                },
            };
            match connection.exchange(&bytes, head_only, limit, extra.keep_headers).await {
                Ok((answer, reuse)) => {
                    logged!(
                        Level::TRACE,
                        upstream = %key.1,
                        status = answer.status.as_u16(),
                        bytes = answer.body.len(),
                        reused,
                        kept = (reuse == wire::Reuse::Keep),
                        "upstream answered"
                    );
                    if reuse == wire::Reuse::Keep && connection.poolable {
                        pool.put(key, connection, started);
                    }
                    return Ok(answer);
                }
                Err(wire::Failed::Unsent(why)) if reused => {
                    logged!(Level::DEBUG, upstream = %key.1, %why, "a pooled connection was closed before the request went out; sending on a new one");
                    continue;
                }
                Err(wire::Failed::Stale(why)) if reused && request.method.is_idempotent() => {
                    logged!(Level::DEBUG, upstream = %key.1, %why, "a pooled connection was closed; sending on a new one");
                    continue;
                }
                Err(failed) => return Err(self.failure(failed)),
            }
        }
    }

    /// A call over HTTP/2 on `lease`. A stream the upstream never processed (refused, or dropped
    /// before it went out) is sent again, whatever its method, up to [`H2_SENDS`] times in all;
    /// one a `GOAWAY` ended is sent again if its method is idempotent. Each time the connection
    /// that failed is taken out of use, and the call goes to another with a stream free, or a new
    /// one.
    pub(super) async fn exchange_h2(
        &self,
        mut lease: h2::Lease,
        target: &Target<'_>,
        key: &Key,
        extra: Extra<'_>,
    ) -> Result<Answer, UpstreamError> {
        let (compression, limit) = (self.settings.compression, self.settings.max_body);
        let request = target.request;
        let mut sends = 1;
        loop {
            let outcome = h2::exchange(&lease, request, extra, compression, limit).await;
            // A connection that failed is taken out of use, whether or not the call goes on.
            if matches!(
                &outcome,
                Err(wire::Failed::Unsent(_)
                    | wire::Failed::Stale(_)
                    | wire::Failed::Broken(_)
                    | wire::Failed::Tls(_))
            ) {
                self.h2.forget(key, &lease);
            }
            let why = match outcome {
                Err(wire::Failed::Unsent(why)) if sends < H2_SENDS => why,
                Err(wire::Failed::Stale(why)) if sends < H2_SENDS && request.method.is_idempotent() => why,
                outcome => return outcome.map_err(|failed| self.failure(failed)),
            };
            drop(lease);
            sends += 1;
            logged!(Level::DEBUG, upstream = %key.1, %why, "the upstream did not process the HTTP/2 stream; sending again");
            lease = match self.way_to(target, key).await? {
                Way::Http2(lease) => lease,
                Way::Http1(connection) => {
                    let started = Instant::now();
                    return crate::tasks::boxed(|| self.exchange_h1(target, key, extra, started, connection))
                        .await;
                }
            };
        }
    }

    /// What a failed exchange is to the call.
    pub(super) fn failure(&self, failed: wire::Failed) -> UpstreamError {
        match failed {
            wire::Failed::Unsent(why) | wire::Failed::Stale(why) | wire::Failed::Broken(why) => {
                UpstreamError::Broken(why)
            }
            wire::Failed::Tls(why) => UpstreamError::Tls(why),
            wire::Failed::TooLarge => UpstreamError::TooLarge { limit: self.settings.max_body },
            wire::Failed::UnknownCoding(name) => UpstreamError::Coding(format!(
                "the upstream answered in the content coding `{name}`, which recast does not decode (it decodes gzip and br)"
            )),
            wire::Failed::Undecodable(why) => UpstreamError::Coding(why),
        }
    }
}

/// How many times an HTTP/2 call is sent at most when the upstream did not process it.
const H2_SENDS: usize = 3;
