//! Fetching a token: the one request of a credential set's fetch, run in a task of its own
//! through the single flight, and the reading of a token endpoint's answer (RFC 6749 §5).

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use http::StatusCode;
use http::header::HeaderValue;
use serde::Deserialize;
use tokio::time::Instant;
use tracing::Level;

use super::{Bearer, FAILURE_HOLD, Fetched, HeldToken, MAX_LIFETIME, MAX_TOKEN, Slot, TokenRequest};
use crate::flight;
use crate::logging::logged;
use crate::metrics::FetchReason;
use crate::upstream::error::{AuthFailure, UpstreamError};
use crate::upstream::{Target, UpstreamClient};

impl UpstreamClient {
    /// The token to send for the credential set of `token`: the one held, unless it ran out or
    /// is `rejected`; else the outcome of the fetch under way, or of one started now. A call
    /// waits for a fetch up to its own `deadline`; the fetch itself runs on its own, with the
    /// whole `RECAST_UPSTREAM_TIMEOUT_MS`, whoever waits for it.
    pub(in crate::upstream) async fn bearer(
        &self,
        token: &Arc<TokenRequest>,
        deadline: Instant,
        rejected: Option<u64>,
    ) -> Result<Bearer, UpstreamError> {
        let slot = self.tokens.slot(token);
        let now = Instant::now();
        if let Some(held) = slot.usable(now, rejected) {
            if now >= held.renew_at
                && let flight::Joined::Leader(leader) = slot.fetches.join(&())
            {
                self.launch(&slot, leader, token, FetchReason::Renewal);
            }
            return Ok(held.bearer());
        }
        let late = || {
            UpstreamError::Auth(AuthFailure::Unreachable("the token endpoint did not answer in time".into()))
        };
        loop {
            let waiter = match slot.fetches.join(&()) {
                flight::Joined::Waiter(waiter) => waiter,
                flight::Joined::Leader(leader) => {
                    // Looked at again now that no fetch is under way: one may have ended since
                    // (it keeps its token or its failure before it lets its flight go). The
                    // calls that joined meanwhile take the same.
                    if let Some(held) = slot.usable(Instant::now(), rejected) {
                        let bearer = held.bearer();
                        leader.share(Ok(held));
                        return Ok(bearer);
                    }
                    if let Some(failure) = slot.recent_failure() {
                        leader.share(Err(failure.clone()));
                        return Err(UpstreamError::Auth(failure));
                    }
                    let waiter = leader.waiter();
                    let reason = if rejected.is_some() { FetchReason::Rejected } else { FetchReason::New };
                    self.launch(&slot, leader, token, reason);
                    waiter
                }
            };
            // The token fetched is taken even when its life is already over (an `expires_in`
            // shorter than the fetch took): it is the newest there is. One this call's upstream
            // rejected, or no outcome at all, and it looks again while it has time.
            match waiter.wait(deadline).await.map_err(|_| late())? {
                Some(Ok(held)) if Some(held.serial) != rejected => return Ok(held.bearer()),
                Some(Err(failure)) => return Err(UpstreamError::Auth(failure)),
                Some(Ok(_)) | None if Instant::now() < deadline => tokio::task::yield_now().await,
                Some(Ok(_)) | None => return Err(late()),
            }
        }
    }

    /// Makes the fetch that `leader` leads for `slot`, in a task of its own (`bearer` waits for
    /// its outcome up to its own deadline; the fetch takes the whole upstream timeout, whoever
    /// waits). A renewal that fails is tried again a second later, while the token held is
    /// still sent.
    fn launch(
        &self,
        slot: &Arc<Slot>,
        leader: flight::Leader<(), Fetched>,
        token: &Arc<TokenRequest>,
        reason: FetchReason,
    ) {
        let (client, slot, token) = (self.clone(), slot.clone(), token.clone());
        // The fetch's span is a child of the call that started it.
        let scope = crate::telemetry::current();
        // A panic drops the leader, which hands its waiters nothing and lets the next call fetch.
        self.spawner.spawn(crate::telemetry::maybe_within(scope, async move {
            let deadline = Instant::now() + client.settings.total_timeout;
            let fetched = client.fetch(&slot, &token, reason, deadline).await;
            {
                let mut last_failure = slot.last_failure.lock().unwrap_or_else(PoisonError::into_inner);
                match &fetched {
                    Ok(_) => *last_failure = None,
                    Err(failure) => {
                        let now = Instant::now();
                        *last_failure = Some((now, failure.clone()));
                        if let Some(held) = slot.held.write().unwrap_or_else(PoisonError::into_inner).as_mut()
                        {
                            held.renew_at = held.renew_at.max(now + FAILURE_HOLD).min(held.use_until);
                        }
                    }
                }
            }
            leader.share(fetched);
        }));
    }

