//! Connecting: the connector of a route's `tls` (or the default one), behind the outbound policy,
//! with the connect timeout over the TLS handshake too, and what a connector's error means.

use http::uri::Authority;
use hyper_util::rt::TokioIo;
use tower_service::Service as _;
use tracing::{Instrument as _, Level};

use super::connector::{Connector, with_config};
use super::stream::Stream;
use super::{RouteTls, UpstreamClient, UpstreamError, error_chain, tls};
use crate::logging::logged;
use crate::policy::refusal_in;

impl UpstreamClient {
    /// The connector of a route's `tls`, or the default one.
    pub(super) fn connector_for(&self, tls: Option<&RouteTls>) -> Result<Connector, UpstreamError> {
        match tls {
            None => Ok(self.connector.clone()),
            Some(tls) => {
                let made = self.route_connectors.get_or(&format!("{:016x}", tls.id()), || {
                    tls.client_config(&self.roots)
                        .map(|config| with_config(self.plain.clone(), config, self.settings.http2))
                });
                (*made).clone().map_err(UpstreamError::Tls)
            }
        }
    }

    /// A new connection to `uri`'s upstream by `connector`, and whether its TLS handshake asked
    /// for a client certificate.
    pub(super) async fn connect(
        &self,
        mut connector: Connector,
        uri: &http::Uri,
    ) -> Result<(Stream, Option<tls::CertificateAsked>), Connecting> {
        let connecting = connector.call(uri.clone());
        // The connector logs too (at debug); its lines name the request like ours.
        let logs = tracing::enabled!(target: "hyper_util::client::legacy::connect::http", Level::DEBUG);
        let span = logs.then(|| crate::logging::request_span!()).flatten();
        let connecting = async move {
            match span {
                Some(span) => connecting.instrument(span).await,
                None => connecting.await,
            }
        };
        // The TLS handshake too is part of connecting, and has its time limit.
        let limit = self.settings.connect_timeout;
        let Ok((connected, asked)) = tokio::time::timeout(limit, tls::noting_asked(connecting)).await else {
            return Err(Connecting::Failed(UpstreamError::Connect(format!(
                "no connection within RECAST_UPSTREAM_CONNECT_TIMEOUT_MS ({} ms)",
                limit.as_millis()
            ))));
        };
        let stream = connected.map_err(|e| {
            if let Some(refusal) = refusal_in(&*e) {
                return Connecting::Failed(UpstreamError::NotAllowed(refusal.clone()));
            }
            let why = error_chain(&*e);
            if connection_refused(&*e) {
                Connecting::Refused(why)
            } else if tls::is_tls_failure(&*e) {
                Connecting::Failed(UpstreamError::Tls(why))
            } else {
                Connecting::Failed(UpstreamError::Connect(why))
            }
        })?;
        logged!(Level::DEBUG, upstream = ?uri.authority().map(Authority::as_str), "connected to the upstream");
        Ok((TokioIo::new(stream), asked))
    }
}

/// Why no connection was made: refused by the upstream's host (nothing was sent, so a request
/// of any method may try once more), or anything else.
pub(super) enum Connecting {
    Refused(String),
    Failed(UpstreamError),
}

impl Connecting {
    pub(super) fn into_error(self) -> UpstreamError {
        match self {
            Connecting::Refused(why) => UpstreamError::Connect(why),
            Connecting::Failed(error) => error,
        }
    }
}

/// Whether a connector's error is, at its root, a refused TCP connection.
fn connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = e.source();
    }
    false
}
