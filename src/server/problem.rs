//! The errors an HTTP answer can carry, and the one place where each becomes a status code and an
//! RFC 9457 `application/problem+json` body (SPEC §4). Handlers return [`ApiError`]; they never
//! pick a status for an error themselves.

use crate::callers::Refusal;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::Full;

use crate::json::{JsonError, place, write};
use crate::plan::Limit;
use crate::rules::{MAX_LISTED, Problem};
use crate::upstream::{CertificateAsked, UpstreamError};

/// Base of every problem `type` URI.
pub const TYPE_BASE: &str = "https://recast.dev/problems/";

/// The last segment of every problem type recast answers with (see [`ApiError::slug`]); a
/// route's stats count error answers by their place here.
pub const SLUGS: [&str; crate::metrics::ERROR_KINDS] = [
    "invalid-json",
    "body-too-deep",
    "invalid-query",
    "invalid-request",
    "invalid-rules",
    "body-too-large",
    "body-unreadable",
    "body-timeout",
    "not-found",
    "method-not-allowed",
    "auth-required",
    "admin-token-required",
    "overloaded",
    "upstream-not-allowed",
    "upstream-validation-failed",
    "upstream-error",
    "upstream-unreachable",
    "upstream-timeout",
    "upstream-too-large",
    "upstream-not-json",
    "upstream-encoding",
    "upstream-unavailable",
    "upstream-rate-limited",
    "upstream-auth-failed",
    "upstream-tls-failed",
    "mapping-limit",
    "starting",
    "route-unavailable",
    "storage-error",
    "store-unavailable",
    "conflict",
    "precondition-failed",
    "reseal-refused",
    "internal-error",
    "bad-request",
    "template-failed",
    "caller-unauthenticated",
    "caller-forbidden",
    "caller-rate-limited",
    "read-only",
];

/// Everything that can go wrong while answering a request, by where it came from.
#[derive(Debug, Clone)]
pub enum ApiError {
    // From the client.
    /// The client's body is not JSON: why, and where (its line, column and member).
    InvalidJson(String),
    /// The client's body nests deeper than allowed: what may nest how deep.
    TooDeep(String),
    /// The client's body is JSON but not the expected shape.
    InvalidRequest(String),
    /// A query parameter is not one the endpoint takes (which, and why).
    InvalidQuery(String),
    /// Problems in a registration, each located in the body.
    InvalidBody(Vec<Problem>),
    /// The rules do not compile; every problem is listed.
    InvalidRules(Vec<Problem>),
    /// A preview's mapping ran into one of its bounds (`limit`, which stands at `bound`).
    PreviewLimit {
        limit: Limit,
        bound: u64,
    },
    /// The client's body is larger than `RECAST_MAX_REQUEST_BYTES`.
    BodyTooLarge {
        limit: usize,
    },
    /// The client's body could not be read (the connection broke).
    BodyUnreadable,
    /// The body did not arrive within `RECAST_HEADER_TIMEOUT_MS`.
    BodyTimeout,
    NotFound,
    MethodNotAllowed {
        allow: &'static str,
    },
    /// A change asked of a node from a routes file (SPEC §2.5): its admin API only reads.
    ReadOnly,
    /// A runtime-auth route called without `X-Mapped-Auth`.
    AuthRequired,
    /// An admin endpoint called without the admin token (SPEC §6).
    AdminTokenRequired,
    /// A route's caller did not pass its `callers` (SPEC §2.4).
    Caller(crate::callers::Refusal),

    // From the upstream.
    /// A route call's upstream failed (`validating: false`), or a registration's live call did.
    Upstream {
        failure: UpstreamFailure,
        validating: bool,
    },

    // From recast itself.
    /// Still loading routes.
    Starting,
    /// `RECAST_MAX_INFLIGHT` requests are already in flight.
    Overloaded,
    /// Every compiler stayed busy for the budget of one compile.
    CompilersBusy {
        budget: std::time::Duration,
    },
    /// Compiling what the request sent took longer than the budget of one compile.
    CompileTooLong {
        budget: std::time::Duration,
    },
    /// The upstream answers calls hold passed `RECAST_MAX_BUFFERED_BYTES` (`limit`).
    Buffered {
        limit: usize,
    },
    /// An HTTP/2 connection holds `held` bytes of answers its client has not taken, past
    /// `RECAST_MAX_RESPONSE_BYTES` (`limit`).
    Untaken {
        held: usize,
        limit: usize,
    },
    /// A stored route that cannot serve calls (its rules no longer compile, ...).
    RouteUnavailable(String),
    /// Storage failed; the change was not made.
    Storage(String),
    /// Cluster mode: the database cannot be reached; the change was not made.
    StoreUnavailable(String),
    /// Cluster mode: the route changed on another node since this update began (what it is now).
    Conflict(String),
    /// `If-Match` names a version of the route that is not the one there now (which is).
    PreconditionFailed(String),
    /// A re-seal that cannot run now: one is under way, or a live node lacks the sealing key.
    ResealRefused(String),
    /// A bug: the handler panicked. The panic is logged and counted (`recast_panics_total`).
    Internal,

