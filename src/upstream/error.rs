//! Why no answer came back from an upstream ([`UpstreamError`]), and why no token came from a
//! token endpoint ([`AuthFailure`]), which is one of those reasons.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use crate::policy::NotAllowed;

/// Why no answer came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection: refused, unreachable, name not resolved.
    Connect(String),
    /// TLS refused the connection: the upstream's certificate is not trusted, or the upstream
    /// refused the handshake or the certificate recast presented (why).
    Tls(String),
    /// The connection broke during the exchange.
    Broken(String),
    /// The deadline passed.
    Timeout,
    /// The body is larger than allowed (decoded, when it comes in a content coding).
    TooLarge { limit: usize },
    /// A 2xx answer in a content coding recast does not decode (its name), or a coded body that
    /// does not decode (why).
    Coding(String),
    /// The outbound policy refuses the upstream's address; nothing was sent.
    NotAllowed(NotAllowed),
    /// The upstream's breaker is open after failures in a row; nothing was sent. When to try
    /// again.
    Unavailable { retry_after: Duration },
    /// The route's outbound rate limit left no slot within its `maxWaitMs`; nothing was sent.
    /// When a slot is free.
    RateLimited { retry_after: Duration },
    /// The route's token endpoint gave no access token; nothing was sent upstream.
    Auth(AuthFailure),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(why) => write!(f, "the upstream could not be reached: {why}"),
            UpstreamError::Tls(why) => write!(f, "the TLS handshake with the upstream failed: {why}"),
            UpstreamError::Broken(why) => write!(f, "the connection to the upstream broke: {why}"),
            UpstreamError::Timeout => f.write_str("the upstream did not answer in time"),
            UpstreamError::TooLarge { limit } => {
                write!(f, "the upstream's answer is larger than {limit} bytes (RECAST_MAX_UPSTREAM_BYTES)")
            }
            UpstreamError::Coding(why) => f.write_str(why),
            UpstreamError::NotAllowed(refusal) => refusal.fmt(f),
            UpstreamError::Unavailable { .. } => f.write_str(
                "calls to this upstream failed repeatedly, so recast does not call it until its \
                 cooldown ends (RECAST_BREAKER_FAILURES, RECAST_BREAKER_COOLDOWN_MS); nothing was sent",
            ),
            UpstreamError::RateLimited { .. } => f.write_str(
                "the route's rateLimit (the upstream's quota) has no slot free within its maxWaitMs; nothing was sent",
            ),
            UpstreamError::Auth(failure) => write!(f, "{failure}; nothing was sent to the upstream"),
        }
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

    pub(super) fn of(error: UpstreamError) -> AuthFailure {
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
