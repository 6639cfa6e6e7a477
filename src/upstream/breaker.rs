//! A circuit breaker per upstream origin (scheme, host and port), or per route and origin for a
//! route whose `breaker` says `"scope": "route"`: after
//! `RECAST_BREAKER_FAILURES` failures in a row (no connection, a broken connection, the deadline
//! passed, a 5xx answer) it opens, and for `RECAST_BREAKER_COOLDOWN_MS` calls to that origin are
//! refused at once, without an outbound call. Then one call goes through as a probe: its success
//! closes the breaker, its failure opens it again; calls meanwhile are refused. Each change of
//! state is logged once.
//!
//! An outcome counts only in the state its call was let through in (each change of state starts a
//! new generation): a call sent before the breaker opened and failing after it opened does not
//! prolong the cooldown, and one succeeding then does not close the breaker while its probe runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Level;

use super::per_key::PerKey;
use crate::logging::logged;
use crate::metrics::{BreakerState, OriginBreaker};

/// The settings of every origin's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Failures in a row that open a breaker; 0: breakers never open.
    pub failures: u32,
    /// How long an open breaker refuses calls before a probe.
    pub cooldown: Duration,
}

/// Whose calls a breaker counts: every call to its origin (the default), or a route's alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BreakerScope {
    #[default]
    Origin,
    Route,
}

impl BreakerScope {
    pub fn is_origin(&self) -> bool {
        *self == BreakerScope::Origin
    }
}

/// The breakers of every origin called so far.
pub struct Breakers {
    settings: BreakerSettings,
    origins: PerKey<String, Breaker>,
}

/// A call refused by an open breaker: when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub retry_after: Duration,
}

impl Breakers {
    pub fn new(settings: BreakerSettings) -> Breakers {
        Breakers { settings, origins: PerKey::default() }
    }

    /// Lets a call to `origin` through (with a ticket to report its outcome on), or refuses it:
    /// by the breaker of `route` at that origin when given, else by the origin's.
    pub fn admit(&self, origin: &str, route: Option<uuid::Uuid>, now: Instant) -> Result<Ticket, Refused> {
        if self.settings.failures == 0 {
            return Ok(Ticket { breaker: None, settings: self.settings, generation: 0, probe: false });
        }
        let breaker = self.breaker(origin, route);
        let admitted = breaker.admit(&self.settings, now);
        admitted.map(|(generation, probe)| Ticket {
            breaker: Some(breaker),
            settings: self.settings,
            generation,
            probe,
        })
    }

    fn breaker(&self, origin: &str, route: Option<uuid::Uuid>) -> Arc<Breaker> {
        let make = || Breaker {
            origin: origin.to_owned(),
            route,
            state: Mutex::default(),
            rejected: AtomicU64::new(0),
            opened: AtomicU64::new(0),
        };
        match route {
            None => self.origins.get_or(origin, make),
            Some(route) => self.origins.get_or(&format!("{origin} route={route}"), make),
        }
    }

    /// Lets go of the breakers nobody used for a while that are closed (or open with their
    /// cooldown over, which the next call would probe), one sweep of those
    /// made `every` so long.
    pub fn sweep(&self, every: Duration, now: Instant) {
        self.origins.sweep(every, |breaker, _| breaker.at_rest(now));
    }

    /// How many breakers are kept.
    pub fn len(&self) -> usize {
        self.origins.len()
    }

    /// Whether no breaker is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every breaker, by origin (an origin's own first, then its routes').
    pub fn snapshot(&self) -> Vec<OriginBreaker> {
        self.origins.each(|_, breaker| OriginBreaker {
            origin: breaker.origin.clone(),
            route: breaker.route,
            state: breaker.state(),
            rejected: breaker.rejected.load(Ordering::Relaxed),
            opened: breaker.opened.load(Ordering::Relaxed),
        })
    }
}

/// What a call reports its outcome on. Dropped without a report (the call was cancelled), a probe
/// leaves the breaker open with its cooldown over, so that the next call probes.
pub struct Ticket {
    breaker: Option<Arc<Breaker>>,
    settings: BreakerSettings,
    generation: u64,
    probe: bool,
}

impl Ticket {
    /// Reports the call's outcome: `true` when the upstream answered with a status below 500.
    pub fn report(mut self, succeeded: bool, now: Instant) {
        if let Some(breaker) = self.breaker.take() {
            breaker.report(&self.settings, self.generation, succeeded, now);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let (Some(breaker), true) = (self.breaker.take(), self.probe) {
            breaker.abandon(self.generation);
        }
    }
}

struct Breaker {
    /// `scheme://host:port`.
    origin: String,
    /// The route whose calls alone it counts, if it is a route's.
    route: Option<uuid::Uuid>,
    state: Mutex<State>,
    rejected: AtomicU64,
    opened: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// Bumped at every change of state.
    generation: u64,
    phase: Phase,
}

impl Default for State {
    fn default() -> State {
        State { generation: 0, phase: Phase::Closed { failures: 0 } }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    Probing,
}

impl Breaker {
    /// Whether forgetting it loses nothing that matters: closed (failures counted before the
    /// many sweeps it went unused are no run of failures now), or open past its cooldown (a new
    /// breaker lets the next call through as a probe would).
    fn at_rest(&self, now: Instant) -> bool {
        match self.state.lock().unwrap_or_else(PoisonError::into_inner).phase {
            Phase::Closed { .. } => true,
            Phase::Open { until } => until <= now,
            Phase::Probing => false,
        }
    }