    // From a composed route's sources (SPEC §2.3).
    /// A template, `when` or `forEach` of a source failed: where (a location in the
    /// registration), why (a type, never a value), and whether it read only the caller's
    /// request (then the caller's mistake: 400 `bad-request`; else 502 `template-failed`).
    Template {
        location: String,
        why: String,
        caller: bool,
    },
    /// A source's failure: the problem its failure makes, with `"source": name` added.
    Source {
        name: String,
        /// The `forEach` element (its index) whose failure it is.
        element: Option<usize>,
        error: Box<ApiError>,
    },
}

/// How an upstream exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// It answered with a status other than 2xx (and had asked for a client certificate when
    /// the connection was made, if it did).
    Status(StatusCode, Option<CertificateAsked>),
    /// No connection, or it broke.
    Unreachable(String),
    Timeout,
    TooLarge {
        limit: usize,
    },
    /// A 2xx answer whose body is not JSON (what it was, in words).
    NotJson(String),
    /// A 2xx answer in a content coding recast does not decode, or a coded body that does not
    /// decode (which, and why).
    Encoding(String),
    /// The outbound policy refuses the upstream's address (the reason); nothing was sent.
    NotAllowed(String),
    /// Mapping the answer ran into one of its bounds (`limit`, which stands at `bound`).
    MappingLimit {
        limit: Limit,
        bound: u64,
    },
    /// The answers of one call of a composed route together passed `RECAST_MAX_COMPOSED_BYTES`
    /// (`limit`).
    ComposedTooLarge {
        limit: usize,
    },
    /// One call of a composed route would send more than `RECAST_MAX_SOURCE_CALLS` (`limit`)
    /// requests, retries counted; nothing more was sent.
    TooManyCalls {
        limit: usize,
    },
    /// The upstream answers and rendered requests all calls hold passed
    /// `RECAST_MAX_BUFFERED_BYTES` (`limit`) while a composed call was under way: it starts no
    /// more source or element, and ends.
    Buffered {
        limit: usize,
    },
    /// The upstream's breaker is open (why, and when to try again); nothing was sent.
    Unavailable {
        why: String,
        retry_after: std::time::Duration,
    },
    /// The route's outbound rate limit has no slot free in time (why, and when one is);
    /// nothing was sent.
    RateLimited {
        why: String,
        retry_after: std::time::Duration,
    },
    /// The TLS handshake with the upstream failed (why): its certificate is not trusted, or it
    /// refused the connection or the certificate recast presented.
    TlsFailed(String),
    /// The route's OAuth2 token endpoint gave no token (why, and the RFC 6749 `error` code it
    /// answered, if any); nothing was sent upstream.
    AuthFailed {
        why: String,
        error: Option<String>,
    },
    /// A paged call's pages could not be followed (SPEC §2.3 "Pages"): a page's items are not
    /// a list, a next value cannot be used or leaves the origin, a loop, more than `maxPages`
    /// pages (where in the registration, and why: never a value).
    Paging {
        location: String,
        why: String,
    },
}

impl From<UpstreamError> for UpstreamFailure {
    fn from(e: UpstreamError) -> UpstreamFailure {
        match e {
            UpstreamError::Timeout => UpstreamFailure::Timeout,
            UpstreamError::TooLarge { limit } => UpstreamFailure::TooLarge { limit },
            UpstreamError::NotAllowed(refusal) => UpstreamFailure::NotAllowed(refusal.to_string()),
            UpstreamError::Coding(why) => UpstreamFailure::Encoding(why),
            UpstreamError::Unavailable { retry_after } => {
                UpstreamFailure::Unavailable { why: e.to_string(), retry_after }
            }
            UpstreamError::RateLimited { retry_after } => {
                UpstreamFailure::RateLimited { why: e.to_string(), retry_after }
            }
            UpstreamError::Connect(_) | UpstreamError::Broken(_) => {
                UpstreamFailure::Unreachable(e.to_string())
            }
            UpstreamError::Tls(_) => UpstreamFailure::TlsFailed(e.to_string()),
            UpstreamError::Auth(ref failure) => UpstreamFailure::AuthFailed {
                error: failure.error_code().map(str::to_owned),
                why: e.to_string(),
            },
        }
    }
}

/// What the detail of an upstream's 400 or 403 adds when the upstream asked for a client
/// certificate in the TLS handshake: some servers refuse a missing or unknown one after the
/// handshake, with such an answer (nginx's `ssl_verify_client on` answers 400), not with a TLS
/// alert.
fn refusal_hint(status: StatusCode, asked: Option<CertificateAsked>) -> &'static str {
    if !matches!(status, StatusCode::BAD_REQUEST | StatusCode::FORBIDDEN) {
        return "";
    }
    match asked {
        None => "",
        Some(CertificateAsked::NoneGiven) => {
            "; it had asked for a client certificate in the TLS handshake, and the route presents none (`tls.clientCert`)"
        }
        Some(CertificateAsked::Given) => {
            "; it had asked for a client certificate in the TLS handshake and was given the route's (`tls.clientCert`): some upstreams answer so to a certificate they do not accept"
        }
    }
}

