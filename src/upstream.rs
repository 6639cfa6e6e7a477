//! The upstream client: a pooled, keep-alive hyper client for http and https (rustls, Mozilla's
//! roots) that sends a route's request and reads the answer under a connect timeout, one total
//! deadline for the whole exchange, and a size limit on the body. Redirects are not followed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::policy::{
    Guarded, Lookup, NotAllowed, OutboundPolicy, PolicyResolver, literal_address, refusal_in,
};
use crate::route::UpstreamRequest;

/// Settings of the upstream client.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    /// Deadline for sending the request and reading the whole answer.
    pub total_timeout: Duration,
    /// Largest answer body read.
    pub max_body: usize,
}

/// An upstream's answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body, with spare capacity for the JSON parser's padding.
    pub body: Vec<u8>,
    pub elapsed: Duration,
}

/// Why no answer came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection: refused, unreachable, name not resolved, TLS failed.
    Connect(String),
    /// The connection broke during the exchange.
    Broken(String),
    /// The deadline passed.
    Timeout,
    /// The body is larger than allowed.
    TooLarge { limit: usize },
    /// The outbound policy refuses the upstream's address; nothing was sent.
    NotAllowed(NotAllowed),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(why) => write!(f, "the upstream could not be reached: {why}"),
            UpstreamError::Broken(why) => write!(f, "the connection to the upstream broke: {why}"),
            UpstreamError::Timeout => f.write_str("the upstream did not answer in time"),
            UpstreamError::TooLarge { limit } => {
                write!(f, "the upstream's answer is larger than {limit} bytes (RECAST_MAX_UPSTREAM_BYTES)")
            }
            UpstreamError::NotAllowed(refusal) => refusal.fmt(f),
        }
    }
}

/// The most memory reserved for a body up front, whatever its declared length.
const RESERVE_LIMIT: usize = 1 << 20;

/// Why a body was not read whole.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Larger than the limit, by its `Content-Length` or by what arrived.
    TooLarge,
    /// The connection broke.
    Broken(hyper::Error),
}

/// Reads a body (a client's request or an upstream's answer) of at most `limit` bytes into a
/// buffer with room for the JSON parser's padding. A larger `Content-Length` is refused before
/// reading; a declared length is reserved only up to [`RESERVE_LIMIT`], so bodies that never
/// come cannot make recast hold memory, and the rest grows as it arrives.
pub(crate) async fn read_limited(
    headers: &HeaderMap,
    mut body: Incoming,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let reserve = declared.map_or(16 * 1024, |n| (n as usize).min(RESERVE_LIMIT));
    let mut buf = Vec::with_capacity(reserve + crate::json::PADDING);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(BodyError::Broken)?.into_data() {
            if buf.len() + data.len() > limit {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

type Connector = HttpsConnector<Guarded<HttpConnector<PolicyResolver>>>;

/// The pooled client; cheap to share.
#[derive(Clone)]
pub struct UpstreamClient {
    client: Client<Connector, Full<Bytes>>,
    settings: UpstreamSettings,
    policy: Arc<OutboundPolicy>,
    lookup: Arc<dyn Lookup>,
}

impl UpstreamClient {
    /// A client that connects only where `policy` allows, resolving names with `lookup`.
    pub fn new(
        settings: UpstreamSettings,
        policy: Arc<OutboundPolicy>,
        lookup: Arc<dyn Lookup>,
    ) -> UpstreamClient {
        let resolver = PolicyResolver { policy: policy.clone(), lookup: lookup.clone() };
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(settings.connect_timeout));
        let https = https_or_http(Guarded { inner: http, policy: policy.clone() });
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(https);
        UpstreamClient { client, settings, policy, lookup }
    }

    /// Checks the host of `uri` against the policy without connecting (registration's first
    /// step). The connector checks again, on the addresses it connects to.
    pub async fn check(&self, uri: &http::Uri) -> Result<(), UpstreamError> {
        let host = uri.host().unwrap_or_default();
        let addresses = match literal_address(host) {
            Some(ip) => vec![ip],
            // Resolving is part of connecting, and has its time limit.
            None => tokio::time::timeout(self.settings.connect_timeout, self.lookup.lookup(host))
                .await
                .map_err(|_| UpstreamError::Timeout)?
                .map_err(|e| UpstreamError::Connect(format!("`{host}` cannot be resolved: {e}")))?,
        };
        self.policy.filter(host, &addresses).map(|_| ()).map_err(UpstreamError::NotAllowed)
    }

    pub fn settings(&self) -> UpstreamSettings {
        self.settings
    }

    /// Sends `request` and reads the answer, all within the total deadline.
    pub async fn call(&self, request: UpstreamRequest) -> Result<Answer, UpstreamError> {
        let started = Instant::now();
        let exchange = self.exchange(request);
        match tokio::time::timeout(self.settings.total_timeout, exchange).await {
            Ok(Ok((status, headers, body))) => {
                Ok(Answer { status, headers, body, elapsed: started.elapsed() })
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    async fn exchange(
        &self,
        request: UpstreamRequest,
    ) -> Result<(StatusCode, HeaderMap, Vec<u8>), UpstreamError> {
        let mut outbound = Request::new(Full::new(request.body));
        *outbound.method_mut() = request.method;
        *outbound.uri_mut() = request.uri;
        *outbound.headers_mut() = request.headers;
        let response = self.client.request(outbound).await.map_err(|e| {
            if let Some(refusal) = refusal_in(&e) {
                return UpstreamError::NotAllowed(refusal.clone());
            }
            let why = error_chain(&e);
            if e.is_connect() { UpstreamError::Connect(why) } else { UpstreamError::Broken(why) }
        })?;
        let (parts, body) = response.into_parts();
        let limit = self.settings.max_body;
        let buf = read_limited(&parts.headers, body, limit).await.map_err(|e| match e {
            BodyError::TooLarge => UpstreamError::TooLarge { limit },
            BodyError::Broken(e) => UpstreamError::Broken(error_chain(&e)),
        })?;
        Ok((parts.status, parts.headers, buf))
    }
}

/// `inner` with TLS (rustls with ring, Mozilla's roots) for `https://` URLs, HTTP/1.1.
pub(crate) fn https_or_http<C>(inner: C) -> HttpsConnector<C> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(provider)
        // The ring provider supports the safe default protocol versions; this cannot fail.
        .unwrap_or_else(|_| hyper_rustls::HttpsConnectorBuilder::new().with_webpki_roots())
        .https_or_http()
        .enable_http1()
        .wrap_connector(inner)
}

/// An error and its causes, on one line.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
