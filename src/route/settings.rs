//! What a route adds to each call of one upstream besides the request (a route's own upstream,
//! or a source of a composed route): its OAuth2 token request, its `tls`, retries, rate limit,
//! HTTP/2 with prior knowledge, and whose breaker counts its calls, read once per route version.

use std::sync::Arc;

use uuid::Uuid;

use super::config::Auth;
use crate::rules::Problem;
use crate::upstream::{Outbound, RateLimitSettings, RetrySettings, RouteTls, TlsSettings, TokenRequest};

/// An upstream's settings, ready for its calls.
#[derive(Debug)]
pub struct CallSettings {
    pub oauth: Option<Arc<TokenRequest>>,
    pub tls: Option<Arc<RouteTls>>,
    pub retry: Option<RetrySettings>,
    pub rate_limit: Option<RateLimitSettings>,
    pub h2c: bool,
    /// Who its rate limit is kept for: the route, or the route and the source.
    pub key: Uuid,
    /// The route whose own breaker counts its calls (`"breaker": {"scope": "route"}`); `None`:
    /// its origin's.
    pub breaker: Option<Uuid>,
}

/// What [`CallSettings::read`] reads, with where its problems go.
pub struct Given<'a> {
    pub auth: &'a Auth,
    /// Where `authHeader`'s `tokenUrl` is.
    pub token_url_at: String,
    pub tls: Option<&'a TlsSettings>,
    /// Where `tls` is.
    pub tls_at: String,
    pub retry: Option<&'a RetrySettings>,
    pub rate_limit: Option<&'a RateLimitSettings>,
    pub h2c: bool,
    pub key: Uuid,
    pub breaker: Option<Uuid>,
}

impl CallSettings {
    /// Reads `given`, or adds its problems (a token URL or TLS material that cannot be used).
    pub fn read(given: Given<'_>, problems: &mut Vec<Problem>) -> Option<CallSettings> {
        let before = problems.len();
        let oauth = match given.auth {
            Auth::OAuth2(credentials) => match TokenRequest::new(credentials) {
                Ok(request) => Some(Arc::new(request)),
                Err(why) => {
                    problems.push(Problem::new(given.token_url_at, why));
                    None
                }
            },
            _ => None,
        };
        let tls = match given.tls {
            Some(settings) => match RouteTls::new(settings) {
                Ok(tls) => Some(Arc::new(tls)),
                Err((member, why)) => {
                    problems.push(Problem::new(format!("{}/{member}", given.tls_at), why));
                    None
                }
            },
            None => None,
        };
        (problems.len() == before).then(|| CallSettings {
            oauth,
            tls,
            retry: given.retry.cloned(),
            rate_limit: given.rate_limit.cloned(),
            h2c: given.h2c,
            key: given.key,
            breaker: given.breaker,
        })
    }

    /// What a call of this upstream adds to its request; `source` names a composed route's
    /// source in its spans.
    pub fn outbound<'a>(&'a self, source: Option<&'a str>) -> Outbound<'a> {
        Outbound {
            rate_limit: self.rate_limit.as_ref().map(|limit| (limit, self.key)),
            retry: self.retry.as_ref(),
            oauth: self.oauth.as_ref(),
            tls: self.tls.as_deref(),
            breaker: self.breaker,
            h2c: self.h2c,
            source,
            keep_headers: false,
            deadline: None,
        }
    }

    /// How many requests one call of it may send: one, and its retries.
    pub fn attempts(&self) -> usize {
        1 + self.retry.as_ref().map_or(0, |r| usize::from(r.attempts))
    }
}
