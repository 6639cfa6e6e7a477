//! The threads that serve connections: one per core by default (`RECAST_WORKERS`), each running
//! its own single-threaded runtime with its own event loop and timers, like the worker processes
//! of an event-driven proxy. The accept loop hands each new connection to the worker with the
//! fewest open ones, and the connection stays there: every request on it is read, sent upstream
//! (over that worker's own HTTP/1.1 upstream connections, see [`crate::upstream`]), mapped and
//! answered on one thread, with no task moving between threads and no wake-up crossing them. (An
//! HTTP/2 upstream connection is shared by every worker: it is made, and its frames handled, on
//! the main runtime, so that a worker busy with a mapping holds up no other worker's calls.)

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The stack of a worker thread: room for reading and mapping a document nested as deep as
/// `RECAST_MAX_DEPTH` allows (1024; the on-demand walk and the writer recurse per level) with a
/// wide margin, in debug builds too, whose frames are several times larger. Only what is touched
/// is ever backed by memory.
pub(crate) const STACK_BYTES: usize = 16 << 20;

thread_local! {
    /// The number of the worker this thread is (1, 2, …), or 0 on any other thread.
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The number of the worker the calling thread is, from 1; 0 outside the workers.
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// The running workers; they stop when this is dropped.
pub(crate) struct Workers {
    workers: Vec<Worker>,
}

struct Worker {
    handle: Handle,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Connections handed to this worker and not yet closed.
    open: Arc<AtomicUsize>,
    /// Dropped (or sent) to stop the worker.
    stop: Option<oneshot::Sender<()>>,
}

/// Counts a connection on its worker while it lives.
pub(crate) struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// Starts `count` workers (at least one).
    pub(crate) fn start(count: usize) -> std::io::Result<Workers> {
        let mut workers = Vec::with_capacity(count.max(1));
        for number in 1..=count.max(1) {
            // Its blocking threads (store writes) are named after it, so a panic there names it.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .thread_name(format!("recast-worker-{number}-blocking"))
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("recast-worker-{number}"))
                .stack_size(STACK_BYTES)
                .spawn(move || {
                    WORKER.with(|worker| worker.set(number));
                    // Until stopped; the connections' tasks run while this waits.
                    let _ = runtime.block_on(stopped);
                    // Waits for blocking work begun on this worker (a synced store write) to finish.
                    drop(runtime);
                })?;
            workers.push(Worker {
                handle,
                thread: Some(thread),
                open: Arc::new(AtomicUsize::new(0)),
                stop: Some(stop),
            });
        }
        Ok(Workers { workers })
    }

    /// The worker with the fewest open connections (the first of those on a tie), where the next
    /// connection goes, and its count taken for that connection.
    pub(crate) fn place(&self) -> (&Handle, Placed) {
        let worker = self
            .workers
            .iter()
            .min_by_key(|worker| worker.open.load(Ordering::Relaxed))
            .unwrap_or_else(|| unreachable!("there is always at least one worker"));
        worker.open.fetch_add(1, Ordering::Relaxed);
        (&worker.handle, Placed(worker.open.clone()))
    }

    /// Stops every worker and waits until each has finished the blocking work begun on it.
    /// Blocks: call it off the async threads.
    pub(crate) fn stop(mut self) {
        self.signal();
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                // A worker's thread only waits and drops its runtime; it does not panic.
                let _ = thread.join();
            }
        }
    }

    fn signal(&mut self) {
        for worker in &mut self.workers {
            if let Some(stop) = worker.stop.take() {
                let _ = stop.send(());
            }
        }
    }
}

impl Drop for Workers {
    /// Stops the workers without waiting for them.
    fn drop(&mut self) {
        self.signal();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_least_busy_worker_and_run_there() {
        let workers = Workers::start(2).expect("workers start");
        let (first, a) = workers.place();
        let first = first.clone();
        let (second, b) = workers.place();
        let second = second.clone();
        assert_ne!(first.id(), second.id(), "the second connection goes to the idle worker");
        drop(a);
        let (third, _c) = workers.place();
        assert_eq!(third.id(), first.id(), "a closed connection frees its place");
        drop(b);

        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let numbers = runtime.block_on(async {
            let one = first.spawn(async { current() }).await.expect("ran");
            let two = second.spawn(async { current() }).await.expect("ran");
            (one, two)
        });
        assert_eq!(numbers, (1, 2), "each task ran on its own worker's thread");
        assert_eq!(current(), 0, "other threads are no worker");

        // Stopping waits for blocking work begun on a worker.
        let finished = Arc::new(AtomicUsize::new(0));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let marker = finished.clone();
        first.spawn(async move {
            let _ = tokio::task::spawn_blocking(move || {
                let _ = started_tx.send(());
                std::thread::sleep(std::time::Duration::from_millis(200));
                marker.store(1, Ordering::SeqCst);
            })
            .await;
        });
        started_rx.recv().expect("the blocking work started");
        workers.stop();
        assert_eq!(finished.load(Ordering::SeqCst), 1, "stop returned before the blocking work ended");
    }
}
