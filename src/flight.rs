//! One in flight, the others wait: calls that need the same thing at the same moment share one
//! piece of work and its outcome. The one primitive behind the upstream call of a cached
//! route's miss (`crate::cache`), a credential set's token fetch and the open of an HTTP/2
//! connection to an upstream (`crate::upstream`).
//!
//! The first call to [`Flights::join`] a key leads its flight; the calls that join while it is
//! under way wait on it. The leader hands its outcome to every waiter with [`Leader::share`]; a
//! leader dropped without sharing (its work was cancelled, or panicked) hands them nothing, and
//! they decide what to do (usually: join again). Either way the key is free for the next flight
//! at once: an outcome is shared with those who waited for it, never kept for later calls.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use tokio::time::Instant;

/// The flights under way, by key.
pub struct Flights<K, T> {
    by_key: Mutex<HashMap<K, Flight<T>>>,
}

/// Where a flight's outcome goes.
type Flight<T> = Arc<watch::Sender<Option<T>>>;

/// A call's place in the flight of its key.
pub enum Joined<K: Hash + Eq + Clone, T> {
    /// This call leads: it does the work (or has a task do it) and hands the outcome on with
    /// [`Leader::share`].
    Leader(Leader<K, T>),
    /// Another call leads; wait with [`Waiter::wait`].
    Waiter(Waiter<T>),
}

/// The leader of a flight.
pub struct Leader<K: Hash + Eq + Clone, T> {
    flights: Arc<Flights<K, T>>,
    key: K,
    flight: Flight<T>,
}

/// A call waiting on a flight.
pub struct Waiter<T>(watch::Receiver<Option<T>>);

/// A waiter's deadline passed before the outcome came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

impl<K, T> Default for Flights<K, T> {
    fn default() -> Flights<K, T> {
        Flights { by_key: Mutex::default() }
    }
}

impl<K: Hash + Eq + Clone, T: Clone> Flights<K, T> {
    /// Joins the flight of `key`, or begins it.
    pub fn join(self: &Arc<Self>, key: &K) -> Joined<K, T> {
        let mut by_key = self.lock();
        if let Some(flight) = by_key.get(key) {
            return Joined::Waiter(Waiter(flight.subscribe()));
        }
        let flight = Arc::new(watch::Sender::new(None));
        by_key.insert(key.clone(), flight.clone());
        Joined::Leader(Leader { flights: self.clone(), key: key.clone(), flight })
    }

    /// Whether a flight of `key` is under way.
    pub fn flying(&self, key: &K) -> bool {
        self.lock().contains_key(key)
    }

