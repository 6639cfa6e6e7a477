//! Retries a route opts into (`"retry"` in its registration; `docs/upstreams.md`): which failures
//! are sent again, how long to wait before each, and the budget per upstream origin that keeps
//! retries from multiplying an outage.
//!
//! A retry is sent only while the call's deadline (`RECAST_UPSTREAM_TIMEOUT_MS`, the budget of
//! the whole call) leaves room for its wait; the wait is exponential with full jitter, or what
//! a 429 or 503 answer's `Retry-After` asks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::per_key::PerKey;
use super::{Answer, UpstreamError};
use crate::metrics::OriginRetries;

/// The most retries a route may ask for.
pub const MAX_ATTEMPTS: u8 = 5;

/// A route's `retry` member, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetrySettings {
    /// How many times a failed call may be sent again, 1 to [`MAX_ATTEMPTS`].
    pub attempts: u8,
    /// What is retried.
    pub on: Vec<RetryOn>,
    /// Whether a method that is not idempotent (POST, PATCH) may be sent again.
    #[serde(rename = "unsafe", default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unsafe: bool,
}

/// One thing a route retries: an answer's status (429 or 5xx), or a failure without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RetryOn {
    Status(u16),
    Failure(Failure),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Failure {
    /// The call's attempt took longer than the deadline left for it.
    Timeout,
    /// No connection could be made, or it broke before the whole answer came.
    Reset,
}

impl RetrySettings {
    /// When attempt `retry` (0 for the first), begun at `now`, must be over. A route that
    /// retries timeouts gives each attempt left an equal share of the time left before the
    /// call's `deadline`, so that a slow attempt leaves room for the next; any other gives the
    /// attempt all of it.
    pub fn attempt_deadline(
        &self,
        retry: u8,
        now: tokio::time::Instant,
        deadline: tokio::time::Instant,
    ) -> tokio::time::Instant {
        if !self.on.contains(&RetryOn::Failure(Failure::Timeout)) {
            return deadline;
        }
        let left = u32::from(self.attempts.saturating_sub(retry)) + 1;
        now + deadline.saturating_duration_since(now) / left
    }

    /// Whether this outcome of an attempt is one the route retries.
    pub fn covers(&self, outcome: &Result<Answer, UpstreamError>) -> bool {
        let wanted = match outcome {
            Ok(answer) => RetryOn::Status(answer.status.as_u16()),
            Err(UpstreamError::Timeout) => RetryOn::Failure(Failure::Timeout),
            Err(UpstreamError::Connect(_) | UpstreamError::Broken(_)) => RetryOn::Failure(Failure::Reset),
            Err(_) => return false,
        };
        self.on.contains(&wanted)
    }
}

/// Statuses a route may retry on: 429 and every 5xx.
pub fn retriable_status(status: u16) -> bool {
    status == 429 || (500..=599).contains(&status)
}

/// The first wait; each retry doubles the ceiling of the next, up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long to wait before retry number `retry` (0 for the first) after `outcome`: a 429 or 503
/// answer's `Retry-After` when it has one, else a random time up to 100 ms × 2^retry (at most
/// 2 s): "full jitter", so that callers that failed together do not come back together.
pub fn wait_before(retry: u8, outcome: &Result<Answer, UpstreamError>) -> Duration {
    if let Ok(answer) = outcome
        && matches!(answer.status.as_u16(), 429 | 503)
        && let Some(asked) = answer.retry_after
    {
        return asked;
    }
    let ceiling = BASE_BACKOFF.saturating_mul(1 << retry.min(10)).min(MAX_BACKOFF);
    let mut bytes = [0u8; 8];
    let random = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map(|()| u64::from_le_bytes(bytes))
        .unwrap_or(0);
    Duration::from_nanos(random % (ceiling.as_nanos() as u64 + 1))
}

/// Retries in hand when an origin is first called, and the most it keeps.
const RESERVE: f64 = 10.0;
/// What each call of a route with retries adds to its origin's budget: retries stay within 20%
/// of the calls, beyond the reserve.
const PER_CALL: f64 = 0.2;

/// The retry budget and retry counts of every upstream origin called with retries.
#[derive(Default)]
pub struct Budgets {
    origins: PerKey<String, Budget>,
}

struct Budget {
    balance: Mutex<f64>,
    retries: AtomicU64,
    refused: AtomicU64,
}

impl Budgets {
    /// Lets go of the budgets of the origins no call went to for a while (one sweep of those
    /// made `every` so long): a budget made anew has its whole reserve, as one of an origin
    /// called rarely would have anyway.
    pub fn sweep(&self, every: Duration) {
        self.origins.sweep(every, |_, _| true);
    }

    /// How many origins' budgets are kept.
    pub fn len(&self) -> usize {
        self.origins.len()
    }

