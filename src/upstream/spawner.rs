//! Where the upstream client's own tasks run (HTTP/2 connections and their opens, token
//! fetches).

use crate::metrics::PanicSite;
use crate::tasks::Tasks;

/// Where the client's own tasks run: behind the panic guard, and, once the service gives one, on
/// a runtime of its own, away from the workers, so that a worker busy with a mapping holds up no
/// other worker's call on a connection it would have opened.
#[derive(Clone)]
pub(super) struct Spawner {
    pub(super) tasks: Tasks,
    pub(super) on: Option<tokio::runtime::Handle>,
}

impl Spawner {
    pub(super) fn spawn<F>(&self, future: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.on {
            Some(handle) => drop(self.tasks.spawn_on(handle, PanicSite::Background, future)),
            None => drop(self.tasks.spawn(PanicSite::Background, future)),
        }
    }
}