/// The detail of a `mapping-limit` problem.
fn mapping_limit(limit: Limit, bound: u64) -> String {
    let what = match limit {
        Limit::Built => {
            "the values the rules' expressions build (lists, objects, text, each counted as written out)"
        }
        Limit::Answer => "the answer the rules write",
        Limit::Steps => {
            "the work of the mapping (objects mapped, values compared, elements built, text read)"
        }
    };
    format!("{what} would pass {bound} {} ({}); the mapping was stopped there", limit.unit(), limit.setting())
}

impl ApiError {
    /// The answer to a client's body that `error` refuses: where the mistake is, or, for a body
    /// that nests too deeply, `depth` (what may nest how deep).
    pub fn bad_body(body: &[u8], error: &JsonError, depth: impl FnOnce(usize) -> String) -> ApiError {
        match error {
            JsonError::TooDeep { limit } => ApiError::TooDeep(depth(*limit)),
            syntax => ApiError::InvalidJson(place::described(body, syntax)),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_)
            | ApiError::TooDeep(_)
            | ApiError::InvalidQuery(_)
            | ApiError::InvalidRequest(_)
            | ApiError::InvalidBody(_)
            | ApiError::InvalidRules(_)
            | ApiError::BodyUnreadable => StatusCode::BAD_REQUEST,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::PreviewLimit { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } | ApiError::ReadOnly => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::AuthRequired | ApiError::AdminTokenRequired => StatusCode::UNAUTHORIZED,
            ApiError::Caller(refusal) => match refusal {
                Refusal::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
                Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
                Refusal::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            },
            ApiError::Upstream { failure, validating } => match failure {
                // A registration names an upstream the policy refuses: the client's mistake.
                UpstreamFailure::NotAllowed(_) if *validating => StatusCode::BAD_REQUEST,
                UpstreamFailure::Unavailable { .. } | UpstreamFailure::Buffered { .. } => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                UpstreamFailure::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
                UpstreamFailure::Timeout => StatusCode::GATEWAY_TIMEOUT,
                // A client error of the upstream keeps its status on route calls (SPEC §2.2).
                UpstreamFailure::Status(status, _) if status.is_client_error() && !validating => *status,
                _ => StatusCode::BAD_GATEWAY,
            },
            ApiError::Starting
            | ApiError::RouteUnavailable(_)
            | ApiError::Overloaded
            | ApiError::CompilersBusy { .. }
            | ApiError::Buffered { .. }
            | ApiError::Untaken { .. }
            | ApiError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::CompileTooLong { .. } => StatusCode::BAD_REQUEST,
            ApiError::Conflict(_) | ApiError::ResealRefused(_) => StatusCode::CONFLICT,
            ApiError::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            ApiError::Storage(_) | ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Template { caller: true, .. } => StatusCode::BAD_REQUEST,
            ApiError::Template { caller: false, .. } => StatusCode::BAD_GATEWAY,
            ApiError::Source { error, .. } => error.status(),
        }
    }

    /// The last segment of the problem `type` URI.
    pub fn slug(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "invalid-json",
            ApiError::TooDeep(_) => "body-too-deep",
            ApiError::InvalidQuery(_) => "invalid-query",
            ApiError::InvalidRequest(_) | ApiError::InvalidBody(_) => "invalid-request",
            ApiError::InvalidRules(_) => "invalid-rules",
            ApiError::PreviewLimit { .. } => "mapping-limit",
            ApiError::BodyTooLarge { .. } => "body-too-large",
            ApiError::BodyUnreadable => "body-unreadable",
            ApiError::BodyTimeout => "body-timeout",
            ApiError::NotFound => "not-found",
            ApiError::MethodNotAllowed { .. } => "method-not-allowed",
            ApiError::ReadOnly => "read-only",
            ApiError::AuthRequired => "auth-required",
            ApiError::AdminTokenRequired => "admin-token-required",
            ApiError::Caller(refusal) => match refusal {
                Refusal::Unauthenticated { .. } => "caller-unauthenticated",
                Refusal::Forbidden(_) => "caller-forbidden",
                Refusal::Limited { .. } => "caller-rate-limited",
            },
            ApiError::Overloaded
            | ApiError::CompilersBusy { .. }
            | ApiError::Buffered { .. }
            | ApiError::Untaken { .. } => "overloaded",
            ApiError::CompileTooLong { .. } => "invalid-request",
            ApiError::Upstream { failure, validating } => match failure {
                UpstreamFailure::NotAllowed(_) => "upstream-not-allowed",
                UpstreamFailure::MappingLimit { .. }
                | UpstreamFailure::ComposedTooLarge { .. }
                | UpstreamFailure::TooManyCalls { .. } => "mapping-limit",
                UpstreamFailure::Buffered { .. } => "overloaded",
                UpstreamFailure::Unavailable { .. } => "upstream-unavailable",
                UpstreamFailure::RateLimited { .. } => "upstream-rate-limited",
                UpstreamFailure::AuthFailed { .. } => "upstream-auth-failed",
                UpstreamFailure::TlsFailed(_) => "upstream-tls-failed",
                UpstreamFailure::Paging { .. } => "template-failed",
                _ if *validating => "upstream-validation-failed",
                UpstreamFailure::Status(..) => "upstream-error",
                UpstreamFailure::Unreachable(_) => "upstream-unreachable",
                UpstreamFailure::Timeout => "upstream-timeout",
                UpstreamFailure::TooLarge { .. } => "upstream-too-large",
                UpstreamFailure::NotJson(_) => "upstream-not-json",
                UpstreamFailure::Encoding(_) => "upstream-encoding",
            },
            ApiError::Starting => "starting",
            ApiError::RouteUnavailable(_) => "route-unavailable",
            ApiError::Storage(_) => "storage-error",
            ApiError::StoreUnavailable(_) => "store-unavailable",
            ApiError::Conflict(_) => "conflict",
            ApiError::PreconditionFailed(_) => "precondition-failed",
            ApiError::ResealRefused(_) => "reseal-refused",
            ApiError::Internal => "internal-error",
            ApiError::Template { caller: true, .. } => "bad-request",
            ApiError::Template { caller: false, .. } => "template-failed",
            ApiError::Source { error, .. } => error.slug(),
        }
    }

    /// The place of [`ApiError::slug`] in [`SLUGS`], as a route's stats count it.
    pub fn kind(&self) -> usize {
        let slug = self.slug();
        SLUGS.iter().position(|listed| *listed == slug).unwrap_or(SLUGS.len())
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "The request body is not valid JSON",
            ApiError::TooDeep(_) => "The request body nests too deeply",
            ApiError::InvalidQuery(_) => "The query is not what this endpoint takes",
            ApiError::InvalidRequest(_) | ApiError::InvalidBody(_) => {
                "The request body is not what this endpoint takes"
            }
            ApiError::InvalidRules(_) => "The mapping rules are invalid",
            ApiError::PreviewLimit { .. } => "The mapping passed one of its limits",
            ApiError::BodyTooLarge { .. } => "The request body is too large",
            ApiError::BodyUnreadable => "The request body could not be read",
            ApiError::BodyTimeout => "The request body came too slowly",
            ApiError::NotFound => "Nothing is here",
            ApiError::MethodNotAllowed { .. } => "Method not allowed",
            ApiError::ReadOnly => "Read-only node",
            ApiError::AuthRequired => "This route needs X-Mapped-Auth",
            ApiError::AdminTokenRequired => "This endpoint needs the admin token",
            ApiError::Caller(refusal) => match refusal {
                Refusal::Unauthenticated { .. } => "This route needs a valid API key or token",
                Refusal::Forbidden(_) => "This caller may not call this route",
                Refusal::Limited { .. } => "This caller made as many calls as the route allows for now",
            },
            ApiError::Overloaded => "recast is at its limit of requests in flight",
            ApiError::CompilersBusy { .. } => "recast is compiling as much as it may at once",
            ApiError::CompileTooLong { .. } => "What the request sent takes too long to compile",
            ApiError::Buffered { .. } => "recast holds as many upstream answers as it may",
            ApiError::Untaken { .. } => "this connection holds as many answers not taken as it may",
            ApiError::Upstream { failure, validating } => match failure {
                UpstreamFailure::NotAllowed(_) => "The upstream's address is not allowed; nothing was sent",
                UpstreamFailure::MappingLimit { .. } => "The mapping passed one of its limits",
                UpstreamFailure::ComposedTooLarge { .. } => {
                    "The answers of the route's sources are too large together"
                }
                UpstreamFailure::TooManyCalls { .. } => "The route's sources would send too many requests",
                UpstreamFailure::Buffered { .. } => "recast holds as many upstream answers as it may",
                UpstreamFailure::Unavailable { .. } => {
                    "The upstream is failing; recast is not calling it for now"
                }
                UpstreamFailure::RateLimited { .. } => {
                    "The route's outbound rate limit is reached; nothing was sent"
                }
                UpstreamFailure::AuthFailed { .. } => {
                    "The route's token endpoint gave no access token; nothing was sent"
                }
                UpstreamFailure::TlsFailed(_) => "The TLS handshake with the upstream failed",
                UpstreamFailure::Paging { .. } => "The upstream's pages could not be followed",
                _ if *validating => "The live call to the upstream failed; nothing was stored",
                UpstreamFailure::Status(..) => "The upstream answered with an error",
                UpstreamFailure::Unreachable(_) => "The upstream could not be reached",
                UpstreamFailure::Timeout => "The upstream did not answer in time",
                UpstreamFailure::TooLarge { .. } => "The upstream's answer is too large",
                UpstreamFailure::NotJson(_) => "The upstream's answer is not JSON",
                UpstreamFailure::Encoding(_) => "The upstream's answer is in a coding recast cannot read",
            },
            ApiError::Starting => "recast is still loading its routes",
            ApiError::RouteUnavailable(_) => "This route cannot serve calls",
            ApiError::Storage(_) => "Storage failed; nothing was changed",
            ApiError::StoreUnavailable(_) => "The route database cannot be reached; nothing was changed",
            ApiError::Conflict(_) => "The route was changed elsewhere meanwhile; nothing was changed",
            ApiError::PreconditionFailed(_) => {
                "The route is not at the version the request names; nothing was changed"
            }
            ApiError::ResealRefused(_) => "The stored routes cannot be re-sealed now; nothing was changed",
            ApiError::Internal => "recast failed on this request",
            ApiError::Template { caller: true, .. } => {
                "The request does not give what the route's templates read"
            }
            ApiError::Template { caller: false, .. } => {
                "A source's request could not be made from the answers before it"
            }
            ApiError::Source { error, .. } => error.title(),
        }
    }

    fn detail(&self) -> String {
        match self {
            ApiError::InvalidJson(why)
            | ApiError::TooDeep(why)
            | ApiError::InvalidQuery(why)
            | ApiError::InvalidRequest(why)
            | ApiError::RouteUnavailable(why)
            | ApiError::Storage(why)
            | ApiError::StoreUnavailable(why)
            | ApiError::Conflict(why)
            | ApiError::PreconditionFailed(why)
            | ApiError::ResealRefused(why) => why.clone(),
            ApiError::InvalidBody(problems) | ApiError::InvalidRules(problems) => {
                match problems.len() {
                    1 => "1 problem; see `errors`".to_owned(),
                    n if n > MAX_LISTED => format!("{n} problems; the first {MAX_LISTED} are listed in `errors`"),
                    n => format!("{n} problems; see `errors`"),
                }
            }
            ApiError::BodyTooLarge { limit } => {
                format!("the limit is {limit} bytes (RECAST_MAX_REQUEST_BYTES)")
            }
            ApiError::PreviewLimit { limit, bound } => mapping_limit(*limit, *bound),
            ApiError::BodyUnreadable => "the connection broke while the body was sent".to_owned(),
            ApiError::BodyTimeout => "the whole body must arrive within RECAST_HEADER_TIMEOUT_MS".to_owned(),
            ApiError::NotFound => "no endpoint or route at this path".to_owned(),
            ApiError::MethodNotAllowed { allow } => format!("this path answers {allow}"),
            ApiError::ReadOnly => "this node serves the routes and consumers of its file (RECAST_ROUTES_FILE) and changes none: change the file (it is read again on SIGHUP and when it changes)".to_owned(),
            ApiError::Caller(refusal) => match refusal {
                Refusal::Unauthenticated { why, .. } | Refusal::Forbidden(why) => why.clone(),
                Refusal::Limited { requests, per_seconds, .. } => {
                    format!("the route allows each caller {requests} calls per {per_seconds} s")
                }
            },
            ApiError::AuthRequired => {
                "the route was registered with X-Mapped-Auth only, so every call must bring one; no call was made"
                    .to_owned()
            }
            ApiError::Upstream { failure, validating } => match failure {
                // Whoever registers the route is told what its configuration may lack; its
                // callers are not.
                UpstreamFailure::Status(status, asked) if *validating => {
                    format!("the upstream answered {status}{}", refusal_hint(*status, *asked))
                }
                UpstreamFailure::Status(status, _) => format!("the upstream answered {status}"),
                UpstreamFailure::Unreachable(why)
                | UpstreamFailure::Encoding(why)
                | UpstreamFailure::Unavailable { why, .. }
                | UpstreamFailure::RateLimited { why, .. }
                | UpstreamFailure::AuthFailed { why, .. }
                | UpstreamFailure::TlsFailed(why) => why.clone(),
                UpstreamFailure::Timeout => "the upstream did not answer within RECAST_UPSTREAM_TIMEOUT_MS".to_owned(),
                UpstreamFailure::TooLarge { limit } => {
                    format!("the answer is larger than {limit} bytes (RECAST_MAX_UPSTREAM_BYTES)")
                }
                UpstreamFailure::NotJson(why) => why.clone(),
                UpstreamFailure::Paging { location, why } => format!("{location}: {why}"),
                // Route callers need no token: they are not told the upstream's addresses.
                UpstreamFailure::NotAllowed(_) if !validating => {
                    "the route's upstream resolves to an address the outbound policy refuses; nothing was sent"
                        .to_owned()
                }
                UpstreamFailure::NotAllowed(why) => why.clone(),
                UpstreamFailure::MappingLimit { limit, bound } => mapping_limit(*limit, *bound),
                UpstreamFailure::ComposedTooLarge { limit } => format!(
                    "the answers of one call's sources passed {limit} bytes together (RECAST_MAX_COMPOSED_BYTES)"
                ),
                UpstreamFailure::TooManyCalls { limit } => format!(
                    "one call may send at most {limit} requests, retries counted (RECAST_MAX_SOURCE_CALLS); no more were sent"
                ),
                UpstreamFailure::Buffered { limit } => format!(
                    "the upstream answers and requests calls in flight hold passed {limit} bytes (RECAST_MAX_BUFFERED_BYTES) while this call was under way; it sent nothing more; try again in a moment"
                ),
            },
            ApiError::Starting => "try again in a moment".to_owned(),
            ApiError::AdminTokenRequired => {
                "send `Authorization: Bearer <token>` with the token recast was started with (RECAST_ADMIN_TOKEN)"
                    .to_owned()
            }
            ApiError::Overloaded => "RECAST_MAX_INFLIGHT requests are in flight; try again in a moment".to_owned(),
            ApiError::CompilersBusy { budget } => format!(
                "every compiler (one per core) stayed busy for {} s; try again in a moment",
                budget.as_secs()
            ),
            ApiError::CompileTooLong { budget } => format!(
                "compiling it took longer than {} s, the most one request's rules, patterns and templates may take; send fewer or simpler ones",
                budget.as_secs()
            ),
            ApiError::Buffered { limit } => format!(
                "the upstream answers calls in flight hold passed {limit} bytes (RECAST_MAX_BUFFERED_BYTES); try again in a moment"
            ),
            ApiError::Untaken { held, limit } => format!(
                "this HTTP/2 connection holds {held} bytes of answers its client has not taken, past {limit} (RECAST_MAX_RESPONSE_BYTES): read them (open the flow-control window) before asking for more"
            ),
            ApiError::Internal => {
                "a bug in recast stopped this request; it is logged with the request id".to_owned()
            }
            ApiError::Template { location, why, .. } => format!("{location}: {why}"),
            ApiError::Source { name, element: None, error } => format!("source `{name}`: {}", error.detail()),
            ApiError::Source { name, element: Some(element), error } => {
                format!("source `{name}`, element {element}: {}", error.detail())
            }
        }
    }

    /// The full answer: status, headers and problem body. `instance` is the request path.
    pub fn to_response(&self, instance: &str) -> http::Response<Full<Bytes>> {
        let (mut response, slug) = match self {
            ApiError::Source { name, element, error } => {
                (error.render(instance, Some((name, *element))), error.slug())
            }
            _ => (self.render(instance, None), self.slug()),
        };
        // The request's span names the problem as its `error.type`.
        if crate::telemetry::recording() {
            response.extensions_mut().insert(ProblemType(slug));
        }
        response
    }

    /// [`ApiError::to_response`], with the failed source's name in the body when there is one.
    fn render(&self, instance: &str, source: Option<(&str, Option<usize>)>) -> http::Response<Full<Bytes>> {
        let status = self.status();
        let mut body = Vec::with_capacity(256);
        body.extend_from_slice(b"{\"type\":");
        write::string(&mut body, &format!("{TYPE_BASE}{}", self.slug()));
        body.extend_from_slice(b",\"title\":");
        write::string(&mut body, self.title());
        body.extend_from_slice(b",\"status\":");
        write::u64(&mut body, u64::from(status.as_u16()));
        body.extend_from_slice(b",\"detail\":");
        match source {
            // The `forEach` element that failed, by its index.
            Some((_, Some(element))) => {
                write::string(&mut body, &format!("element {element}: {}", self.detail()))
            }
            _ => write::string(&mut body, &self.detail()),
        }
        body.extend_from_slice(b",\"instance\":");
        write::string(&mut body, instance);
        if let Some((name, element)) = source {
            body.extend_from_slice(b",\"source\":");
            write::string(&mut body, name);
            if let Some(element) = element {
                body.extend_from_slice(b",\"element\":");
                write::u64(&mut body, element as u64);
            }
        }
        match self {
            ApiError::InvalidRules(problems) | ApiError::InvalidBody(problems) => {
                body.extend_from_slice(b",\"errors\":");
                write_problems(&mut body, &problems[..problems.len().min(MAX_LISTED)]);
            }
            ApiError::Upstream { failure: UpstreamFailure::Status(upstream, _), .. } => {
                body.extend_from_slice(b",\"upstreamStatus\":");
                write::u64(&mut body, u64::from(upstream.as_u16()));
            }
            ApiError::Upstream { failure: UpstreamFailure::AuthFailed { error: Some(code), .. }, .. } => {
                // The RFC 6749 code alone: never the token endpoint's body.
                body.extend_from_slice(b",\"oauthError\":");
                write::string(&mut body, code);
            }
            _ => {}
        }
        body.push(b'}');
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        match self {
            ApiError::MethodNotAllowed { allow } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            ApiError::ReadOnly => {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET"));
            }
            ApiError::Upstream {
                failure:
                    UpstreamFailure::Unavailable { retry_after, .. }
                    | UpstreamFailure::RateLimited { retry_after, .. },
                ..
            } => {
                // Whole seconds, rounded up: a client that waits that long finds the cooldown over.
                let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
                headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
            }
            ApiError::Starting
            | ApiError::RouteUnavailable(_)
            | ApiError::Overloaded
            | ApiError::CompilersBusy { .. }
            | ApiError::Buffered { .. }
            | ApiError::Untaken { .. }
            | ApiError::Upstream { failure: UpstreamFailure::Buffered { .. }, .. }
            | ApiError::StoreUnavailable(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::AdminTokenRequired => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"recast admin\""),
                );
            }
            // RFC 6750 §3: `error="invalid_token"` when a credential was given.
            ApiError::Caller(Refusal::Unauthenticated { given, .. }) => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(if *given {
                        "Bearer realm=\"recast\", error=\"invalid_token\""
                    } else {
                        "Bearer realm=\"recast\""
                    }),
                );
            }
            ApiError::Caller(Refusal::Forbidden(_)) => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"recast\", error=\"insufficient_scope\""),
                );
            }
            // RFC 9110's Retry-After, and the RateLimit fields of draft-ietf-httpapi-ratelimit-headers.
            ApiError::Caller(Refusal::Limited { retry_after, requests, per_seconds }) => {
                let seconds = (retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1);
                headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
                if let Ok(value) = HeaderValue::try_from(format!("\"callers\";q={requests};w={per_seconds}"))
                {
                    headers.insert(RATELIMIT_POLICY, value);
                }
                if let Ok(value) = HeaderValue::try_from(format!("\"callers\";r=0;t={seconds}")) {
                    headers.insert(RATELIMIT, value);
                }
            }
            _ => {}
        }
        response
    }
}