    fn state(&self) -> BreakerState {
        match self.state.lock().unwrap_or_else(PoisonError::into_inner).phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::Probing => BreakerState::HalfOpen,
        }
    }

    fn admit(&self, settings: &BreakerSettings, now: Instant) -> Result<(u64, bool), Refused> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.phase {
            Phase::Closed { .. } => Ok((state.generation, false)),
            Phase::Open { until } if now >= until => {
                state.generation += 1;
                state.phase = Phase::Probing;
                let generation = state.generation;
                drop(state);
                logged!(Level::INFO, upstream = %self.origin, route = ?self.route, "upstream breaker half-open: one call probes the upstream");
                Ok((generation, true))
            }
            phase => {
                drop(state);
                self.rejected.fetch_add(1, Ordering::Relaxed);
                let retry_after = match phase {
                    Phase::Open { until } => until.saturating_duration_since(now),
                    // The probe decides soon; its outcome is not known yet.
                    _ => settings.cooldown.min(Duration::from_secs(1)),
                };
                Err(Refused { retry_after })
            }
        }
    }

    fn report(&self, settings: &BreakerSettings, generation: u64, succeeded: bool, now: Instant) {
        let origin = &self.origin;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.generation != generation {
            return;
        }
        let (next, change) = match (state.phase, succeeded) {
            (Phase::Closed { failures }, false) if failures + 1 < settings.failures => {
                (Phase::Closed { failures: failures + 1 }, None)
            }
            (Phase::Closed { failures: 0 }, true) => return,
            (Phase::Closed { .. }, true) => (Phase::Closed { failures: 0 }, None),
            (Phase::Closed { .. }, false) => {
                (Phase::Open { until: now + settings.cooldown }, Some(Change::Opened))
            }
            (Phase::Probing, true) => (Phase::Closed { failures: 0 }, Some(Change::Closed)),
            (Phase::Probing, false) => {
                (Phase::Open { until: now + settings.cooldown }, Some(Change::Reopened))
            }
            // Calls are let through in the other phases only.
            (Phase::Open { .. }, _) => return,
        };
        state.phase = next;
        if change.is_some() {
            state.generation += 1;
        }
        drop(state);
        match change {
            Some(Change::Opened) => {
                self.opened.fetch_add(1, Ordering::Relaxed);
                logged!(
                    Level::WARN,
                    upstream = %origin,
                    route = ?self.route,
                    failures = settings.failures,
                    cooldown_ms = settings.cooldown.as_millis() as u64,
                    "upstream breaker opened: calls to this upstream are refused until the cooldown ends"
                );
            }
            Some(Change::Reopened) => {
                self.opened.fetch_add(1, Ordering::Relaxed);
                logged!(Level::WARN, upstream = %origin, route = ?self.route, "upstream breaker opened again: the probe failed");
            }
            Some(Change::Closed) => {
                logged!(Level::INFO, upstream = %origin, route = ?self.route, "upstream breaker closed: the probe succeeded");
            }
            None => {}
        }
    }

    /// A probe cancelled before its outcome: the breaker stays open, its cooldown over.
    fn abandon(&self, generation: u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.generation == generation && state.phase == Phase::Probing {
            state.generation += 1;
            state.phase = Phase::Open { until: Instant::now() };
        }
    }
}

enum Change {
    Opened,
    Reopened,
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "http://127.0.0.1:9";

    fn breakers() -> Breakers {
        Breakers::new(BreakerSettings { failures: 3, cooldown: Duration::from_secs(5) })
    }

    fn call(breakers: &Breakers, succeeded: bool, now: Instant) -> Result<(), Refused> {
        let ticket = breakers.admit(ORIGIN, None, now)?;
        ticket.report(succeeded, now);
        Ok(())
    }

    fn state(breakers: &Breakers) -> BreakerState {
        breakers.snapshot().first().map_or(BreakerState::Closed, |b| b.state)
    }

