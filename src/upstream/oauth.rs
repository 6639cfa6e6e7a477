//! OAuth2 client credentials (RFC 6749 §4.4; `"type": "OAuth2ClientCredentials"` in a route's
//! `authHeader`; `docs/upstreams.md`): the access token a route's upstream calls carry, asked of
//! the route's token endpoint and kept in memory only.
//!
//! - One token per credential set (token URL, client, secret, scope, audience, how the client
//!   authenticates): routes with the same credentials share it. A set is known by the SHA-256 of
//!   its token request.
//! - A token is renewed in the background once three quarters of its life (at most a minute
//!   before its end) have passed, while calls go on using it; it is used until shortly before its
//!   `expires_in` ends, after which calls wait for a new one.
//! - One fetch at a time per set: calls that need a token while one is being fetched wait for that
//!   fetch and share its outcome. A fetch that failed is answered to the calls of the next second
//!   without asking again, so a failing endpoint is not stormed.
//! - An upstream's 401 makes one fetch of a new token (unless another call already replaced the
//!   rejected one) and one more send of the call, at most.
//! - The token endpoint is called like an upstream: the outbound policy, the deadline of the call,
//!   the size bound on its answer and its origin's breaker. Its body is never shown: a failure
//!   carries the RFC 6749 `error` code when the answer had one.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, StatusCode, Uri};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::Level;

use super::UpstreamRequest;
use super::per_key::PerKey;
use super::{UpstreamClient, UpstreamError, origin};
use crate::flight::{self, Flights};
use crate::logging::logged;
use crate::metrics::{FetchReason, TokenCounts};

/// A route's client credentials, as stored (sealed with the rest of the route).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCredentials {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    pub client_auth: ClientAuth,
}

impl fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &"***")
            .field("scope", &self.scope)
            .field("audience", &self.audience)
            .field("client_auth", &self.client_auth)
            .finish()
    }
}

/// How the client authenticates to the token endpoint (RFC 6749 §2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// HTTP Basic with the form-encoded client id and secret (the default).
    Basic,
    /// `client_id` and `client_secret` in the form body.
    Body,
}

impl ClientAuth {
    pub fn name(self) -> &'static str {
        match self {
            ClientAuth::Basic => "basic",
            ClientAuth::Body => "body",
        }
    }
}

/// The token request of one credential set, built once when a route is compiled.
pub struct TokenRequest {
    request: UpstreamRequest,
    /// The credential set's key: the hex SHA-256 of the request.
    key: String,
    /// `scheme://host:port` of the token endpoint: its breaker, and its label in `/metrics`.
    origin: String,
}

impl fmt::Debug for TokenRequest {
    // The request holds the secret: only where it goes is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenRequest({})", self.request.uri)
    }
}

impl TokenRequest {
    /// `POST tokenUrl` with `grant_type=client_credentials`, the scope and audience when given,
    /// and the client's credentials in a Basic header or in the body.
    pub fn new(credentials: &ClientCredentials) -> Result<TokenRequest, String> {
        let uri = Uri::try_from(credentials.token_url.as_str())
            .map_err(|e| format!("the token URL is invalid: {e}"))?;
        if uri.scheme().is_none() || uri.authority().is_none() {
            return Err("the token URL is not an absolute URL".to_owned());
        }
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        if let Some(scope) = &credentials.scope {
            form.append_pair("scope", scope);
        }
        if let Some(audience) = &credentials.audience {
            form.append_pair("audience", audience);
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-www-form-urlencoded"));
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        match credentials.client_auth {
            ClientAuth::Basic => {
                // RFC 6749 §2.3.1: each part form-encoded, then joined and base64-encoded.
                let encode =
                    |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
                let pair =
                    format!("{}:{}", encode(&credentials.client_id), encode(&credentials.client_secret));
                let basic = base64::engine::general_purpose::STANDARD.encode(pair);
                let mut value = HeaderValue::try_from(format!("Basic {basic}"))
                    .map_err(|_| "the client credentials do not make a header".to_owned())?;
                value.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, value);
            }
            ClientAuth::Body => {
                form.append_pair("client_id", &credentials.client_id);
                form.append_pair("client_secret", &credentials.client_secret);
            }
        }
        let origin = origin(&uri);
        let request =
            UpstreamRequest { method: Method::POST, uri, headers, body: Bytes::from(form.finish()) };
        let key = crate::hex::encode(&request.digest());
        Ok(TokenRequest { request, key, origin })
    }

    /// Where tokens are asked for.
    pub fn uri(&self) -> &Uri {
        &self.request.uri
    }
}

/// Why no token came from the token endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFailure {
    /// The endpoint was not reached, or did not answer in time (why).
    Unreachable(String),
    /// It answered `status`, with the RFC 6749 `error` code when its body held one.
    Refused { status: StatusCode, error: Option<String> },
    /// It answered 2xx, but not with a token recast can send (why).
    Unusable(&'static str),
}

impl AuthFailure {
    /// The RFC 6749 `error` code the endpoint gave, if any.
    pub fn error_code(&self) -> Option<&str> {
        match self {
            AuthFailure::Refused { error, .. } => error.as_deref(),
            _ => None,
        }
    }

