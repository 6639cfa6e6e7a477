//! The route table: every loaded route, compiled, by uuid. Lookups on the request path take one
//! shard's read lock for as long as it takes to clone an `Arc`; a registration or update builds
//! the new route first and then swaps it in, so no lookup waits on compilation or storage. A
//! stored route the key ring cannot open is held as what it is, a [`LockedRoute`], never as a
//! route: every handler that finds one must say what it does with it.

use std::sync::Arc;

use dashmap::DashMap;
use uuid::Uuid;

use crate::route::{LockedRoute, Route};

/// What the table holds under a uuid.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A route, compiled (it may still be unable to serve: [`Route::broken`]).
    Route(Arc<Route>),
    /// A stored route sealed by a key the ring lacks: only its times and revision are known.
    Locked(Arc<LockedRoute>),
}

impl Entry {
    pub fn uuid(&self) -> Uuid {
        match self {
            Entry::Route(route) => route.uuid,
            Entry::Locked(locked) => locked.uuid,
        }
    }

    /// The revision of the store change this version comes from (0 for a route stored before
    /// revisions were kept): the version an `ETag` names.
    pub fn revision(&self) -> u64 {
        match self {
            Entry::Route(route) => route.revision,
            Entry::Locked(locked) => locked.revision,
        }
    }

    pub fn created_at(&self) -> u64 {
        match self {
            Entry::Route(route) => route.created_at,
            Entry::Locked(locked) => locked.created_at,
        }
    }

    pub fn updated_at(&self) -> u64 {
        match self {
            Entry::Route(route) => route.updated_at,
            Entry::Locked(locked) => locked.updated_at,
        }
    }

    /// The route, unless it is locked.
    pub fn route(&self) -> Option<&Arc<Route>> {
        match self {
            Entry::Route(route) => Some(route),
            Entry::Locked(_) => None,
        }
    }
}

impl From<Route> for Entry {
    fn from(route: Route) -> Entry {
        Entry::Route(Arc::new(route))
    }
}

impl From<LockedRoute> for Entry {
    fn from(locked: LockedRoute) -> Entry {
        Entry::Locked(Arc::new(locked))
    }
}

/// Every version of a route carries the revision of the store change it comes from
/// ([`Entry::revision`]): the table keeps the newest, whatever order changes are applied in.
#[derive(Default)]
pub struct RouteTable {
    routes: DashMap<Uuid, Entry>,
    /// Cluster mode: the revision at which each deleted route was deleted, so that a change
    /// older than its deletion, applied late (a cluster node's own write after the follower
    /// applied the deletion), cannot bring it back. A node alone applies its changes one at a
    /// time, in order, and remembers none: deleted routes leave nothing behind.
    deleted: DashMap<Uuid, u64>,
    remembers_deletions: bool,
}

impl RouteTable {
    /// The table of a node alone: changes come one at a time, in order.
    pub fn standalone() -> RouteTable {
        RouteTable::default()
    }

    /// The table of a cluster node, whose changes may come out of order.
    pub fn cluster() -> RouteTable {
        RouteTable { remembers_deletions: true, ..RouteTable::default() }
    }

    /// How many deletions are remembered.
    pub fn deletions_remembered(&self) -> usize {
        self.deleted.len()
    }

    pub fn get(&self, uuid: &Uuid) -> Option<Entry> {
        self.routes.get(uuid).map(|entry| entry.value().clone())
    }

    /// Adds a route or replaces the one with the same uuid, atomically for readers.
    pub fn insert(&self, entry: Entry) {
        self.routes.insert(entry.uuid(), entry);
    }

    /// Puts `entry` in unless the table holds the same or a newer revision of it, or it was
    /// deleted at a later revision; a route's answer counts go on from the route it replaces.
    /// Returns whether it went in.
    pub fn apply(&self, entry: Entry) -> bool {
        let entry = match entry {
            Entry::Route(route) => match (self.get(&route.uuid), Arc::try_unwrap(route)) {
                (Some(Entry::Route(current)), Ok(mut route)) => {
                    route.statuses = current.statuses.clone();
                    route.stats = current.stats.clone();
                    Entry::Route(Arc::new(route))
                }
                (_, Ok(route)) => Entry::Route(Arc::new(route)),
                (_, Err(shared)) => Entry::Route(shared),
            },
            locked => locked,
        };
        self.apply_shared(entry)
    }

