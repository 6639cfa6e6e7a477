//! The checks of a registration's members that a route's own upstream and a composed route's
//! sources share (SPEC §2.1, §2.3): URLs, paths, methods, credentials and the upstream settings
//! (`cache`, `retry`, `rateLimit`, `tls`, `breaker`), each problem at its location.

use http::HeaderValue;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::config::{Auth, AuthKind, CacheSettings};
use crate::rules::Problem;
use crate::upstream::{
    BreakerScope, ClientAuth, ClientCredentials, Failure, LimitScope, MAX_ATTEMPTS, MAX_BURST, MAX_RATE,
    MAX_WAIT_MS, RateLimitSettings, RetryOn, RetrySettings, RouteTls, TlsSettings, TokenRequest,
    retriable_status,
};

/// Methods a route and its upstream may use.
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// `authHeader` as sent: a `type` and its members (a `token`, or OAuth2 client credentials).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthHeader {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_url: Option<String>,
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub client_secret: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub client_auth: Option<String>,
}

impl std::fmt::Debug for AuthHeader {
    // Its secrets are never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let masked = |secret: &Option<String>| secret.as_ref().map(|_| "***");
        f.debug_struct("AuthHeader")
            .field("kind", &self.kind)
            .field("token", &masked(&self.token))
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &masked(&self.client_secret))
            .field("scope", &self.scope)
            .field("audience", &self.audience)
            .field("client_auth", &self.client_auth)
            .finish()
    }
}

impl AuthHeader {
    /// The members of the OAuth2 client credentials type that were given, by name.
    fn oauth2_members(&self) -> [(&'static str, bool); 6] {
        [
            ("tokenUrl", self.token_url.is_some()),
            ("clientId", self.client_id.is_some()),
            ("clientSecret", self.client_secret.is_some()),
            ("scope", self.scope.is_some()),
            ("audience", self.audience.is_some()),
            ("clientAuth", self.client_auth.is_some()),
        ]
    }
}

/// `breaker`: absent or `null` for the origin's breaker; else an object whose `scope` is
/// `"origin"` (the default) or `"route"`, a breaker of the route's own.
pub(super) fn breaker_settings(
    given: Option<&serde_json::Value>,
    problems: &mut Vec<Problem>,
) -> BreakerScope {
    let example = r#"{"scope": "route"}"#;
    let Some(members) = settings_object(given, "breaker", &["scope"], example, problems) else {
        return BreakerScope::Origin;
    };
    match members.get("scope").map(|s| s.as_str()) {
        None | Some(Some("origin")) => BreakerScope::Origin,
        Some(Some("route")) => BreakerScope::Route,
        Some(_) => {
            problems.push(Problem::new("/breaker/scope", "must be \"origin\" or \"route\""));
            BreakerScope::Origin
        }
    }
}

/// A settings member of a registration (`cache`, `retry`, `rateLimit`): `None` when absent or
/// `null`; its members when it is an object, with a problem for each one not `known`; else a
/// problem at `/{name}` that shows `example`, and `None`.
fn settings_object<'v>(
    given: Option<&'v serde_json::Value>,
    name: &str,
    known: &[&str],
    example: &str,
    problems: &mut Vec<Problem>,
) -> Option<&'v serde_json::Map<String, serde_json::Value>> {
    let members = match given? {
        serde_json::Value::Null => return None,
        serde_json::Value::Object(members) => members,
        _ => {
            problems.push(Problem::new(
                format!("/{name}"),
                format!("must be an object such as {example}, or null"),
            ));
            return None;
        }
    };
    let listed: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
    let takes = match listed.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => "nothing".to_owned(),
    };
    for member in members.keys().filter(|m| !known.contains(&m.as_str())) {
        problems.push(Problem::new(
            format!("/{name}/{member}"),
            format!("unknown member; `{name}` takes {takes}"),
        ));
    }
    Some(members)
}

/// The longest `ttlSeconds` or `staleWhileRevalidateSeconds`: a year.
const MAX_CACHE_SECONDS: u64 = 365 * 24 * 3600;

