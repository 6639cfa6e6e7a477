//! The HTTP server: accepts connections, routes each request to its handler, answers every error
//! through [`ApiError`], stamps `X-Request-Id` on every answer, and drains on shutdown.

mod preview;
pub mod problem;

use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::config::Config;
pub use problem::ApiError;

/// What every handler answers with.
pub type Response = http::Response<Full<Bytes>>;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// Where the service is in its life (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Lifecycle {
    /// Starting: not yet answering readiness.
    Idle = 0,
    Running = 1,
    /// Shutting down: no new connections, in-flight requests finish.
    Stopped = 2,
}

/// State shared by every connection.
pub struct State {
    config: Config,
    lifecycle: AtomicU8,
    request_ids: RequestIds,
}

impl State {
    fn new(config: Config) -> State {
        State { config, lifecycle: AtomicU8::new(Lifecycle::Idle as u8), request_ids: RequestIds::new() }
    }

    pub fn lifecycle(&self) -> Lifecycle {
        match self.lifecycle.load(Ordering::Acquire) {
            0 => Lifecycle::Idle,
            1 => Lifecycle::Running,
            _ => Lifecycle::Stopped,
        }
    }

    fn enter(&self, next: Lifecycle) {
        self.lifecycle.store(next as u8, Ordering::Release);
        tracing::info!(state = ?next, "lifecycle");
    }
}

/// Serves HTTP on `listener` until `shutdown` completes, then stops accepting, lets requests in
/// flight finish within the configured grace period, and returns.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let state = Arc::new(State::new(config));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    state.enter(Lifecycle::Running);
    tracing::info!(address = %listener.local_addr()?, "listening");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let state = state.clone();
                    let service = service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(&state, request).await) }
                    });
                    let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                    connections.spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    state.enter(Lifecycle::Stopped);
    let grace = state.config.shutdown_grace();
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(open = connections.len(), ?grace, "grace period over; closing what is left");
    }
    connections.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Routes one request and finishes its answer.
async fn handle(state: &State, request: Request<Incoming>) -> Response {
    let request_id = state.request_ids.for_request(&request);
    let path = request.uri().path().to_owned();
    let result = match (request.method(), path.as_str()) {
        (&Method::POST, "/v1/preview") => preview::preview(state, request).await,
        (_, "/v1/preview") => Err(ApiError::MethodNotAllowed { allow: "POST" }),
        (&Method::GET, "/healthz") => Ok(json(StatusCode::OK, r#"{"status":"ok"}"#)),
        (&Method::GET, "/readyz") => Ok(readiness(state)),
        (_, "/healthz" | "/readyz") => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        _ => Err(ApiError::NotFound),
    };
    let mut response = result.unwrap_or_else(|e| e.to_response(&path));
    response.headers_mut().insert(REQUEST_ID, request_id);
    response
}

fn readiness(state: &State) -> Response {
    match state.lifecycle() {
        Lifecycle::Running => json(StatusCode::OK, r#"{"status":"running"}"#),
        Lifecycle::Idle => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"idle"}"#),
        Lifecycle::Stopped => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"stopped"}"#),
    }
}

/// A JSON answer.
pub fn json(status: StatusCode, body: impl Into<Bytes>) -> Response {
    let mut response = http::Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Reads a request body of at most `limit` bytes; larger bodies are refused before they are read
/// when `Content-Length` says so, else as soon as the limit is passed.
pub(crate) async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Vec<u8>, ApiError> {
    let declared =
        request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let capacity = declared.map_or(8 * 1024, |n| n as usize);
    let mut buf = Vec::with_capacity(capacity + crate::json::PADDING);
    let mut body = request.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ApiError::BodyUnreadable)?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(ApiError::BodyTooLarge { limit });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

/// Request ids: the client's `X-Request-Id` when it is sane, else a new one made of a random
/// per-process prefix and a counter (unique without a system call per request).
struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl RequestIds {
    fn new() -> RequestIds {
        let prefix = std::collections::hash_map::RandomState::new().build_hasher().finish() as u32;
        RequestIds { prefix, next: AtomicU64::new(1) }
    }

    fn for_request<B>(&self, request: &Request<B>) -> HeaderValue {
        if let Some(given) = request.headers().get(REQUEST_ID)
            && is_sane_request_id(given.as_bytes())
        {
            return given.clone();
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::try_from(format!("{:08x}-{n:012x}", self.prefix))
            .unwrap_or(HeaderValue::from_static("unknown"))
    }
}

/// 1 to 128 characters of letters, digits and `-_.:`.
fn is_sane_request_id(id: &[u8]) -> bool {
    (1..=128).contains(&id.len())
        && id.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_keep_sane_client_ids_and_replace_others() {
        let ids = RequestIds::new();
        let with = |id: &str| {
            let request = Request::builder().header(REQUEST_ID, id).body(()).unwrap();
            ids.for_request(&request)
        };
        assert_eq!(with("abc-123_x.y:z"), "abc-123_x.y:z");
        let replaced = with("has space");
        assert_ne!(replaced, "has space");
        assert_ne!(with(&"a".repeat(129)), "a".repeat(129).as_str());
        let fresh = ids.for_request(&Request::new(()));
        assert!(is_sane_request_id(fresh.as_bytes()));
        assert_ne!(fresh, replaced, "generated ids are unique");
    }
}
