//! State the client keeps per key (an origin's breaker, a limit, a retry budget, a route's TLS
//! connector, a credential set's token): found under a read lock, made under the write lock the
//! first time its key is met, and let go by the sweeper once nobody holds it, it has not been
//! used for a while, and it is at rest (nothing would be lost by making it anew).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// How many sweeps state may go unused before it is let go (ten minutes of the client's sweeps,
/// every 30 s).
pub(super) const UNUSED_SWEEPS: u64 = 20;

/// State by key, and when each was last used (by the sweeps counted so far).
pub(super) struct PerKey<K, T> {
    all: RwLock<HashMap<K, Kept<T>>>,
    /// Sweeps so far: the clock that uses are stamped with.
    sweeps: AtomicU64,
}

struct Kept<T> {
    state: Arc<T>,
    /// The sweep count when it was last used.
    used: AtomicU64,
}

impl<K, T> Default for PerKey<K, T> {
    fn default() -> PerKey<K, T> {
        PerKey { all: RwLock::default(), sweeps: AtomicU64::new(0) }
    }
}

impl<K: Hash + Eq, T> PerKey<K, T> {
    /// The state of `key`, made by `make` when there is none yet; its use is noted.
    pub(super) fn get_or<Q>(&self, key: &Q, make: impl FnOnce() -> T) -> Arc<T>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.sweeps.load(Ordering::Relaxed);
        {
            let all = self.all.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(kept) = all.get(key) {
                kept.used.store(now, Ordering::Relaxed);
                return kept.state.clone();
            }
        }
        let mut all = self.all.write().unwrap_or_else(PoisonError::into_inner);
        let kept = all
            .entry(key.to_owned())
            .or_insert_with(|| Kept { state: Arc::new(make()), used: AtomicU64::new(now) });
        kept.used.store(now, Ordering::Relaxed);
        kept.state.clone()
    }

    /// The state of `key`, if there is some; its use is noted.
    pub(super) fn get<Q>(&self, key: &Q) -> Option<Arc<T>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.sweeps.load(Ordering::Relaxed);
        let all = self.all.read().unwrap_or_else(PoisonError::into_inner);
        all.get(key).map(|kept| {
            kept.used.store(now, Ordering::Relaxed);
            kept.state.clone()
        })
    }

    /// `view` of every key's state, in the order of the keys.
    pub(super) fn each<R>(&self, mut view: impl FnMut(&K, &T) -> R) -> Vec<R>
    where
        K: Ord,
    {
        let all = self.all.read().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<(&K, &Kept<T>)> = all.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        keys.into_iter().map(|(key, kept)| view(key, &kept.state)).collect()
    }

    /// How many keys have state.
    pub(super) fn len(&self) -> usize {
        self.all.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// One sweep (of those made `every` so long): lets go of the state that nobody else holds,
    /// that was not used in the last [`UNUSED_SWEEPS`] sweeps, and that `at_rest` says is at rest,
    /// given how long it went unused at least. `at_rest` is asked only of state that goes when it
    /// says yes.
    pub(super) fn sweep(&self, every: Duration, mut at_rest: impl FnMut(&T, Duration) -> bool) {
        let now = self.sweeps.fetch_add(1, Ordering::Relaxed) + 1;
        let mut all = self.all.write().unwrap_or_else(PoisonError::into_inner);
        all.retain(|_, kept| {
            let unused = now.saturating_sub(kept.used.load(Ordering::Relaxed));
            let unused_for =
                every.saturating_mul(u32::try_from(unused.saturating_sub(1)).unwrap_or(u32::MAX));
            Arc::strong_count(&kept.state) > 1 || unused <= UNUSED_SWEEPS || !at_rest(&kept.state, unused_for)
        });
    }

    /// Puts `state` in for `key`, as used now.
    pub(super) fn insert(&self, key: K, state: T) {
        let used = AtomicU64::new(self.sweeps.load(Ordering::Relaxed));
        let mut all = self.all.write().unwrap_or_else(PoisonError::into_inner);
        all.insert(key, Kept { state: Arc::new(state), used });
    }

    /// Takes the state of `key` out.
    pub(super) fn remove<Q>(&self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.all.write().unwrap_or_else(PoisonError::into_inner).remove(key);
    }
}