/// `cache`: absent or `null` for none; else an object with a `ttlSeconds` and an optional
/// `staleWhileRevalidateSeconds` (0 when absent), each a whole number of seconds from 0 to a year,
/// on a route called with GET.
pub(super) fn cache_settings(
    given: Option<&serde_json::Value>,
    method: &str,
    problems: &mut Vec<Problem>,
) -> Option<CacheSettings> {
    let before = problems.len();
    let known = ["ttlSeconds", "staleWhileRevalidateSeconds"];
    let members = settings_object(given, "cache", &known, r#"{"ttlSeconds": 60}"#, problems)?;
    if method != "GET" {
        problems.push(Problem::new(
            "/cache",
            format!("only a route called with GET may have a cache; this one is called with {method}"),
        ));
    }
    let mut seconds = |name: &str, required: bool| match members.get(name) {
        None if required => {
            problems.push(Problem::new(format!("/cache/{name}"), "missing required member"));
            0
        }
        None => 0,
        Some(value) => match value.as_u64() {
            Some(n) if n <= MAX_CACHE_SECONDS => n,
            _ => {
                problems.push(Problem::new(
                    format!("/cache/{name}"),
                    format!("must be a whole number of seconds from 0 to {MAX_CACHE_SECONDS} (a year)"),
                ));
                0
            }
        },
    };
    let ttl_seconds = seconds("ttlSeconds", true);
    let stale_while_revalidate_seconds = seconds("staleWhileRevalidateSeconds", false);
    (problems.len() == before).then_some(CacheSettings { ttl_seconds, stale_while_revalidate_seconds })
}

/// `retry`: absent or `null` for none; else an object with `attempts` (1 to 5), `on` (a list of
/// 429 or 5xx statuses, `"timeout"` and `"reset"`) and `unsafe` (a boolean, false when absent),
/// which an upstream method that is not idempotent (POST, PATCH) needs.
pub(super) fn retry_settings(
    given: Option<&serde_json::Value>,
    upstream_method: &str,
    problems: &mut Vec<Problem>,
) -> Option<RetrySettings> {
    use serde_json::Value;
    let before = problems.len();
    let example = r#"{"attempts": 2, "on": [503, "timeout"]}"#;
    let members = settings_object(given, "retry", &["attempts", "on", "unsafe"], example, problems)?;
    let attempts = match members.get("attempts").map(Value::as_u64) {
        None => {
            problems.push(Problem::new("/retry/attempts", "missing required member"));
            0
        }
        Some(Some(n)) if (1..=u64::from(MAX_ATTEMPTS)).contains(&n) => n as u8,
        Some(_) => {
            problems.push(Problem::new(
                "/retry/attempts",
                format!("must be a whole number from 1 to {MAX_ATTEMPTS}: how many times a failed call may be sent again"),
            ));
            0
        }
    };
    let mut on = Vec::new();
    match members.get("on") {
        None => problems.push(Problem::new("/retry/on", "missing required member")),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                let what = match item {
                    Value::Number(n) => n
                        .as_u64()
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|&n| retriable_status(n))
                        .map(RetryOn::Status),
                    Value::String(s) if s == "timeout" => Some(RetryOn::Failure(Failure::Timeout)),
                    Value::String(s) if s == "reset" => Some(RetryOn::Failure(Failure::Reset)),
                    _ => None,
                };
                match what {
                    Some(what) if !on.contains(&what) => on.push(what),
                    Some(_) => {}
                    None => problems.push(Problem::new(
                        format!("/retry/on/{i}"),
                        "must be 429 or a 5xx status, \"timeout\" or \"reset\"",
                    )),
                }
            }
        }
        Some(_) => problems.push(Problem::new(
            "/retry/on",
            "must be a list of what is retried, such as [502, 503, 504, \"timeout\", \"reset\"]",
        )),
    }
    let allow_unsafe = match members.get("unsafe") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            problems.push(Problem::new("/retry/unsafe", "must be true or false"));
            false
        }
    };
    if !allow_unsafe && matches!(upstream_method, "POST" | "PATCH") {
        problems.push(Problem::new(
            "/retry",
            format!(
                "the upstream is called with {upstream_method}, which is not idempotent: a call sent again may be acted on twice; add \"unsafe\": true to retry it anyway"
            ),
        ));
    }
    (problems.len() == before).then_some(RetrySettings { attempts, on, allow_unsafe })
}