    fn of(error: UpstreamError) -> AuthFailure {
        AuthFailure::Unreachable(match error {
            UpstreamError::Connect(why) => format!("the token endpoint could not be reached: {why}"),
            UpstreamError::Broken(why) => format!("the connection to the token endpoint broke: {why}"),
            UpstreamError::TooLarge { limit } => {
                format!("the token endpoint's answer is larger than {limit} bytes (RECAST_MAX_UPSTREAM_BYTES)")
            }
            // Route callers are not told addresses; the registration checked the URL's.
            UpstreamError::NotAllowed(_) => {
                "the token endpoint resolves to an address the outbound policy refuses".to_owned()
            }
            UpstreamError::Timeout => "the token endpoint did not answer in time".to_owned(),
            UpstreamError::Unavailable { .. } => {
                "calls to the token endpoint failed repeatedly, so recast does not call it until its cooldown ends"
                    .to_owned()
            }
            other => other.to_string(),
        })
    }
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthFailure::Unreachable(why) => write!(f, "no access token: {why}"),
            AuthFailure::Refused { status, error } => {
                let what = if status.is_client_error() {
                    "the token endpoint refused the client credentials"
                } else {
                    "the token endpoint failed"
                };
                match error {
                    Some(code) => write!(f, "{what}: it answered {status} with the error `{code}`"),
                    None => write!(f, "{what}: it answered {status}"),
                }
            }
            AuthFailure::Unusable(why) => {
                write!(f, "the token endpoint's answer holds no usable token: {why}")
            }
        }
    }
}

/// How long a token lives when its answer has no `expires_in`: until an upstream rejects it, or
/// an hour.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// The longest `expires_in` taken at its word.
const MAX_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long a failed fetch is answered to the calls that come after it without asking again.
const FAILURE_HOLD: Duration = Duration::from_secs(1);
/// How old a token must be before an upstream's 401 makes a new one be asked for.
const MIN_REPLACE_AGE: Duration = Duration::from_secs(1);
/// The longest access token taken.
const MAX_TOKEN: usize = 16 * 1024;

/// The token a call sends, and its number, which tells it from the tokens before and after it.
pub(super) struct Bearer {
    pub value: HeaderValue,
    serial: u64,
}

/// A token held: its `Authorization` value, when it is renewed and until when it is sent.
#[derive(Clone)]
struct HeldToken {
    value: HeaderValue,
    serial: u64,
    /// When the request that brought it was sent.
    sent: Instant,
    renew_at: Instant,
    use_until: Instant,
}

impl HeldToken {
    /// A token obtained by a request sent at `sent` that lives `expires_in`: renewed after three
    /// quarters of its life (at most a minute before its end), sent until a tenth of its life (at
    /// most 5 seconds) before its end. Its life is taken as a second shorter than `expires_in`
    /// says: servers count it in whole seconds from a time they round down.
    fn new(value: HeaderValue, serial: u64, sent: Instant, expires_in: Option<Duration>) -> HeldToken {
        let life =
            expires_in.unwrap_or(DEFAULT_LIFETIME).min(MAX_LIFETIME).saturating_sub(Duration::from_secs(1));
        let renew_at = sent + life - (life / 4).min(Duration::from_secs(60));
        let use_until = sent + life - (life / 10).min(Duration::from_secs(5));
        HeldToken { value, serial, sent, renew_at, use_until }
    }

    fn bearer(&self) -> Bearer {
        Bearer { value: self.value.clone(), serial: self.serial }
    }
}

impl Bearer {
    pub(super) fn serial(&self) -> u64 {
        self.serial
    }
}

/// The token of one credential set.
struct Slot {
    held: RwLock<Option<HeldToken>>,
    /// The fetch under way, one at a time (`crate::flight`, keyed by nothing: a slot has one).
    fetches: Arc<Flights<(), Fetched>>,
    /// The last fetch's failure, and when it came; `None` once one gave a token.
    last_failure: Mutex<Option<(Instant, AuthFailure)>>,
    /// The token endpoint's origin, for `/metrics`.
    origin: String,
    /// Fetches by reason ([`FetchReason`] order), that gave a token and that failed.
    fetched: [[AtomicU64; 2]; 3],
}

/// What a fetch ends with, as every call waiting on it sees it.
type Fetched = Result<HeldToken, AuthFailure>;

impl Slot {
    /// The token held, if it may still be sent at `now` and is not `rejected`.
    fn usable(&self, now: Instant, rejected: Option<u64>) -> Option<HeldToken> {
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        held.as_ref().filter(|h| now < h.use_until && Some(h.serial) != rejected).cloned()
    }

    /// The last fetch's failure, if it came less than [`FAILURE_HOLD`] ago.
    fn recent_failure(&self) -> Option<AuthFailure> {
        let last = self.last_failure.lock().unwrap_or_else(PoisonError::into_inner);
        last.as_ref().filter(|(at, _)| at.elapsed() < FAILURE_HOLD).map(|(_, failure)| failure.clone())
    }
}

