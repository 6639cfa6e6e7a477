//! `limit` (SPEC §2.4): at most `requests` calls per `perSeconds` seconds for each caller of a
//! route, told apart by `by` (an expression over `$caller`) or by `kind`, `issuer` and `id`.
//! Counted with GCRA (a theoretical arrival time per caller, `requests` at once after a quiet
//! spell); in a cluster each node counts its share of the limit, as upstream rate limits are
//! shared. Callers idle for a whole window are forgotten.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::caller::{Caller, Refusal};
use super::config::{LimitConfig, compile_by};
use crate::expr::{self, Program, Val};

/// A route's `limit`, compiled.
#[derive(Debug)]
pub struct CallerLimit {
    pub requests: u32,
    pub per_seconds: u32,
    by: Option<Program>,
    /// The route and the limit: a route updated with another limit counts anew.
    owner: [u8; 32],
}

/// The deepest `$caller` value `by` reads.
const MAX_DEPTH: usize = 64;
/// What evaluating `by` may build and do.
const BY_BYTES: usize = 64 * 1024;
const BY_STEPS: u64 = 100_000;

impl CallerLimit {
    pub fn compile(config: &LimitConfig, route: uuid::Uuid) -> Result<CallerLimit, String> {
        let by = match &config.by {
            Some(text) => Some(compile_by(text)?),
            None => None,
        };
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(route.as_bytes());
        context.update(&config.requests.to_be_bytes());
        context.update(&config.per_seconds.to_be_bytes());
        context.update(config.by.as_deref().unwrap_or("").as_bytes());
        let mut owner = [0; 32];
        owner.copy_from_slice(context.finish().as_ref());
        Ok(CallerLimit { requests: config.requests, per_seconds: config.per_seconds, by, owner })
    }

    /// The text that tells `caller` apart for this limit: `by`'s value when it is a string,
    /// number or boolean, else the caller's identity.
    fn caller_key(&self, caller: &Caller) -> Vec<u8> {
        let by = self.by.as_ref().and_then(|program| evaluate_by(program, caller));
        match by {
            Some(text) => [b"by:".as_slice(), text.as_bytes()].concat(),
            None => caller.identity.to_vec(),
        }
    }
}

/// `by`'s value for `caller`, as text, when it is a string, a number or a boolean.
fn evaluate_by(program: &Program, caller: &Caller) -> Option<String> {
    let mut null = b"null".to_vec();
    crate::json::with_parsed(&mut null, MAX_DEPTH, |doc| {
        let bump = bumpalo::Bump::new();
        let budget = expr::Budget::new(BY_BYTES, BY_STEPS);
        let arena = expr::Arena::new(&bump, &budget);
        let nodes: &[simd_json::Node<'_>] = doc;
        let bound = [Val::from_const(caller.constant())];
        match expr::evaluate_bound(program, nodes, Val::from_tape(nodes, 0), &arena, &bound).ok()? {
            Val::String(text) => Some(format!("s{text}")),
            Val::Number(n) => Some(format!("n{}", n.as_f64())),
            Val::Bool(b) => Some(format!("b{b}")),
            _ => None,
        }
    })
    .ok()
    .flatten()
}

/// Every caller's count, by route limit and caller.
pub struct Limits {
    /// Theoretical arrival times, in nanoseconds since `start`.
    tats: DashMap<[u8; 32], AtomicU64, std::hash::BuildHasherDefault<super::consumers::DigestHasher>>,
    start: Instant,
    /// Entries at the last sweep: the next comes when there are twice as many.
    swept_at: AtomicU64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { tats: DashMap::default(), start: Instant::now(), swept_at: AtomicU64::new(1024) }
    }
}