    #[test]
    fn opens_after_failures_in_a_row_and_a_probe_decides_after_the_cooldown() {
        let breakers = breakers();
        let t0 = Instant::now();
        // Two failures, a success, two failures: never three in a row.
        for succeeded in [false, false, true, false, false] {
            call(&breakers, succeeded, t0).expect("closed");
        }
        assert_eq!(state(&breakers), BreakerState::Closed);
        call(&breakers, false, t0).expect("the third failure in a row is still let through");
        assert_eq!(state(&breakers), BreakerState::Open);
        let refused = call(&breakers, true, t0 + Duration::from_secs(2)).expect_err("open");
        assert_eq!(refused.retry_after, Duration::from_secs(3));
        // After the cooldown one probe goes through; the others are refused while it runs.
        let later = t0 + Duration::from_secs(5);
        let probe = breakers.admit(ORIGIN, None, later).expect("the probe");
        assert_eq!(state(&breakers), BreakerState::HalfOpen);
        assert_eq!(
            breakers.admit(ORIGIN, None, later).err(),
            Some(Refused { retry_after: Duration::from_secs(1) })
        );
        probe.report(false, later);
        assert_eq!(state(&breakers), BreakerState::Open);
        let again = later + Duration::from_secs(5);
        let probe = breakers.admit(ORIGIN, None, again).expect("the next probe");
        probe.report(true, again);
        assert_eq!(state(&breakers), BreakerState::Closed);
        let [snapshot] = &breakers.snapshot()[..] else { panic!("one origin") };
        assert_eq!((snapshot.rejected, snapshot.opened), (2, 2));
    }

    #[test]
    fn outcomes_of_calls_let_through_in_an_earlier_state_do_not_count() {
        let breakers = breakers();
        let t0 = Instant::now();
        let early = breakers.admit(ORIGIN, None, t0).expect("closed");
        let late = breakers.admit(ORIGIN, None, t0).expect("closed");
        for _ in 0..3 {
            call(&breakers, false, t0).expect("closed");
        }
        assert_eq!(state(&breakers), BreakerState::Open);
        // Answered after the breaker opened: neither closes it nor restarts its cooldown.
        early.report(true, t0 + Duration::from_secs(1));
        late.report(false, t0 + Duration::from_secs(4));
        assert_eq!(state(&breakers), BreakerState::Open);
        assert!(call(&breakers, true, t0 + Duration::from_secs(5)).is_ok(), "the cooldown ended at 5 s");
        assert_eq!(state(&breakers), BreakerState::Closed);
    }

    #[test]
    fn a_cancelled_probe_lets_the_next_call_probe() {
        let breakers = breakers();
        let t0 = Instant::now();
        for _ in 0..3 {
            call(&breakers, false, t0).expect("closed");
        }
        let later = t0 + Duration::from_secs(6);
        drop(breakers.admit(ORIGIN, None, later).expect("the probe"));
        assert_eq!(state(&breakers), BreakerState::Open);
        let probe = breakers.admit(ORIGIN, None, Instant::now().max(later)).expect("another probe");
        probe.report(true, later);
        assert_eq!(state(&breakers), BreakerState::Closed);
    }

    #[test]
    fn zero_failures_turns_breakers_off() {
        let breakers = Breakers::new(BreakerSettings { failures: 0, cooldown: Duration::from_secs(5) });
        let t0 = Instant::now();
        for _ in 0..100 {
            call(&breakers, false, t0).expect("never refused");
        }
        assert!(breakers.snapshot().is_empty());
    }

    #[test]
    fn origins_have_breakers_of_their_own() {
        let breakers = breakers();
        let t0 = Instant::now();
        for _ in 0..3 {
            call(&breakers, false, t0).expect("closed");
        }
        let other = "http://127.0.0.1:10";
        let ticket = breakers.admit(other, None, t0).expect("another origin is not refused");
        ticket.report(true, t0);
        let states: Vec<_> = breakers.snapshot().into_iter().map(|b| (b.origin, b.state)).collect();
        assert_eq!(
            states,
            // By origin, as text.
            [(other.to_owned(), BreakerState::Closed), (ORIGIN.to_owned(), BreakerState::Open)]
        );
    }

    #[test]
    fn a_route_scoped_breaker_counts_its_route_alone() {
        let breakers = breakers();
        let t0 = Instant::now();
        let (noisy, quiet) = (uuid::Uuid::from_u128(1), uuid::Uuid::from_u128(2));
        // The callers of one route make its upstream fail three times in a row.
        for _ in 0..3 {
            breakers.admit(ORIGIN, Some(noisy), t0).expect("closed").report(false, t0);
        }
        assert!(breakers.admit(ORIGIN, Some(noisy), t0).is_err(), "its own breaker opened");
        // Neither the origin's breaker nor another route's saw those failures.
        breakers.admit(ORIGIN, None, t0).expect("the origin's breaker is closed").report(true, t0);
        breakers.admit(ORIGIN, Some(quiet), t0).expect("another route's is closed").report(true, t0);
        let states: Vec<_> = breakers.snapshot().into_iter().map(|b| (b.origin, b.route, b.state)).collect();
        assert_eq!(
            states,
            [
                (ORIGIN.to_owned(), None, BreakerState::Closed),
                (ORIGIN.to_owned(), Some(noisy), BreakerState::Open),
                (ORIGIN.to_owned(), Some(quiet), BreakerState::Closed),
            ]
        );
    }
}
