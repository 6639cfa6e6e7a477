//! The one guard every task recast starts goes through: connections, cache refreshes, the
//! cluster follower and its snapshot writes, store operations on the blocking pool, the upstream
//! pool's sweeper. A panic in a task is a bug; the guard catches it, logs it with the site it
//! happened at, counts it in `recast_panics_total{site}`, and the process goes on. (A request's
//! handler is not a task of its own: the router catches it in place with [`caught`] and answers
//! 500.) Beside it, [`boxed`]: how the request path boxes a large future without copying it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::metrics::{Metrics, PanicSite};

/// Starts tasks behind the guard; cheap to clone.
#[derive(Clone)]
pub struct Tasks {
    metrics: Arc<Metrics>,
    /// Blocking work given to [`Tasks::blocking`] that has not ended (queued or running).
    blocking_now: Arc<AtomicUsize>,
}

/// A guarded task panicked (its message, already logged and counted), or a blocking one was
/// cancelled because the runtime is stopping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panicked(pub String);

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a task panicked: {}", self.0)
    }
}

impl Tasks {
    /// Tasks whose panics are counted in `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Tasks {
        Tasks { metrics, blocking_now: Arc::default() }
    }

    /// `future`, guarded: its output, or [`Panicked`] once a panic while polling it was caught,
    /// logged and counted at `site`.
    pub fn guard<F: Future>(
        &self,
        site: PanicSite,
        future: F,
    ) -> impl Future<Output = Result<F::Output, Panicked>> + use<F> {
        let metrics = self.metrics.clone();
        async move {
            caught(future).await.map_err(|panic| {
                metrics.panicked(site);
                crate::logging::logged!(tracing::Level::ERROR, site = site.label(), %panic, "a task panicked; it was stopped");
                Panicked(panic)
            })
        }
    }

    /// Spawns `future`, guarded, on the current runtime.
    pub fn spawn<F>(&self, site: PanicSite, future: F) -> JoinHandle<Result<F::Output, Panicked>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        tokio::spawn(self.guard(site, future))
    }

    /// Spawns `future`, guarded, on the runtime of `handle`.
    pub fn spawn_on<F>(
        &self,
        handle: &Handle,
        site: PanicSite,
        future: F,
    ) -> JoinHandle<Result<F::Output, Panicked>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        handle.spawn(self.guard(site, future))
    }

    /// Runs `work` on the blocking pool, guarded.
    pub async fn blocking<T: Send + 'static>(
        &self,
        site: PanicSite,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Panicked> {
        self.blocking_now.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(self.blocking_now.clone());
        let work = move || {
            let _counted = counted;
            work()
        };
        match tokio::task::spawn_blocking(work).await {
            Ok(done) => Ok(done),
            // Not a bug: the runtime is going away.
            Err(e) if !e.is_panic() => Err(Panicked("the blocking task was cancelled".to_owned())),
            Err(e) => {
                let panic = crate::logging::panic_message(&*e.into_panic());
                self.metrics.panicked(site);
                crate::logging::logged!(tracing::Level::ERROR, site = site.label(), %panic, "a task panicked; it was stopped");
                Err(Panicked(panic))
            }
        }
    }

    /// Waits until no blocking work given to [`Tasks::blocking`] is left, or until `by`; whether
    /// none is left. (Work is not cancelled by its caller going away: store writes begun before a
    /// stop end before the store is closed, as a process that exits while the storage library
    /// works may crash in it.)
    pub async fn blocking_ended(&self, by: tokio::time::Instant) -> bool {
        loop {
            if self.blocking_now.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= by {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The metrics panics are counted in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// Counts one piece of blocking work until it ends, run or not.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The future `make` builds, built in its box. `Box::pin(future)` builds the future first and
/// then copies all of it into the box, its room for every state included (kilobytes for a call);
/// here the box is taken first, so the future can be built where it stays.
#[inline(always)]
pub fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// Polls `future` to its end, or until it panics: then the panic's message is returned. Safe to
/// use on the request path: the state a handler shares with others is atomics, locks that are not
/// poisoned or whose poison is ignored, and maps it changes in one step.
pub async fn caught<T>(future: impl Future<Output = T>) -> Result<T, String> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(crate::logging::panic_message(&*panic))),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn a_boxed_future_holds_its_state_in_the_box_and_runs_to_its_output() {
        let runtime = runtime();
        let future = boxed(|| async {
            let room = [7u8; 4096];
            tokio::task::yield_now().await;
            room.iter().map(|&b| usize::from(b)).sum::<usize>()
        });
        // A large future, as the request path's are: its room is held across the `await`.
        assert!(std::mem::size_of_val(&*future) >= 4096);
        assert_eq!(runtime.block_on(future), 7 * 4096);
    }

    #[test]
    fn a_panic_while_polled_is_caught_with_its_message_and_no_thread_dies() {
        let runtime = runtime();
        let fine = runtime.block_on(caught(async {
            tokio::task::yield_now().await;
            7
        }));
        assert_eq!(fine, Ok(7));
        let formatted = runtime.block_on(caught(async {
            tokio::task::yield_now().await;
            if fine.is_ok() {
                panic!("lane {} broke", 2);
            }
        }));
        assert_eq!(formatted, Err("lane 2 broke".to_owned()));
        let plain: Result<(), String> = runtime.block_on(caught(async { std::panic::panic_any(5u8) }));
        assert_eq!(plain, Err("(no message)".to_owned()));
    }

    #[test]
    fn spawned_and_blocking_tasks_that_panic_are_counted_at_their_site() {
        let runtime = runtime();
        let metrics = Arc::new(Metrics::default());
        let tasks = Tasks::new(metrics.clone());
        runtime.block_on(async {
            let ok = tasks.spawn(PanicSite::Refresh, async { 1 }).await.unwrap();
            assert_eq!(ok, Ok(1));
            let failed = tasks.spawn(PanicSite::Refresh, async { panic!("refresh broke") }).await.unwrap();
            assert_eq!(failed, Err::<(), _>(Panicked("refresh broke".to_owned())));
            let failed = tasks.blocking(PanicSite::Follower, || -> u8 { panic!("snapshot broke") }).await;
            assert_eq!(failed, Err(Panicked("snapshot broke".to_owned())));
            assert_eq!(tasks.blocking(PanicSite::Follower, || 2).await, Ok(2));
        });
        assert_eq!(metrics.panics(PanicSite::Refresh), 1);
        assert_eq!(metrics.panics(PanicSite::Follower), 1);
        assert_eq!(metrics.panics(PanicSite::Request), 0);
    }
}