/// The RateLimit fields (draft-ietf-httpapi-ratelimit-headers).
const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");

/// Writes `[{"location": ..., "message": ...}, ...]`.
pub fn write_problems(out: &mut Vec<u8>, problems: &[Problem]) {
    out.push(b'[');
    for (n, p) in problems.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"location\":");
        write::string(out, &p.location);
        out.extend_from_slice(b",\"message\":");
        write::string(out, &p.message);
        out.push(b'}');
    }
    out.push(b']');
}

impl UpstreamFailure {
    /// The `kind` label of `recast_upstream_errors_total`.
    pub(super) fn kind(&self) -> crate::metrics::UpstreamErrorKind {
        use crate::metrics::UpstreamErrorKind;
        match self {
            UpstreamFailure::Status(status, _) if status.is_client_error() => UpstreamErrorKind::Status4xx,
            UpstreamFailure::Status(status, _) if status.is_server_error() => UpstreamErrorKind::Status5xx,
            UpstreamFailure::Status(..) => UpstreamErrorKind::StatusOther,
            UpstreamFailure::Unreachable(_) => UpstreamErrorKind::Unreachable,
            UpstreamFailure::Timeout => UpstreamErrorKind::Timeout,
            UpstreamFailure::TooLarge { .. } => UpstreamErrorKind::TooLarge,
            UpstreamFailure::NotJson(_) => UpstreamErrorKind::NotJson,
            UpstreamFailure::Encoding(_) => UpstreamErrorKind::Encoding,
            UpstreamFailure::Paging { .. } => UpstreamErrorKind::Paging,
            UpstreamFailure::NotAllowed(_) => UpstreamErrorKind::NotAllowed,
            UpstreamFailure::MappingLimit { .. }
            | UpstreamFailure::ComposedTooLarge { .. }
            | UpstreamFailure::TooManyCalls { .. } => UpstreamErrorKind::MappingLimit,
            UpstreamFailure::Buffered { .. } => UpstreamErrorKind::Buffered,
            UpstreamFailure::Unavailable { .. } => UpstreamErrorKind::BreakerOpen,
            UpstreamFailure::RateLimited { .. } => UpstreamErrorKind::RateLimited,
            UpstreamFailure::AuthFailed { .. } => UpstreamErrorKind::AuthFailed,
            UpstreamFailure::TlsFailed(_) => UpstreamErrorKind::Tls,
        }
    }
}