/// `rateLimit`: absent or `null` for none; else an object with `requestsPerSecond` (above 0, at
/// most a million; fractions allowed), `burst` (1 to a million; default: the rate rounded up),
/// `scope` (`"route"`, the default, or `"origin"`) and `maxWaitMs` (0, the default, to 60000).
pub(super) fn rate_limit_settings(
    given: Option<&serde_json::Value>,
    problems: &mut Vec<Problem>,
) -> Option<RateLimitSettings> {
    use serde_json::Value;
    let before = problems.len();
    let known = ["requestsPerSecond", "burst", "scope", "maxWaitMs"];
    let example = r#"{"requestsPerSecond": 10, "burst": 5}"#;
    let members = settings_object(given, "rateLimit", &known, example, problems)?;
    let rate = match members.get("requestsPerSecond").map(Value::as_f64) {
        None => {
            problems.push(Problem::new("/rateLimit/requestsPerSecond", "missing required member"));
            1.0
        }
        // At least one call a day: a slower quota is not one an API grants.
        Some(Some(r)) if (1.0 / 86_400.0..=MAX_RATE).contains(&r) => r,
        Some(_) => {
            problems.push(Problem::new(
                "/rateLimit/requestsPerSecond",
                format!("must be a number of calls per second from one a day (0.0000116) to {MAX_RATE}"),
            ));
            1.0
        }
    };
    let burst = match members.get("burst") {
        None => rate.ceil().clamp(1.0, f64::from(MAX_BURST)) as u32,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=u64::from(MAX_BURST)).contains(&n) => n as u32,
            _ => {
                problems.push(Problem::new(
                    "/rateLimit/burst",
                    format!("must be a whole number of calls from 1 to {MAX_BURST}"),
                ));
                1
            }
        },
    };
    let scope = match members.get("scope").map(|s| s.as_str()) {
        None | Some(Some("route")) => LimitScope::Route,
        Some(Some("origin")) => LimitScope::Origin,
        Some(_) => {
            problems.push(Problem::new("/rateLimit/scope", "must be \"route\" or \"origin\""));
            LimitScope::Route
        }
    };
    let max_wait_ms = match members.get("maxWaitMs") {
        None => 0,
        Some(value) => match value.as_u64() {
            Some(n) if n <= MAX_WAIT_MS => n,
            _ => {
                problems.push(Problem::new(
                    "/rateLimit/maxWaitMs",
                    format!("must be a whole number of milliseconds from 0 to {MAX_WAIT_MS}"),
                ));
                0
            }
        },
    };
    let settings = RateLimitSettings { requests_per_second: rate, burst, scope, max_wait_ms };
    if problems.len() == before && !settings.fits() {
        problems.push(Problem::new(
            "/rateLimit/burst",
            format!(
                "a burst of {burst} at {rate} a second would take too long to come back; give a smaller burst or a higher rate"
            ),
        ));
    }
    (problems.len() == before).then_some(settings)
}

/// `tls`: absent or `null` for none; else an object with `ca` (PEM certificates of the
/// authorities trusted for this upstream, besides the others), and `clientCert` (a PEM chain, leaf
/// first) with `clientKey` (its PEM key), for an https upstream.
pub(super) fn tls_settings(
    given: Option<&serde_json::Value>,
    base_url: &str,
    problems: &mut Vec<Problem>,
) -> Option<TlsSettings> {
    let before = problems.len();
    let known = ["ca", "clientCert", "clientKey"];
    let example = r#"{"ca": "-----BEGIN CERTIFICATE-----\n..."}"#;
    let members = settings_object(given, "tls", &known, example, problems)?;
    let mut text = |name: &str| match members.get(name) {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(pem)) if !pem.trim().is_empty() => Some(pem.clone()),
        Some(_) => {
            problems.push(Problem::new(format!("/tls/{name}"), "must be PEM text"));
            None
        }
    };
    let settings =
        TlsSettings { ca: text("ca"), client_cert: text("clientCert"), client_key: text("clientKey") };
    if problems.len() == before
        && settings.ca.is_none()
        && settings.client_cert.is_none()
        && settings.client_key.is_none()
    {
        problems
            .push(Problem::new("/tls", "give `ca`, or `clientCert` with `clientKey`, or leave `tls` out"));
    }
    if !base_url.to_ascii_lowercase().starts_with("https://") {
        problems.push(Problem::new("/tls", "`tls` is for an https upstream; the baseUrl is not https"));
    }
    if problems.len() == before
        && let Err((member, why)) = RouteTls::new(&settings)
    {
        problems.push(Problem::new(format!("/tls/{member}"), why));
    }
    (problems.len() == before).then_some(settings)
}

