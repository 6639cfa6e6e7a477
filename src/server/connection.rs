//! One client connection: hyper serves it, while this driver closes it gracefully when it has
//! been idle (no request in flight) for `RECAST_IDLE_TIMEOUT_MS`, or when the service stops.
//! A client that never finishes a request head is cut off by hyper's header-read timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// What a connection is doing: requests in flight, and when the last one ended.
pub(super) struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `started` at the last request's end (or the connection's start).
    last_ms: AtomicU64,
}

/// Held while a request on the connection is served.
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.last_ms.store(self.0.started.elapsed().as_millis() as u64, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    pub(super) fn busy(self: &Arc<Activity>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// When the connection will have been idle for `idle`, if nothing happens meanwhile; `None`
    /// while a request is in flight.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.started + Duration::from_millis(self.last_ms.load(Ordering::Acquire)) + idle)
    }
}

/// A hyper connection that can be asked to finish its current request and close.
pub(super) trait Graceful: Future {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S> Graceful for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: http_body::Body + 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::Connection::graceful_shutdown(self)
    }
}

/// Drives `connection` to its end, closing it gracefully when idle for `idle` or when `stop`
/// changes. Returns the connection's own result.
pub(super) async fn drive<C>(
    connection: C,
    activity: Arc<Activity>,
    idle: Duration,
    mut stop: watch::Receiver<bool>,
) -> C::Output
where
    C: Graceful,
{
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        // While a request is in flight, look again after `idle`.
        let deadline = activity.idle_deadline(idle).unwrap_or_else(|| Instant::now() + idle);
        tokio::select! {
            result = connection.as_mut() => return result,
            changed = stop.changed(), if !closing => {
                if changed.is_err() || *stop.borrow() {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            () = tokio::time::sleep_until(deadline), if !closing => {
                if activity.idle_deadline(idle).is_some_and(|at| at <= Instant::now()) {
                    tracing::debug!(?idle, "closing an idle connection");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}