/// The problem type of an error answer, its `error.type`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProblemType(pub &'static str);

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every kind. `slug` matches exhaustively, so a new variant must get a slug
    /// there; it must be added here by hand, and its slug to `SLUGS`.
    fn one_of_each() -> Vec<ApiError> {
        let upstream = |failure, validating| ApiError::Upstream { failure, validating };
        let failures = || {
            [
                UpstreamFailure::Status(StatusCode::NOT_FOUND, None),
                UpstreamFailure::Unreachable("refused".to_owned()),
                UpstreamFailure::Timeout,
                UpstreamFailure::TooLarge { limit: 1 },
                UpstreamFailure::NotJson("html".to_owned()),
                UpstreamFailure::Encoding("zstd".to_owned()),
                UpstreamFailure::NotAllowed("private".to_owned()),
                UpstreamFailure::MappingLimit { limit: Limit::Built, bound: 1 },
                UpstreamFailure::Unavailable {
                    why: "open".to_owned(),
                    retry_after: std::time::Duration::from_millis(1500),
                },
                UpstreamFailure::RateLimited {
                    why: "over".to_owned(),
                    retry_after: std::time::Duration::from_millis(300),
                },
                UpstreamFailure::AuthFailed {
                    why: "refused".to_owned(),
                    error: Some("invalid_client".to_owned()),
                },
                UpstreamFailure::TlsFailed("UnknownIssuer".to_owned()),
                UpstreamFailure::ComposedTooLarge { limit: 1 },
                UpstreamFailure::TooManyCalls { limit: 1 },
                UpstreamFailure::Buffered { limit: 1 },
            ]
        };
        let mut all = vec![
            ApiError::InvalidJson(String::new()),
            ApiError::TooDeep(String::new()),
            ApiError::InvalidQuery(String::new()),
            ApiError::InvalidRequest(String::new()),
            ApiError::InvalidBody(Vec::new()),
            ApiError::InvalidRules(Vec::new()),
            ApiError::PreviewLimit { limit: Limit::Steps, bound: 1 },
            ApiError::BodyTooLarge { limit: 1 },
            ApiError::BodyUnreadable,
            ApiError::BodyTimeout,
            ApiError::NotFound,
            ApiError::MethodNotAllowed { allow: "GET" },
            ApiError::ReadOnly,
            ApiError::AuthRequired,
            ApiError::AdminTokenRequired,
            ApiError::Caller(Refusal::Unauthenticated { given: false, why: String::new() }),
            ApiError::Caller(Refusal::Forbidden(String::new())),
            ApiError::Caller(Refusal::Limited {
                retry_after: std::time::Duration::from_millis(1500),
                requests: 1,
                per_seconds: 1,
            }),
            ApiError::Starting,
            ApiError::Overloaded,
            ApiError::Buffered { limit: 1 },
            ApiError::Untaken { held: 2, limit: 1 },
            ApiError::RouteUnavailable(String::new()),
            ApiError::Storage(String::new()),
            ApiError::StoreUnavailable(String::new()),
            ApiError::Conflict(String::new()),
            ApiError::PreconditionFailed(String::new()),
            ApiError::ResealRefused(String::new()),
            ApiError::Internal,
            ApiError::Template { location: "/sources/a/path".to_owned(), why: String::new(), caller: true },
            ApiError::Template { location: "/sources/a/path".to_owned(), why: String::new(), caller: false },
            ApiError::Source { name: "a".to_owned(), element: None, error: Box::new(ApiError::Internal) },
        ];
        all.extend(failures().into_iter().map(|f| upstream(f, false)));
        all.extend(failures().into_iter().map(|f| upstream(f, true)));
        all
    }

    #[test]
    fn an_open_breaker_answers_503_with_the_rest_of_its_cooldown_rounded_up() {
        for (millis, seconds) in [(1500, "2"), (2000, "2"), (1, "1"), (0, "1")] {
            let failure = UpstreamFailure::Unavailable {
                why: "open".to_owned(),
                retry_after: std::time::Duration::from_millis(millis),
            };
            for validating in [false, true] {
                let response =
                    ApiError::Upstream { failure: failure.clone(), validating }.to_response("/v1/x");
                assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert_eq!(response.headers()[header::RETRY_AFTER], seconds, "{millis} ms");
            }
        }
    }

    #[test]
    fn a_refusal_after_a_certificate_was_asked_for_is_explained_to_the_registration_only() {
        let detail = |status: u16, asked, validating| {
            let failure = UpstreamFailure::Status(StatusCode::from_u16(status).unwrap(), asked);
            ApiError::Upstream { failure, validating }.detail()
        };
        let none = Some(CertificateAsked::NoneGiven);
        assert!(detail(400, none, true).ends_with("and the route presents none (`tls.clientCert`)"));
        assert!(detail(403, Some(CertificateAsked::Given), true).contains("was given the route's"));
        assert_eq!(detail(400, none, false), "the upstream answered 400 Bad Request");
        assert_eq!(detail(404, none, true), "the upstream answered 404 Not Found");
        assert_eq!(detail(400, None, true), "the upstream answered 400 Bad Request");
    }

    #[test]
    fn slugs_lists_exactly_the_problem_types_answered() {
        let mut answered: Vec<&str> = one_of_each().iter().map(ApiError::slug).collect();
        answered.sort_unstable();
        answered.dedup();
        let mut listed = SLUGS.to_vec();
        listed.sort_unstable();
        assert_eq!(answered, listed);
    }

    #[test]
    fn every_problem_is_an_error_status_with_a_problem_body() {
        for error in one_of_each() {
            let status = error.status();
            assert!(status.is_client_error() || status.is_server_error(), "{error:?}: {status}");
            let response = error.to_response("/x");
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        }
    }
}