    /// How many flights are under way.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no flight is under way.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Detaches the flights whose key `which` picks, then runs `then`, both under the flights'
    /// lock: their waiters still get their outcome, but a call that joins after this begins a
    /// new flight, and their leaders are no longer current ([`Leader::while_current`]).
    pub fn detach<R>(&self, which: impl Fn(&K) -> bool, then: impl FnOnce() -> R) -> R {
        let mut by_key = self.lock();
        by_key.retain(|key, _| !which(key));
        then()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Flight<T>>> {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K: Hash + Eq + Clone, T> Leader<K, T> {
    /// The key of the flight.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// A waiter on this very flight, for a leader that lets a task of its own do the work and
    /// waits for it like the others.
    pub fn waiter(&self) -> Waiter<T> {
        Waiter(self.flight.subscribe())
    }

    /// Runs `work` under the flights' lock if this flight is still its key's (no
    /// [`Flights::detach`] came between): what a detach must not miss is done there.
    pub fn while_current<R>(&self, work: impl FnOnce() -> R) -> Option<R> {
        let by_key = self.flights.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        by_key.get(&self.key).is_some_and(|current| Arc::ptr_eq(current, &self.flight)).then(work)
    }

    /// Resolves once no call waits for the flight's outcome any more, and then takes the flight
    /// away from its key (under the flights' lock, so that no call joins it after): the work may
    /// be called off, and the next call of the key begins a new flight.
    pub async fn unwaited(&self) {
        loop {
            self.flight.closed().await;
            let mut by_key = self.flights.by_key.lock().unwrap_or_else(PoisonError::into_inner);
            if self.flight.receiver_count() == 0 {
                if by_key.get(&self.key).is_some_and(|current| Arc::ptr_eq(current, &self.flight)) {
                    by_key.remove(&self.key);
                }
                return;
            }
        }
    }

    /// Hands `outcome` to every call waiting on this flight; a call that joins after this begins
    /// a new one.
    pub fn share(self, outcome: T) {
        self.leave();
        self.flight.send_replace(Some(outcome));
    }

    /// Takes the flight away from its key, unless a detach already did.
    fn leave(&self) {
        let mut by_key = self.flights.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        if by_key.get(&self.key).is_some_and(|current| Arc::ptr_eq(current, &self.flight)) {
            by_key.remove(&self.key);
        }
    }
}

impl<K: Hash + Eq + Clone, T> Drop for Leader<K, T> {
    /// A leader that goes without sharing takes its flight away: its waiters get nothing.
    fn drop(&mut self) {
        self.leave();
    }
}

impl<T: Clone> Waiter<T> {
    /// Waits for the flight's outcome, however long it takes (the caller bounds its own time);
    /// `None` when its leader went without one.
    pub async fn outcome(mut self) -> Option<T> {
        self.0.wait_for(Option::is_some).await.ok().and_then(|outcome| outcome.clone())
    }

    /// Waits for the flight's outcome until `deadline`; `Ok(None)` when its leader went without
    /// one.
    pub async fn wait(mut self, deadline: Instant) -> Result<Option<T>, TimedOut> {
        match tokio::time::timeout_at(deadline, self.0.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => Ok(outcome.clone()),
            Ok(Err(_)) => Ok(None),
            Err(_) => Err(TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn the_first_call_leads_the_others_share_its_outcome_and_the_next_call_leads_anew() {
        let flights: Arc<Flights<&str, u32>> = Arc::default();
        let Joined::Leader(leader) = flights.join(&"a") else { panic!("the first call leads") };
        let Joined::Waiter(waiter) = flights.join(&"a") else { panic!("the second waits") };
        let Joined::Leader(other) = flights.join(&"b") else { panic!("another key has its own flight") };
        let own = leader.waiter();
        assert_eq!(flights.len(), 2);
        leader.share(7);
        assert_eq!(waiter.wait(later()).await, Ok(Some(7)));
        assert_eq!(own.wait(later()).await, Ok(Some(7)));
        assert!(!flights.flying(&"a"), "the outcome is not kept");
        assert!(matches!(flights.join(&"a"), Joined::Leader(_)));
        drop(other);
        assert!(flights.is_empty());
    }

    #[tokio::test]
    async fn a_leader_gone_without_sharing_hands_nothing_and_frees_its_key() {
        let flights: Arc<Flights<u8, u32>> = Arc::default();
        let Joined::Leader(leader) = flights.join(&1) else { panic!() };
        let Joined::Waiter(waiter) = flights.join(&1) else { panic!() };
        drop(leader);
        assert_eq!(waiter.wait(later()).await, Ok(None));
        assert!(!flights.flying(&1));
        let Joined::Waiter(waiter) = ({
            let Joined::Leader(leader) = flights.join(&1) else { panic!() };
            let joined = flights.join(&1);
            std::mem::forget(leader);
            joined
        }) else {
            panic!()
        };
        assert_eq!(waiter.wait(Instant::now() + Duration::from_millis(10)).await, Err(TimedOut));
    }

    #[tokio::test]
    async fn a_detached_flight_still_hands_its_outcome_but_is_no_longer_current() {
        let flights: Arc<Flights<u8, u32>> = Arc::default();
        let Joined::Leader(leader) = flights.join(&1) else { panic!() };
        let Joined::Waiter(waiter) = flights.join(&1) else { panic!() };
        assert_eq!(leader.while_current(|| "kept"), Some("kept"));
        let detached = flights.detach(|key| *key == 1, || "dropped");
        assert_eq!(detached, "dropped");
        assert_eq!(leader.while_current(|| "kept"), None);
        let Joined::Leader(next) = flights.join(&1) else { panic!("a new flight begins") };
        leader.share(3);
        assert_eq!(waiter.wait(later()).await, Ok(Some(3)));
        assert!(flights.flying(&1), "the old leader's share left the new flight alone");
        drop(next);
    }
}