/// Every credential set's token.
#[derive(Default)]
pub struct Tokens {
    slots: PerKey<String, Slot>,
    /// The fetch counts of the slots forgotten, by origin, so `/metrics` keeps counting.
    forgotten: Mutex<std::collections::HashMap<String, [[u64; 2]; 3]>>,
}

/// How long after its last use a token that ran out is kept (with the slot that holds it).
const FORGET_AFTER: Duration = Duration::from_secs(600);

impl Tokens {
    fn slot(&self, token: &TokenRequest) -> Arc<Slot> {
        self.slots.get_or(&token.key, || Slot {
            held: RwLock::new(None),
            fetches: Arc::default(),
            last_failure: Mutex::default(),
            origin: token.origin.clone(),
            fetched: Default::default(),
        })
    }

    /// Whether the token `rejected` (by an upstream's 401) may be replaced now: not when it was
    /// asked for less than [`MIN_REPLACE_AGE`] ago, so an upstream that rejects every token does
    /// not make a token request of every call.
    pub(super) fn may_replace(&self, token: &TokenRequest, rejected: u64) -> bool {
        let slot = self.slot(token);
        let held = slot.held.read().unwrap_or_else(PoisonError::into_inner);
        held.as_ref().is_none_or(|h| h.serial != rejected || h.sent.elapsed() >= MIN_REPLACE_AGE)
    }

    /// Forgets the slots that nothing used for a while whose token ran out [`FORGET_AFTER`]
    /// before `now` (or that never got one and failed as long ago) and have no fetch under way
    /// (one sweep of those made `every` so long): a token is not kept in memory long after
    /// anything uses it, and credentials no route holds any more do not pile up.
    pub(super) fn sweep(&self, every: Duration, now: Instant) {
        let mut forgotten = self.forgotten.lock().unwrap_or_else(PoisonError::into_inner);
        self.slots.sweep(every, |slot, _| {
            let last_failure = slot.last_failure.lock().unwrap_or_else(PoisonError::into_inner);
            let held = slot.held.read().unwrap_or_else(PoisonError::into_inner);
            let last = match (&*held, &*last_failure) {
                (Some(held), _) => Some(held.use_until),
                (None, Some((at, _))) => Some(*at),
                (None, None) => None,
            };
            let at_rest = slot.fetches.is_empty() && last.is_none_or(|last| now >= last + FORGET_AFTER);
            if at_rest {
                let sums = forgotten.entry(slot.origin.clone()).or_default();
                for (sum, count) in sums.iter_mut().flatten().zip(slot.fetched.iter().flatten()) {
                    *sum += count.load(Ordering::Relaxed);
                }
            }
            at_rest
        });
    }

    /// How many credential sets' tokens are kept.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Every token endpoint's fetches, by origin (the credential sets of one origin added up,
    /// those forgotten included).
    pub fn snapshot(&self) -> Vec<TokenCounts> {
        let mut all: Vec<TokenCounts> = Vec::new();
        let live = self.slots.each(|_, slot| {
            (
                slot.origin.clone(),
                slot.fetched.each_ref().map(|pair| pair.each_ref().map(|n| n.load(Ordering::Relaxed))),
            )
        });
        let forgotten: Vec<(String, [[u64; 2]; 3])> = {
            let forgotten = self.forgotten.lock().unwrap_or_else(PoisonError::into_inner);
            forgotten.iter().map(|(origin, fetched)| (origin.clone(), *fetched)).collect()
        };
        for (origin, fetched) in live.into_iter().chain(forgotten) {
            match all.iter_mut().find(|counts| counts.origin == origin) {
                Some(counts) => {
                    for (sum, add) in counts.fetched.iter_mut().flatten().zip(fetched.iter().flatten()) {
                        *sum += add;
                    }
                }
                None => all.push(TokenCounts { origin, fetched }),
            }
        }
        all.sort_by(|a, b| a.origin.cmp(&b.origin));
        all
    }
}

impl UpstreamClient {
    /// The token to send for the credential set of `token`: the one held, unless it ran out or
    /// is `rejected`; else the outcome of the fetch under way, or of one started now. A call
    /// waits for a fetch up to its own `deadline`; the fetch itself runs on its own, with the
    /// whole `RECAST_UPSTREAM_TIMEOUT_MS`, whoever waits for it.
    pub(super) async fn bearer(
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
        let target = super::Target {
            request: &token.request,
            origin: &token.origin,
            tls: None,
            breaker: None,
            h2c: false,
            waited_for_failure: Default::default(),
            source: None,
            token: true,
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
const MAX_ERROR_CODE: usize = 64;

/// The `Authorization` value and lifetime of a token endpoint's answer (RFC 6749 §5.1), or why
/// there is none (§5.2). Nothing of the body is kept but the token, its lifetime and an `error`
/// code made of the characters RFC 6749 allows.
fn read_token(status: StatusCode, body: &[u8]) -> Result<(HeaderValue, Option<Duration>), AuthFailure> {
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

#[cfg(test)]
mod tests;
