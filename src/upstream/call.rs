//! A call of the upstream client from start to end: the route's rate limit, its retries within
//! the origin's retry budget, the OAuth2 token and its one resend after a 401, and each attempt's
//! ticket of the origin's (or the route's own) breaker.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use tokio::time::Instant;
use tracing::Level;

use super::{
    Answer, Extra, Outbound, RateLimitSettings, Target, TokenRequest, UpstreamClient, UpstreamError,
    UpstreamRequest, origin, retry, traced,
};
use crate::logging::logged;

impl UpstreamClient {
    /// Sends `request` and reads the answer, all within the total deadline, unless the breaker of
    /// the request's origin is open.
    pub async fn call(&self, request: UpstreamRequest) -> Result<Answer, UpstreamError> {
        self.call_with(&request, &Outbound::default()).await
    }

    /// [`UpstreamClient::call`] under a route's rate limit, with its OAuth2 token, sending the
    /// request again as its `retry` says: the deadline is the whole call's, waits for a slot,
    /// token fetches, retries and their waits included; each retry is taken from the budget of
    /// the request's origin, and needs a slot of the rate limit free at once.
    pub async fn call_with(
        &self,
        request: &UpstreamRequest,
        outbound: &Outbound<'_>,
    ) -> Result<Answer, UpstreamError> {
        // One reading of the clock: the deadline, and the time the pool counts idleness from.
        let started = Instant::now();
        let deadline = outbound.deadline.map_or(started + self.settings.total_timeout, |given| {
            given.min(started + self.settings.total_timeout)
        });
        let origin = origin(&request.uri);
        // In a cluster, this node's share of the limit, kept apart from the shares of other counts.
        let limit = outbound.rate_limit.map(|(settings, route)| match self.nodes() {
            1 => (Cow::Borrowed(settings), settings.key(&route.to_string(), &origin)),
            nodes => {
                let key = format!("{} /{nodes}", settings.key(&route.to_string(), &origin));
                (Cow::Owned(settings.share(nodes)), key)
            }
        });
        let target = Target {
            request,
            origin: &origin,
            tls: outbound.tls,
            breaker: outbound.breaker,
            h2c: outbound.h2c && self.settings.http2,
            waited_for_failure: AtomicBool::new(false),
            source: outbound.source,
            token: false,
            keep_headers: outbound.keep_headers,
        };
        if let Some((settings, key)) = &limit {
            // A slot found in the last quarter of the call's time would leave the attempt too
            // little of it (and its timeout would count against a healthy upstream's breaker).
            let wait = Duration::from_millis(settings.max_wait_ms).min(
                deadline.saturating_duration_since(started).saturating_sub(self.settings.total_timeout / 4),
            );
            if let Err(free_in) = self.limiters.take(key, settings, wait).await {
                // Nothing was sent; the refusal is the attempt's span all the same.
                let mut refused = Err(UpstreamError::RateLimited { retry_after: free_in });
                traced::Attempt::begin(self, &target, 0).end(&mut refused);
                return refused;
            }
        }
        let retry = outbound.retry;
        if retry.is_some() {
            self.budgets.called(&origin);
        }
        // A wait for a slot of the limit is not part of the first attempt's time.
        let (mut now, mut retries) = (if limit.is_some() { Instant::now() } else { started }, 0);
        let limit_key = limit.as_ref().map(|(settings, key)| (&**settings, key.as_str()));
        // Whether this call has fetched a new token after a 401 (once at most).
        let mut renewed = false;
        // Attempts made so far: each attempt's span says how many came before it.
        let mut sent = 0;
        loop {
            let until = retry.map_or(deadline, |settings| settings.attempt_deadline(retries, now, deadline));
            let outcome = match outbound.oauth {
                None => {
                    sent += 1;
                    self.attempt(&target, None, now, until, sent - 1).await
                }
                Some(token) => {
                    self.authorized(&target, token, until, limit_key, &mut renewed, &mut sent).await
                }
            };
            let Some(settings) = retry.filter(|s| retries < s.attempts && s.covers(&outcome)) else {
                return outcome;
            };
            let wait = retry::wait_before(retries, &outcome);
            if wait >= deadline.saturating_duration_since(Instant::now()) || !self.budgets.take(&origin) {
                return outcome;
            }
            logged!(Level::DEBUG, upstream = %origin, retry = retries + 1, of = settings.attempts, wait_ms = wait.as_millis() as u64, "retrying the upstream call");
            tokio::time::sleep(wait).await;
            // A retry is a call the upstream counts: it needs a slot of the limit, free now.
            if let Some((limit, key)) = &limit
                && self.limiters.take(key, limit, Duration::ZERO).await.is_err()
            {
                self.budgets.give_back(&origin);
                return outcome;
            }
            self.budgets.sent(&origin);
            now = Instant::now();
            retries += 1;
        }
    }