    /// Asks the token endpoint for a token and keeps it.
    async fn fetch(
        &self,
        slot: &Slot,
        token: &TokenRequest,
        reason: FetchReason,
        deadline: Instant,
    ) -> Fetched {
        let sent = Instant::now();
        let target = Target {
            request: &token.request,
            origin: &token.origin,
            tls: None,
            breaker: None,
            h2c: false,
            waited_for_failure: Default::default(),
            source: None,
            token: true,
            keep_headers: false,
        };
        let answer = self.attempt(&target, None, sent, deadline, 0).await;
        let outcome = match answer {
            Ok(answer) => read_token(answer.status, &answer.body),
            Err(error) => Err(AuthFailure::of(error)),
        };
        slot.fetched[reason as usize][usize::from(outcome.is_err())].fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok((value, expires_in)) => {
                let new = {
                    let mut held = slot.held.write().unwrap_or_else(PoisonError::into_inner);
                    let serial = held.as_ref().map_or(1, |h| h.serial + 1);
                    let new = HeldToken::new(value, serial, sent, expires_in);
                    *held = Some(new.clone());
                    new
                };
                logged!(Level::DEBUG, token_endpoint = %token.origin, reason = reason.label(), expires_in_s = expires_in.map(|d| d.as_secs()), "fetched an access token");
                Ok(new)
            }
            Err(failure) => {
                logged!(Level::WARN, token_endpoint = %token.origin, reason = reason.label(), %failure, "no access token");
                Err(failure)
            }
        }
    }
}

/// The longest `error` code taken from a token endpoint's answer.
pub(super) const MAX_ERROR_CODE: usize = 64;

/// The `Authorization` value and lifetime of a token endpoint's answer (RFC 6749 §5.1), or why
/// there is none (§5.2). Nothing of the body is kept but the token, its lifetime and an `error`
/// code made of the characters RFC 6749 allows.
pub(super) fn read_token(
    status: StatusCode,
    body: &[u8],
) -> Result<(HeaderValue, Option<Duration>), AuthFailure> {
    #[derive(Deserialize)]
    struct Answer {
        access_token: Option<serde_json::Value>,
        token_type: Option<serde_json::Value>,
        expires_in: Option<serde_json::Value>,
        error: Option<serde_json::Value>,
    }
    let answer: Option<Answer> = serde_json::from_slice(body).ok();
    if !status.is_success() {
        let error = answer.and_then(|a| a.error).and_then(|e| e.as_str().map(str::to_owned)).filter(|code| {
            // RFC 6749 §5.2: %x20-21 / %x23-5B / %x5D-7E.
            !code.is_empty()
                && code.len() <= MAX_ERROR_CODE
                && code.bytes().all(|b| matches!(b, 0x20..=0x21 | 0x23..=0x5B | 0x5D..=0x7E))
        });
        return Err(AuthFailure::Refused { status, error });
    }
    let answer = answer.ok_or(AuthFailure::Unusable("the answer is not a JSON object"))?;
    let Some(serde_json::Value::String(token)) = answer.access_token else {
        return Err(AuthFailure::Unusable("it has no `access_token` string"));
    };
    match &answer.token_type {
        // RFC 6749 says it is required; a server that leaves it out issues Bearer tokens.
        None => {}
        Some(serde_json::Value::String(kind)) if kind.eq_ignore_ascii_case("bearer") => {}
        Some(_) => {
            return Err(AuthFailure::Unusable("its `token_type` is not Bearer, the only type recast sends"));
        }
    }
    // RFC 6750's token characters are a subset of these; anything else cannot be a header value.
    if token.len() > MAX_TOKEN {
        return Err(AuthFailure::Unusable("its `access_token` is longer than 16 KiB"));
    }
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AuthFailure::Unusable("its `access_token` is empty or holds characters a token cannot"));
    }
    let mut value = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| AuthFailure::Unusable("its `access_token` cannot be sent in a header"))?;
    value.set_sensitive(true);
    let expires_in = match answer.expires_in {
        Some(serde_json::Value::Number(n)) => n.as_f64(),
        // Some servers send it as a string.
        Some(serde_json::Value::String(text)) => text.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
    .map(|seconds| Duration::from_secs_f64(seconds.min(MAX_LIFETIME.as_secs_f64())));
    Ok((value, expires_in))
}