    /// [`RouteTable::apply`] for a route already shared, whose answer counts are its own (an
    /// update hands the old route's on before this).
    pub fn apply_shared(&self, entry: Entry) -> bool {
        use dashmap::mapref::entry::Entry as Place;
        let (uuid, revision) = (entry.uuid(), entry.revision());
        let place = self.routes.entry(uuid);
        // Checked while the entry is held: a deletion applied meanwhile either is seen here, or
        // its removal waits for this insert and then removes it.
        if self.deleted.get(&uuid).is_some_and(|at| *at >= revision) {
            return false;
        }
        match place {
            Place::Occupied(current) if current.get().revision() >= revision => false,
            Place::Occupied(mut current) => {
                current.insert(entry);
                true
            }
            Place::Vacant(place) => {
                place.insert(entry);
                true
            }
        }
    }

    /// Removes route `uuid`, deleted at `revision`, unless the table holds a newer revision of
    /// it, and remembers the deletion. Returns whether a route was removed.
    pub fn delete(&self, uuid: Uuid, revision: u64) -> bool {
        // Remembered first (and released), then removed: see `apply_shared`.
        if self.remembers_deletions {
            self.deleted.entry(uuid).and_modify(|at| *at = (*at).max(revision)).or_insert(revision);
        }
        self.routes.remove_if(&uuid, |_, entry| entry.revision() < revision).is_some()
    }

    /// Cluster mode, after a full reload: removes every route `keep` refuses, remembering each as
    /// deleted at revision `at`. Returns how many were removed.
    pub fn retain(&self, at: u64, keep: impl Fn(&Entry) -> bool) -> usize {
        let mut gone = Vec::new();
        self.routes.retain(|uuid, entry| {
            let kept = keep(entry);
            if !kept {
                gone.push(*uuid);
            }
            kept
        });
        for uuid in &gone {
            self.deleted.insert(*uuid, at);
        }
        gone.len()
    }

    /// Cluster mode: forgets every remembered deletion (the database was recreated or restored, so
    /// its revisions start again).
    pub fn forget_deletions(&self) {
        self.deleted.clear();
    }

    /// Every route's uuid and revision, sorted by uuid.
    pub fn revisions(&self) -> Vec<(Uuid, u64)> {
        let mut all: Vec<(Uuid, u64)> =
            self.routes.iter().map(|e| (*e.key(), e.value().revision())).collect();
        all.sort_unstable();
        all
    }

    /// Runs `f` on every entry, in no particular order.
    pub fn for_each(&self, mut f: impl FnMut(&Entry)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{Registration, Route};
    use crate::rules::Limits;

    fn route(n: u128, revision: u64) -> Route {
        let json = r#"{"path":"p","originalRoute":{"originalApi":{"baseUrl":"https://a.example"},"path":""},
            "rulesAsString":{"newBodyFields":{"a":{"key":"a","type":"String"}},"oldBodyFields":{"a":{"keys":["a"]}}}}"#;
        let registration: Registration = serde_json::from_str(json).expect("a registration");
        let config = registration.validate(false, None).expect("valid");
        let mut route = Route::new(Uuid::from_u128(n), 0, 0, config, &Limits::default());
        route.revision = revision;
        route
    }

    #[test]
    fn a_node_alone_remembers_no_deletion_and_a_cluster_node_each_until_it_reloads() {
        let alone = RouteTable::standalone();
        let cluster = RouteTable::cluster();
        for n in 0..100 {
            for table in [&alone, &cluster] {
                assert!(table.apply(route(n, 2 * n as u64 + 1).into()));
                assert!(table.delete(Uuid::from_u128(n), 2 * n as u64 + 2));
            }
        }
        assert_eq!(
            (alone.len(), alone.deletions_remembered()),
            (0, 0),
            "routes that came and went leave nothing"
        );
        assert_eq!((cluster.len(), cluster.deletions_remembered()), (0, 100));
        // A cluster node's own write applied after the follower applied a later deletion stays
        // out.
        assert!(!cluster.apply(route(7, 1).into()));
        cluster.forget_deletions();
        assert_eq!(cluster.deletions_remembered(), 0);
    }
}