impl Limits {
    /// Takes a call of `caller` under `limit`, when `nodes` nodes share it; or how long until
    /// one is free.
    pub fn take(&self, limit: &CallerLimit, caller: &Caller, nodes: u32) -> Result<(), Refusal> {
        let share = (limit.requests / nodes.max(1)).max(1);
        let window = Duration::from_secs(u64::from(limit.per_seconds)).as_nanos() as u64;
        let emission = window / u64::from(share);
        let tolerance = emission * u64::from(share - 1);
        use sha2::Digest as _;
        let mut context = sha2::Sha256::new();
        context.update(limit.owner);
        context.update(nodes.to_be_bytes());
        context.update(limit.caller_key(caller));
        let mut key = [0; 32];
        key.copy_from_slice(context.finalize().as_slice());
        let now = self.start.elapsed().as_nanos() as u64;
        let entry = self.tats.entry(key).or_insert_with(|| AtomicU64::new(0));
        let tat = &*entry;
        let mut current = tat.load(Ordering::Acquire);
        loop {
            let at = current.max(now);
            if at - now > tolerance {
                let retry_after = Duration::from_nanos(at - now - tolerance);
                return Err(Refusal::Limited {
                    retry_after,
                    requests: limit.requests,
                    per_seconds: limit.per_seconds,
                });
            }
            match tat.compare_exchange_weak(current, at + emission, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        drop(entry);
        self.sweep(now);
        Ok(())
    }

    /// Forgets callers whose count is back to a full burst, once the map doubled since the
    /// last sweep.
    fn sweep(&self, now: u64) {
        let len = self.tats.len() as u64;
        if len < 2 * self.swept_at.load(Ordering::Relaxed) {
            return;
        }
        self.tats.retain(|_, tat| tat.load(Ordering::Relaxed) > now);
        self.swept_at.store((self.tats.len() as u64).max(1024), Ordering::Relaxed);
    }

    /// How many callers are counted now.
    pub fn len(&self) -> usize {
        self.tats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tats.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callers::CallerKind;

    fn caller(id: &str, tenant: &str) -> Caller {
        Caller::new(
            CallerKind::Jwt,
            id.into(),
            Some("https://id/".into()),
            None,
            None,
            Some(serde_json::json!({"tenant": tenant})),
        )
    }

    #[test]
    fn each_caller_gets_the_limit_and_no_more() {
        let limit =
            CallerLimit::compile(&LimitConfig { requests: 3, per_seconds: 60, by: None }, uuid::Uuid::nil())
                .unwrap();
        let limits = Limits::default();
        let (a, b) = (caller("a", "t"), caller("b", "t"));
        for _ in 0..3 {
            limits.take(&limit, &a, 1).unwrap();
        }
        match limits.take(&limit, &a, 1) {
            Err(Refusal::Limited { retry_after, requests: 3, per_seconds: 60 }) => {
                assert!(
                    retry_after > Duration::from_secs(15) && retry_after <= Duration::from_secs(20),
                    "{retry_after:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        limits.take(&limit, &b, 1).unwrap();
        // A node of three counts a third of the limit.
        let c = caller("c", "t");
        limits.take(&limit, &c, 3).unwrap();
        assert!(limits.take(&limit, &c, 3).is_err());
    }

    #[test]
    fn by_groups_callers_and_a_value_that_is_not_text_falls_back_to_the_caller() {
        let config = LimitConfig { requests: 2, per_seconds: 60, by: Some("$caller.claims.tenant".into()) };
        let limit = CallerLimit::compile(&config, uuid::Uuid::nil()).unwrap();
        let limits = Limits::default();
        limits.take(&limit, &caller("a", "acme"), 1).unwrap();
        limits.take(&limit, &caller("b", "acme"), 1).unwrap();
        assert!(limits.take(&limit, &caller("c", "acme"), 1).is_err());
        limits.take(&limit, &caller("d", "other"), 1).unwrap();
        assert!(
            CallerLimit::compile(&LimitConfig { by: Some("$nobody".into()), ..config }, uuid::Uuid::nil())
                .is_err()
        );
    }
}