pub(super) fn json_text(value: Option<&RawValue>) -> Option<String> {
    value.map(|v| v.get().to_owned()).filter(|text| text != "null")
}

/// One or more non-empty segments of URL path characters; no `.` or `..` segments.
pub(super) fn route_path(path: &str, problems: &mut Vec<Problem>) -> String {
    let path = path.strip_prefix('/').unwrap_or(path);
    let bad = |why: &str| Problem::new("/path", why.to_owned());
    if path.is_empty() {
        problems.push(bad("the path needs at least one segment"));
    } else if path.split('/').any(|s| s.is_empty()) {
        problems.push(bad("the path has an empty segment"));
    } else if path.split('/').any(|s| s == "." || s == "..") {
        problems.push(bad("the path may not have `.` or `..` segments"));
    } else if !path.bytes().all(|b| b == b'/' || is_path_char(b)) {
        problems.push(bad("the path may hold letters, digits and -._~!$&'()*+,;=:@ only"));
    }
    path.to_owned()
}

/// Characters of a URL path segment that need no percent-encoding (RFC 3986 `pchar`).
fn is_path_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

/// An HTTP method, case-insensitive, GET when not given.
pub(super) fn method_of(given: Option<&str>, at: &str, problems: &mut Vec<Problem>) -> String {
    let method = given.unwrap_or("GET").trim().to_ascii_uppercase();
    if !METHODS.contains(&method.as_str()) {
        problems.push(Problem::new(at, format!("method must be one of {}", METHODS.join(", "))));
    }
    method
}

pub(super) fn auth(given: &AuthHeader, at: &str, problems: &mut Vec<Problem>) -> Auth {
    let kind = match given.kind.to_ascii_lowercase().as_str() {
        "bearer" => AuthKind::Bearer,
        "basic" => AuthKind::Basic,
        "none" => AuthKind::None,
        "oauth2clientcredentials" => return oauth2(given, at, problems),
        "runtime" => {
            if given.token.is_some() || given.oauth2_members().iter().any(|(_, given)| *given) {
                problems.push(Problem::new(
                    at,
                    "a Runtime auth takes nothing but its `type`: it sends the caller's `X-Mapped-Auth`",
                ));
            }
            return Auth::Runtime;
        }
        _ => {
            problems.push(Problem::new(
                format!("{at}/type"),
                "must be Bearer, Basic, None, Runtime or OAuth2ClientCredentials",
            ));
            return Auth::None;
        }
    };
    for (member, _) in given.oauth2_members().into_iter().filter(|(_, given)| *given) {
        problems.push(Problem::new(
            format!("{at}/{member}"),
            format!("`{member}` belongs to the type OAuth2ClientCredentials, not {}", kind.name()),
        ));
    }
    let token = given.token.clone().filter(|t| !t.is_empty());
    if kind != AuthKind::None && token.is_none() {
        problems.push(Problem::new(format!("{at}/token"), format!("a {} token is required", kind.name())));
    }
    if let Some(token) = &token {
        let value = match kind {
            AuthKind::Bearer | AuthKind::Basic => format!("{} {token}", kind.name()),
            AuthKind::None => token.clone(),
        };
        if HeaderValue::from_str(&value).is_err() {
            problems.push(Problem::new(
                format!("{at}/token"),
                "not a valid header value (control characters such as CR or LF)",
            ));
        }
    }
    Auth::Stored { kind, token }
}

/// The longest client id, client secret, scope or audience taken.
const MAX_CREDENTIAL: usize = 4096;

