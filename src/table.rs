//! The route table: every loaded route, compiled, by uuid. Lookups on the request path take one
//! shard's read lock for as long as it takes to clone an `Arc`; a registration or update builds
//! the new route first and then swaps it in, so no lookup waits on compilation or storage.

use std::sync::Arc;

use dashmap::DashMap;
use uuid::Uuid;

use crate::route::Route;

#[derive(Default)]
pub struct RouteTable {
    routes: DashMap<Uuid, Arc<Route>>,
}

impl RouteTable {
    pub fn get(&self, uuid: &Uuid) -> Option<Arc<Route>> {
        self.routes.get(uuid).map(|entry| entry.value().clone())
    }

    /// Adds a route or replaces the one with the same uuid, atomically for readers.
    pub fn insert(&self, route: Arc<Route>) {
        self.routes.insert(route.uuid, route);
    }

    pub fn remove(&self, uuid: &Uuid) -> Option<Arc<Route>> {
        self.routes.remove(uuid).map(|(_, route)| route)
    }

    /// Runs `f` on every route, in no particular order.
    pub fn for_each(&self, mut f: impl FnMut(&Arc<Route>)) {
        for entry in &self.routes {
            f(entry.value());
        }
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}
