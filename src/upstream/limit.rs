//! Outbound rate limits (`"rateLimit"` in a registration; `docs/upstreams.md`): the quota an
//! upstream grants, kept per route or per upstream origin with the GCRA limiter of `governor`.
//! A call over the limit waits up to the route's `maxWaitMs` for its slot, within the call's
//! deadline, and is otherwise answered 429 without an outbound call.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};

use super::per_key::PerKey;
use crate::metrics::LimiterCounts;

/// The largest `requestsPerSecond` and `burst` a route may give.
pub const MAX_RATE: f64 = 1_000_000.0;
pub const MAX_BURST: u32 = 1_000_000;
/// The longest `maxWaitMs`.
pub const MAX_WAIT_MS: u64 = 60_000;

/// A route's `rateLimit` member, checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitSettings {
    /// Calls per second let through on average (may be below 1).
    pub requests_per_second: f64,
    /// Calls let through at once after a quiet spell.
    pub burst: u32,
    pub scope: LimitScope,
    /// How long a call over the limit may wait for its slot, in milliseconds.
    pub max_wait_ms: u64,
}

/// Whose calls share the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitScope {
    /// This route's calls.
    Route,
    /// The calls of every route to the same origin (scheme, host and port) with the same limit.
    Origin,
}

impl RateLimitSettings {
    /// The GCRA quota: one call every `1 / requestsPerSecond` seconds, `burst` at once; `None`
    /// when the two do not make one ([`RateLimitSettings::fits`]).
    fn quota(&self) -> Option<Quota> {
        if !self.fits() {
            return None;
        }
        let period = Duration::try_from_secs_f64(1.0 / self.requests_per_second).ok()?;
        Some(Quota::with_period(period)?.allow_burst(NonZeroU32::new(self.burst)?))
    }

    /// Whether the rate and the burst make a quota the limiter can hold: the time a whole burst
    /// takes to come back (the period times the burst, in nanoseconds) must fit in 64 bits, with
    /// room to spare (a rate of one a day allows bursts of about 200,000).
    pub fn fits(&self) -> bool {
        let rate = self.requests_per_second;
        rate.is_finite() && rate > 0.0 && 1e9 / rate * f64::from(self.burst) < 1.8e19
    }

    /// The key of the limiter a call shares: its route's or its origin's, and the limit itself,
    /// so that a route updated with another limit starts a limiter of its own.
    pub fn key(&self, route: &str, origin: &str) -> String {
        let owner = match self.scope {
            LimitScope::Route => format!("route:{route}"),
            LimitScope::Origin => format!("origin:{origin}"),
        };
        format!("{owner} {} {}", self.requests_per_second, self.burst)
    }

    /// This node's share of the limit when `nodes` nodes are alive: the rate divided by them, and
    /// the burst too (at least one call); the whole limit on a node alone.
    pub fn share(&self, nodes: u32) -> RateLimitSettings {
        let nodes = nodes.max(1);
        RateLimitSettings {
            requests_per_second: self.requests_per_second / f64::from(nodes),
            burst: (self.burst / nodes).max(1),
            ..self.clone()
        }
    }
}

/// Every limiter called so far, by key.
#[derive(Default)]
pub struct Limiters {
    limiters: PerKey<String, Limiter>,
}

struct Limiter {
    gate: DefaultDirectRateLimiter,
    /// How long its whole burst takes to come back: unused that long, it is full again.
    refill: Duration,
    /// `route:<uuid>` or `origin:<scheme://host:port>`, for `/metrics`.
    label: String,
    refused: AtomicU64,
}

impl Limiters {
    fn limiter(&self, key: &str, settings: &RateLimitSettings) -> Option<Arc<Limiter>> {
        let quota = settings.quota()?;
        Some(self.limiters.get_or(key, || {
            Limiter {
                gate: RateLimiter::direct(quota),
                refill: Duration::from_secs_f64(f64::from(settings.burst) / settings.requests_per_second)
                    .min(Duration::from_secs(u64::from(u32::MAX))),
                label: key.split(' ').next().unwrap_or_default().to_owned(),
                refused: AtomicU64::new(0),
            }
        }))
    }