    /// An attempt with the route's OAuth2 token, within `deadline`. A 401 answer to it makes the
    /// call fetch a new token and send once more (with a slot of the rate limit free at once),
    /// unless the call did so already.
    pub(super) async fn authorized(
        &self,
        target: &Target<'_>,
        token: &Arc<TokenRequest>,
        deadline: Instant,
        limit: Option<(&RateLimitSettings, &str)>,
        renewed: &mut bool,
        sent: &mut u32,
    ) -> Result<Answer, UpstreamError> {
        let bearer = match self.bearer(token, deadline, None).await {
            Ok(bearer) => bearer,
            Err(error) => {
                // No token, nothing sent: the attempt's span says so (`auth_failed`).
                let mut failed = Err(error);
                traced::Attempt::begin(self, target, *sent).end(&mut failed);
                *sent += 1;
                return failed;
            }
        };
        *sent += 1;
        let answer = self.attempt(target, Some(&bearer.value), Instant::now(), deadline, *sent - 1).await;
        if *renewed || !matches!(&answer, Ok(answer) if answer.status == StatusCode::UNAUTHORIZED) {
            return answer;
        }
        *renewed = true;
        // A token asked for a moment ago is not replaced (an upstream that rejects every token
        // would have every call ask for one); a replacement that fails leaves the 401 the answer.
        if !self.tokens.may_replace(token, bearer.serial()) {
            return answer;
        }
        let Ok(bearer) = self.bearer(token, deadline, Some(bearer.serial())).await else {
            return answer;
        };
        if let Some((settings, key)) = limit
            && self.limiters.take(key, settings, Duration::ZERO).await.is_err()
        {
            return answer;
        }
        logged!(Level::DEBUG, upstream = %target.origin, "the upstream rejected the access token; sending once more with a new one");
        *sent += 1;
        self.attempt(target, Some(&bearer.value), Instant::now(), deadline, *sent - 1).await
    }

    /// One attempt of a call, through the origin's breaker, within `deadline`, with
    /// `authorization` in place of any `Authorization` header the request has; the `resend`th
    /// time the request is sent again. Its trace context goes with it, and its span is recorded
    /// when the call's is.
    pub(super) async fn attempt(
        &self,
        target: &Target<'_>,
        authorization: Option<&HeaderValue>,
        started: Instant,
        deadline: Instant,
        resend: u32,
    ) -> Result<Answer, UpstreamError> {
        let trace = traced::Attempt::begin(self, target, resend);
        let mut answer = self.attempt_traced(target, authorization, started, deadline, &trace).await;
        trace.end(&mut answer);
        answer
    }

    async fn attempt_traced(
        &self,
        target: &Target<'_>,
        authorization: Option<&HeaderValue>,
        started: Instant,
        deadline: Instant,
        trace: &traced::Attempt,
    ) -> Result<Answer, UpstreamError> {
        let ticket = self
            .breakers
            .admit(target.origin, target.breaker, started)
            .map_err(|refused| UpstreamError::Unavailable { retry_after: refused.retry_after })?;
        target.waited_for_failure.store(false, Ordering::Relaxed);
        let extra =
            Extra { authorization, trace: trace.propagated.as_ref(), keep_headers: target.keep_headers };
        let exchange = self.exchange_pooled(target, extra, started);
        let answer = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(UpstreamError::Timeout),
        };
        // A refusal of the policy says nothing of the upstream: not reported (a probe that ends
        // so lets the next call probe). Nor is the failure of another call's open this one
        // waited for: that call reported it.
        let failed = match &answer {
            Err(_) if target.waited_for_failure.load(Ordering::Relaxed) => None,
            Ok(answer) => Some(answer.status.is_server_error()),
            Err(
                UpstreamError::Connect(_)
                | UpstreamError::Tls(_)
                | UpstreamError::Broken(_)
                | UpstreamError::Timeout,
            ) => Some(true),
            Err(
                UpstreamError::NotAllowed(_)
                | UpstreamError::Unavailable { .. }
                | UpstreamError::RateLimited { .. }
                | UpstreamError::Auth(_),
            ) => None,
            // It answered.
            Err(UpstreamError::TooLarge { .. } | UpstreamError::Coding(_)) => Some(false),
        };
        if let Some(failed) = failed {
            ticket.report(!failed, Instant::now());
        }
        answer
    }
}