    fn budget(&self, origin: &str) -> Arc<Budget> {
        self.origins.get_or(origin, || Budget {
            balance: Mutex::new(RESERVE),
            retries: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// A call that may be retried goes to `origin`.
    pub fn called(&self, origin: &str) {
        let budget = self.budget(origin);
        let mut balance = budget.balance.lock().unwrap_or_else(PoisonError::into_inner);
        *balance = (*balance + PER_CALL).min(RESERVE);
    }

    /// Takes one retry from `origin`'s budget; `false` (counted) when none is left. A retry
    /// taken is counted as sent by [`Budgets::sent`], or given back by [`Budgets::give_back`].
    pub fn take(&self, origin: &str) -> bool {
        let budget = self.budget(origin);
        let mut balance = budget.balance.lock().unwrap_or_else(PoisonError::into_inner);
        if *balance >= 1.0 {
            *balance -= 1.0;
            true
        } else {
            drop(balance);
            budget.refused.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// A retry taken from `origin`'s budget was sent.
    pub fn sent(&self, origin: &str) {
        self.budget(origin).retries.fetch_add(1, Ordering::Relaxed);
    }

    /// A retry taken from `origin`'s budget was not sent after all (no slot of the route's rate
    /// limit was free): it goes back.
    pub fn give_back(&self, origin: &str) {
        let budget = self.budget(origin);
        let mut balance = budget.balance.lock().unwrap_or_else(PoisonError::into_inner);
        *balance = (*balance + 1.0).min(RESERVE);
    }

    /// Every origin's retries, by origin.
    pub fn snapshot(&self) -> Vec<OriginRetries> {
        self.origins.each(|origin, budget| OriginRetries {
            origin: origin.to_owned(),
            retries: budget.retries.load(Ordering::Relaxed),
            over_budget: budget.refused.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::upstream::Freshness;

    fn answer(status: u16, retry_after: Option<u64>) -> Result<Answer, UpstreamError> {
        Ok(Answer {
            status: StatusCode::from_u16(status).unwrap(),
            body: Vec::new(),
            freshness: Freshness::default(),
            retry_after: retry_after.map(Duration::from_secs),
            certificate_asked: None,
            content_type: Default::default(),
            http2: false,
            headers: None,
            span: None,
        })
    }

    #[test]
    fn a_route_retries_what_it_names_only() {
        let settings = RetrySettings {
            attempts: 2,
            on: vec![RetryOn::Status(503), RetryOn::Failure(Failure::Timeout)],
            allow_unsafe: false,
        };
        assert!(settings.covers(&answer(503, None)));
        assert!(!settings.covers(&answer(502, None)));
        assert!(!settings.covers(&answer(200, None)));
        assert!(settings.covers(&Err(UpstreamError::Timeout)));
        assert!(!settings.covers(&Err(UpstreamError::Broken("reset".into()))));
        let reset = RetrySettings { on: vec![RetryOn::Failure(Failure::Reset)], ..settings };
        assert!(reset.covers(&Err(UpstreamError::Broken("reset".into()))));
        assert!(reset.covers(&Err(UpstreamError::Connect("refused".into()))));
        assert!(!reset.covers(&Err(UpstreamError::Unavailable { retry_after: Duration::ZERO })));
        assert!(!reset.covers(&Err(UpstreamError::TooLarge { limit: 1 })));
    }

    #[test]
    fn attempts_share_the_time_left_when_timeouts_are_retried() {
        let now = tokio::time::Instant::now();
        let deadline = now + Duration::from_secs(3);
        let timeouts =
            RetrySettings { attempts: 2, on: vec![RetryOn::Failure(Failure::Timeout)], allow_unsafe: false };
        assert_eq!(timeouts.attempt_deadline(0, now, deadline), now + Duration::from_secs(1));
        let later = now + Duration::from_secs(1);
        assert_eq!(timeouts.attempt_deadline(1, later, deadline), later + Duration::from_secs(1));
        assert_eq!(timeouts.attempt_deadline(2, later, deadline), deadline, "the last has the rest");
        let statuses = RetrySettings { on: vec![RetryOn::Status(503)], ..timeouts };
        assert_eq!(statuses.attempt_deadline(0, now, deadline), deadline);
    }

    #[test]
    fn waits_are_jittered_below_a_doubling_ceiling_or_what_retry_after_asks() {
        for retry in 0..8u8 {
            let ceiling = (BASE_BACKOFF * (1 << retry)).min(MAX_BACKOFF);
            let waits: Vec<Duration> = (0..50).map(|_| wait_before(retry, &answer(502, Some(7)))).collect();
            assert!(waits.iter().all(|w| *w <= ceiling), "{retry}: {waits:?}");
            assert!(waits.iter().any(|w| *w != waits[0]), "jittered");
        }
        assert_eq!(wait_before(0, &answer(503, Some(3))), Duration::from_secs(3));
        assert_eq!(wait_before(4, &answer(429, Some(0))), Duration::ZERO);
        assert!(wait_before(0, &answer(503, None)) <= BASE_BACKOFF);
    }

    #[test]
    fn the_budget_lets_a_fifth_of_the_calls_be_retried_beyond_its_reserve() {
        let budgets = Budgets::default();
        let origin = "http://127.0.0.1:9";
        let mut sent = 0;
        for _ in 0..1000 {
            budgets.called(origin);
            if budgets.take(origin) {
                budgets.sent(origin);
                sent += 1;
            }
        }
        // Every call failing, each wants a retry: the reserve, then one per five calls.
        assert!((200..=211).contains(&sent), "{sent}");
        let [snapshot] = &budgets.snapshot()[..] else { panic!("one origin") };
        assert_eq!(snapshot.retries as usize, sent);
        assert_eq!(snapshot.over_budget as usize, 1000 - sent);
    }
}