/// `{"type": "OAuth2ClientCredentials", "tokenUrl", "clientId", "clientSecret", "scope",
/// "audience", "clientAuth"}`: the token URL, client id and secret required; the scope and
/// audience optional; `clientAuth` `basic` (the default) or `body`.
fn oauth2(given: &AuthHeader, at: &str, problems: &mut Vec<Problem>) -> Auth {
    let before = problems.len();
    if given.token.is_some() {
        problems.push(Problem::new(
            format!("{at}/token"),
            "an OAuth2ClientCredentials auth takes no `token`: recast asks `tokenUrl` for tokens",
        ));
    }
    let mut text = |member: &str, value: &Option<String>, required: bool| -> String {
        let location = format!("{at}/{member}");
        match value {
            None if required => problems.push(Problem::new(location, "missing required member")),
            None => {}
            Some(text) if text.is_empty() => problems.push(Problem::new(location, "must not be empty")),
            Some(text) if text.len() > MAX_CREDENTIAL => {
                problems.push(Problem::new(location, format!("must be at most {MAX_CREDENTIAL} bytes")))
            }
            Some(text) if text.chars().any(char::is_control) => {
                problems.push(Problem::new(location, "must not hold control characters"))
            }
            Some(_) => {}
        }
        value.clone().unwrap_or_default()
    };
    let token_url = text("tokenUrl", &given.token_url, true).trim().to_owned();
    let client_id = text("clientId", &given.client_id, true);
    let client_secret = text("clientSecret", &given.client_secret, true);
    let scope = given.scope.as_ref().map(|_| text("scope", &given.scope, false));
    let audience = given.audience.as_ref().map(|_| text("audience", &given.audience, false));
    if let Some(scope) = &scope
        && !scope.is_empty()
        && !scope.split(' ').all(|token| {
            // RFC 6749 §3.3: scope tokens of %x21 / %x23-5B / %x5D-7E, one space apart.
            !token.is_empty() && token.bytes().all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E))
        })
    {
        problems.push(Problem::new(
            format!("{at}/scope"),
            "must be scope tokens one space apart, of printable characters other than `\\` and `\"`",
        ));
    }
    let client_auth = match given.client_auth.as_deref() {
        None | Some("basic") => ClientAuth::Basic,
        Some("body") => ClientAuth::Body,
        Some(_) => {
            problems.push(Problem::new(format!("{at}/clientAuth"), "must be \"basic\" or \"body\""));
            ClientAuth::Basic
        }
    };
    if given.token_url.as_ref().is_some_and(|url| !url.is_empty())
        && let Err(why) = TokenUrl::check(&token_url)
    {
        problems.push(Problem::new(format!("{at}/tokenUrl"), why));
    }
    if problems.len() != before {
        return Auth::None;
    }
    let credentials = ClientCredentials { token_url, client_id, client_secret, scope, audience, client_auth };
    if let Err(why) = TokenRequest::new(&credentials) {
        problems.push(Problem::new(format!("{at}/tokenUrl"), why));
    }
    Auth::OAuth2(credentials)
}

/// A checked `tokenUrl`: a `baseUrl` that may have a query.
struct TokenUrl;

impl TokenUrl {
    fn check(text: &str) -> Result<(), String> {
        let mut url = url::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
        if url.fragment().is_some() {
            return Err("the token URL may not have a fragment".into());
        }
        url.set_query(None);
        BaseUrl::parse(url.as_str()).map(|_| ())
    }
}

/// A checked `baseUrl`: http or https, a host, no credentials, query or fragment.
pub(super) struct BaseUrl(pub(super) url::Url);

impl BaseUrl {
    pub(super) fn parse(text: &str) -> Result<BaseUrl, String> {
        let url = url::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("the scheme must be http or https, not `{}`", url.scheme()));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err("the URL has no host".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("the URL may not hold credentials (`user:pass@`); use `authHeader`".into());
        }
        // The URL standard lets characters such as `{` or `}` into host names; HTTP and DNS do not.
        if let Some(domain) = url.domain()
            && !domain.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(format!("`{domain}` is not a valid host name"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err("the base URL may not have a query or fragment; use `originalRoute.queries`".into());
        }
        Ok(BaseUrl(url))
    }
}

/// A checked `originalRoute.path`: the path below the base URL, and its query pairs.
pub(super) struct UpstreamPath {
    pub(super) query: Vec<(String, String)>,
}

impl UpstreamPath {
    pub(super) fn parse(text: &str) -> Result<UpstreamPath, String> {
        let (path, query) = text.split_once('?').unwrap_or((text, ""));
        if path.contains("://") || path.starts_with("//") {
            return Err("the path must be relative to the base URL, not a URL".into());
        }
        if path.contains('\\') || path.contains('#') {
            return Err("the path may not hold `\\` or `#`".into());
        }
        let decoded = percent_decode(path);
        if decoded.split('/').any(|s| s == "." || s == "..") {
            return Err("the path may not have `.` or `..` segments".into());
        }
        if !path.bytes().all(|b| b == b'/' || b == b'%' || is_path_char(b)) {
            return Err("the path holds characters that must be percent-encoded".into());
        }
        let query = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        Ok(UpstreamPath { query })
    }
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}