    /// Lets go of the limiters nobody used for a while whose whole burst has come back (one
    /// sweep of those made `every` so long): one made anew is full, as they are.
    pub fn sweep(&self, every: Duration) {
        self.limiters.sweep(every, |limiter, unused_for| unused_for >= limiter.refill);
    }

    /// How many limiters are kept.
    pub fn len(&self) -> usize {
        self.limiters.len()
    }

    /// Takes a slot of the limiter `key`, waiting for it up to `wait` (an attempt that is not the
    /// first waits for none). Answers how long until a slot is free when none is within `wait`
    /// (counted as refused).
    pub async fn take(
        &self,
        key: &str,
        settings: &RateLimitSettings,
        wait: Duration,
    ) -> Result<(), Duration> {
        // A limit that cannot be a quota was refused at registration; nothing to keep.
        let Some(limiter) = self.limiter(key, settings) else { return Ok(()) };
        let clock = DefaultClock::default();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let Err(not_until) = limiter.gate.check() else { return Ok(()) };
            let free_in = not_until.wait_time_from(clock.now());
            if free_in > deadline.saturating_duration_since(tokio::time::Instant::now()) {
                limiter.refused.fetch_add(1, Ordering::Relaxed);
                return Err(free_in);
            }
            // Others may take the slot meanwhile: check again when it should be free.
            tokio::time::sleep(free_in).await;
        }
    }

    /// Every limiter's refusals, by label (limiters of one route or origin added up).
    pub fn snapshot(&self) -> Vec<LimiterCounts> {
        let mut all: Vec<LimiterCounts> = Vec::new();
        // By key, so the limiters of one label (its limits over time) come together.
        for (label, refused) in
            self.limiters.each(|_, l| (l.label.clone(), l.refused.load(Ordering::Relaxed)))
        {
            match all.last_mut() {
                Some(last) if last.limit == label => last.refused += refused,
                _ => all.push(LimiterCounts { limit: label, refused }),
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(rate: f64, burst: u32, scope: LimitScope) -> RateLimitSettings {
        RateLimitSettings { requests_per_second: rate, burst, scope, max_wait_ms: 0 }
    }

    #[tokio::test]
    async fn a_burst_goes_at_once_and_the_rest_waits_or_is_refused() {
        let limiters = Limiters::default();
        let limit = settings(10.0, 3, LimitScope::Route);
        let key = limit.key("r1", "http://127.0.0.1:9");
        for _ in 0..3 {
            assert_eq!(limiters.take(&key, &limit, Duration::ZERO).await, Ok(()));
        }
        let refused = limiters.take(&key, &limit, Duration::ZERO).await.expect_err("over the burst");
        assert!(refused <= Duration::from_millis(100), "{refused:?}");
        // Waiting up to 150 ms finds the next slot (one every 100 ms).
        let started = std::time::Instant::now();
        assert_eq!(limiters.take(&key, &limit, Duration::from_millis(150)).await, Ok(()));
        assert!(started.elapsed() <= Duration::from_millis(140), "{:?}", started.elapsed());
        assert_eq!(limiters.snapshot(), [LimiterCounts { limit: "route:r1".to_owned(), refused: 1 }]);
    }

    #[test]
    fn routes_share_an_origin_limit_and_keep_their_own() {
        let origin = settings(5.0, 1, LimitScope::Origin);
        let route = settings(5.0, 1, LimitScope::Route);
        assert_eq!(origin.key("r1", "http://a:80"), origin.key("r2", "http://a:80"));
        assert_ne!(route.key("r1", "http://a:80"), route.key("r2", "http://a:80"));
        assert_ne!(
            origin.key("r1", "http://a:80"),
            settings(6.0, 1, LimitScope::Origin).key("r1", "http://a:80")
        );
        assert!(settings(0.5, 1, LimitScope::Route).quota().is_some(), "below one a second");
        // A day's period times a million overflows the limiter's nanoseconds: refused.
        assert!(!settings(1.0 / 86_400.0, 1_000_000, LimitScope::Route).fits());
        assert!(settings(1.0 / 86_400.0, 200_000, LimitScope::Route).fits());
        assert!(settings(MAX_RATE, MAX_BURST, LimitScope::Route).fits());
    }
}
