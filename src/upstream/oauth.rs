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
use http::{HeaderMap, Method, Uri};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::UpstreamRequest;
use super::error::AuthFailure;
use super::per_key::PerKey;
use super::request::origin;
use crate::flight::Flights;
use crate::metrics::TokenCounts;

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

mod fetch;
#[cfg(test)]
mod tests;
