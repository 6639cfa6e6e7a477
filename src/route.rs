//! Routes (SPEC §2.1, §2.2): the registration a client sends, validated into a [`RouteConfig`],
//! compiled into a [`Route`], and turned into the upstream request of one call. No IO here: the
//! server calls, the store keeps, this module decides what a route is and what a call sends.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Uri};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::metrics::StatusCounts;
use crate::rules::{Compiled, Limits, Problem, compile_json};
use crate::storage::{SCHEMA_VERSION, StoredRoute};

/// The body of `POST /v1/mapping` and `PUT /v1/routes/{uuid}` as sent.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registration {
    pub path: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    pub original_route: OriginalRoute,
    #[serde(default)]
    pub pre_configured_queries: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub pre_configured_headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub pre_configured_body: Option<Box<RawValue>>,
    #[serde(default)]
    pub auth_header: Option<AuthHeader>,
    pub rules_as_string: Box<RawValue>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OriginalRoute {
    pub original_api: OriginalApi,
    pub path: String,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub queries: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub body: Option<Box<RawValue>>,
    #[serde(default)]
    pub auth_header: Option<AuthHeader>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OriginalApi {
    pub base_url: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthHeader {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub token: Option<String>,
}

/// A validated route configuration: what is stored, and what [`Route`] is compiled from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteConfig {
    /// The route's own path below `/v1/{uuid}/`, without a leading slash.
    pub path: String,
    /// The method clients call the route with.
    pub method: String,
    pub base_url: String,
    /// `originalRoute.path` as given (it may hold a query string).
    pub upstream_path: String,
    pub upstream_method: String,
    pub headers: BTreeMap<String, String>,
    pub queries: BTreeMap<String, String>,
    /// JSON text of `originalRoute.body`.
    pub body: Option<String>,
    pub pre_queries: BTreeMap<String, String>,
    pub pre_headers: BTreeMap<String, String>,
    /// JSON text of `preConfiguredBody`.
    pub pre_body: Option<String>,
    pub auth: Auth,
    /// The `rulesAsString` value as sent (a rules object, or a string holding one), as JSON text.
    pub rules: String,
}

/// How a route authenticates to its upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "camelCase")]
pub enum Auth {
    /// No `authHeader` and no `X-Mapped-Auth` at registration: nothing stored; a caller's
    /// `X-Mapped-Auth` is still passed on.
    None,
    /// Registered with `X-Mapped-Auth` only: every call must bring one.
    Runtime,
    /// An `authHeader` was given and is stored.
    Stored { kind: AuthKind, token: Option<String> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthKind {
    Bearer,
    Basic,
    None,
}

impl AuthKind {
    pub fn name(self) -> &'static str {
        match self {
            AuthKind::Bearer => "Bearer",
            AuthKind::Basic => "Basic",
            AuthKind::None => "None",
        }
    }
}

/// Methods a route and its upstream may use.
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// Headers a route may not configure: set by recast itself, hop-by-hop, or secrets that belong
/// in `authHeader`.
const RESERVED_HEADERS: [&str; 13] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "authorization",
    "x-mapped-auth",
];

impl Registration {
    /// Checks the registration and returns the configuration to store, or every problem found
    /// (located by JSON pointer into the body). `runtime_auth` says whether the request carried
    /// `X-Mapped-Auth`. An update passes the route's `path`, which it may repeat but not change.
    pub fn validate(self, runtime_auth: bool, fixed_path: Option<&str>) -> Result<RouteConfig, Vec<Problem>> {
        let mut problems = Vec::new();
        let path = match (&self.path, fixed_path) {
            (Some(given), Some(fixed)) if given.strip_prefix('/').unwrap_or(given) != fixed => {
                problems.push(Problem::new("/path", "the path of a route cannot change"));
                fixed.to_owned()
            }
            (_, Some(fixed)) => fixed.to_owned(),
            (Some(path), None) => route_path(path, &mut problems),
            (None, None) => {
                problems.push(Problem::new("/path", "missing required member `path`"));
                String::new()
            }
        };
        let method = method_of(self.method.as_deref(), "/method", &mut problems);
        let original = &self.original_route;
        let upstream_method = method_of(original.method.as_deref(), "/originalRoute/method", &mut problems);
        let base_url = original.original_api.base_url.trim().to_owned();
        if let Err(why) = BaseUrl::parse(&base_url) {
            problems.push(Problem::new("/originalRoute/originalApi/baseUrl", why));
        }
        if let Err(why) = UpstreamPath::parse(&original.path) {
            problems.push(Problem::new("/originalRoute/path", why));
        }
        let headers = original.headers.clone().unwrap_or_default();
        check_headers(&headers, "/originalRoute/headers", &mut problems);
        let pre_headers = self.pre_configured_headers.clone().unwrap_or_default();
        check_headers(&pre_headers, "/preConfiguredHeaders", &mut problems);
        let auth = match (&self.auth_header, &original.auth_header) {
            (Some(top), Some(inner)) if top != inner => {
                problems.push(Problem::new(
                    "/authHeader",
                    "`authHeader` is given at the top level and in `originalRoute` with different values",
                ));
                Auth::None
            }
            (Some(given), _) => auth(given, "/authHeader", &mut problems),
            (None, Some(given)) => auth(given, "/originalRoute/authHeader", &mut problems),
            (None, None) if runtime_auth => Auth::Runtime,
            (None, None) => Auth::None,
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(RouteConfig {
            path,
            method,
            base_url,
            upstream_path: original.path.clone(),
            upstream_method,
            headers,
            queries: original.queries.clone().unwrap_or_default(),
            body: json_text(original.body.as_deref()),
            pre_queries: self.pre_configured_queries.unwrap_or_default(),
            pre_headers,
            pre_body: json_text(self.pre_configured_body.as_deref()),
            auth,
            rules: self.rules_as_string.get().to_owned(),
        })
    }
}

fn json_text(value: Option<&RawValue>) -> Option<String> {
    value.map(|v| v.get().to_owned()).filter(|text| text != "null")
}

/// One or more non-empty segments of URL path characters; no `.` or `..` segments.
fn route_path(path: &str, problems: &mut Vec<Problem>) -> String {
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
fn method_of(given: Option<&str>, at: &str, problems: &mut Vec<Problem>) -> String {
    let method = given.unwrap_or("GET").trim().to_ascii_uppercase();
    if !METHODS.contains(&method.as_str()) {
        problems.push(Problem::new(at, format!("method must be one of {}", METHODS.join(", "))));
    }
    method
}

fn check_headers(headers: &BTreeMap<String, String>, at: &str, problems: &mut Vec<Problem>) {
    for (name, value) in headers {
        let at = format!("{at}/{name}");
        match HeaderName::from_bytes(name.as_bytes()) {
            Err(_) => problems.push(Problem::new(&at, "not a valid header name")),
            Ok(header) if RESERVED_HEADERS.contains(&header.as_str()) => problems.push(Problem::new(
                &at,
                format!("`{name}` cannot be configured (use `authHeader` for credentials)"),
            )),
            Ok(_) => {}
        }
        if HeaderValue::from_str(value).is_err() {
            problems
                .push(Problem::new(&at, "not a valid header value (control characters such as CR or LF)"));
        }
    }
}

fn auth(given: &AuthHeader, at: &str, problems: &mut Vec<Problem>) -> Auth {
    let kind = match given.kind.to_ascii_lowercase().as_str() {
        "bearer" => AuthKind::Bearer,
        "basic" => AuthKind::Basic,
        "none" => AuthKind::None,
        _ => {
            problems.push(Problem::new(format!("{at}/type"), "must be Bearer, Basic or None"));
            return Auth::None;
        }
    };
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

/// A checked `baseUrl`: http or https, a host, no credentials, query or fragment.
struct BaseUrl(url::Url);

impl BaseUrl {
    fn parse(text: &str) -> Result<BaseUrl, String> {
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
struct UpstreamPath {
    path: String,
    query: Vec<(String, String)>,
}

impl UpstreamPath {
    fn parse(text: &str) -> Result<UpstreamPath, String> {
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
        Ok(UpstreamPath { path: path.trim_start_matches('/').to_owned(), query })
    }
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// A route ready to be called: its configuration, its compiled rules (or why they do not compile),
/// and the upstream request parts that do not change from call to call.
#[derive(Debug)]
pub struct Route {
    pub uuid: Uuid,
    pub created_at: u64,
    pub updated_at: u64,
    pub config: RouteConfig,
    pub method: Method,
    pub rules: Result<Compiled, Vec<Problem>>,
    upstream: Result<Upstream, String>,
    /// Answers to calls of this route by status (`GET /metrics`); an update hands them on to the
    /// route that replaces this one.
    pub requests: Arc<StatusCounts>,
}

/// The fixed parts of every upstream request of a route.
#[derive(Debug)]
struct Upstream {
    method: Method,
    /// `scheme://authority/path` of the upstream URL.
    prefix: String,
    /// Configured query pairs with their precedence applied: path query, then
    /// `originalRoute.queries`, then `preConfiguredQueries`.
    query: Vec<(String, String)>,
    /// The URL of a call that brings no query: the prefix and the configured query, built once.
    uri: Uri,
    headers: HeaderMap,
    body: Option<Bytes>,
}

/// What a call takes from the client's request.
#[derive(Debug, Default)]
pub struct ClientRequest<'a> {
    pub query: Option<&'a str>,
    pub headers: Option<&'a HeaderMap>,
    pub body: Bytes,
}

/// The request a call sends upstream.
#[derive(Debug)]
pub struct UpstreamRequest {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why a call cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// A runtime-auth route called without `X-Mapped-Auth`.
    AuthRequired,
    /// The stored configuration no longer makes a request (reported like broken rules).
    Broken(String),
}

pub const MAPPED_AUTH: HeaderName = HeaderName::from_static("x-mapped-auth");

impl Route {
    /// Compiles a stored route. A route whose rules or upstream no longer build is still returned:
    /// it answers 503 with the reason instead of disappearing.
    pub fn new(uuid: Uuid, created_at: u64, updated_at: u64, config: RouteConfig, limits: &Limits) -> Route {
        let rules = compile_json(config.rules.as_bytes(), limits);
        let upstream = Upstream::new(&config);
        let method = config.method.parse().unwrap_or(Method::GET);
        Route { uuid, created_at, updated_at, config, method, rules, upstream, requests: Default::default() }
    }

    pub fn from_stored(stored: StoredRoute, limits: &Limits) -> Result<Route, String> {
        let config: RouteConfig = serde_json::from_str(&stored.config)
            .map_err(|e| format!("the stored configuration of route {} is unreadable: {e}", stored.uuid))?;
        Ok(Route::new(stored.uuid, stored.created_at, stored.updated_at, config, limits))
    }

    pub fn to_stored(&self) -> StoredRoute {
        StoredRoute {
            v: SCHEMA_VERSION,
            uuid: self.uuid,
            created_at: self.created_at,
            updated_at: self.updated_at,
            config: serde_json::to_string(&self.config).unwrap_or_else(|_| "null".to_owned()),
        }
    }

    /// Whether the route can serve calls (see [`Route::broken`] for why not).
    pub fn serves(&self) -> bool {
        self.rules.is_ok() && self.upstream.is_ok()
    }

    /// Why the route cannot serve calls, if it cannot.
    pub fn broken(&self) -> Option<String> {
        match (&self.rules, &self.upstream) {
            (Err(problems), _) => Some(format!(
                "its rules no longer compile: {}",
                problems.iter().map(Problem::to_string).collect::<Vec<_>>().join("; ")
            )),
            (_, Err(why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// The path clients call: `/v1/{uuid}/{path}`.
    pub fn public_path(&self) -> String {
        format!("/v1/{}/{}", self.uuid, self.config.path)
    }

    /// Builds the upstream request of one call (SPEC §2.2).
    pub fn upstream_request(&self, client: &ClientRequest<'_>) -> Result<UpstreamRequest, CallError> {
        let upstream = self.upstream.as_ref().map_err(|why| CallError::Broken(why.clone()))?;
        let mut headers = upstream.headers.clone();
        if let Some(from_client) = client.headers {
            for name in [header::ACCEPT, header::ACCEPT_LANGUAGE] {
                if !headers.contains_key(&name)
                    && let Some(value) = from_client.get(&name)
                {
                    headers.insert(name, value.clone());
                }
            }
        }
        let mapped = client.headers.and_then(|h| h.get(&MAPPED_AUTH));
        let authorization = match &self.config.auth {
            Auth::Stored { kind, token: Some(token) } => Some(match kind {
                AuthKind::Bearer | AuthKind::Basic => format!("{} {token}", kind.name()),
                AuthKind::None => token.clone(),
            }),
            Auth::Stored { token: None, .. } => None,
            Auth::Runtime => match mapped {
                Some(value) => Some(value.to_str().map_err(|_| CallError::AuthRequired)?.to_owned()),
                None => return Err(CallError::AuthRequired),
            },
            Auth::None => mapped.and_then(|v| v.to_str().ok()).map(str::to_owned),
        };
        if let Some(value) = authorization {
            let value = HeaderValue::from_str(&value).map_err(|_| CallError::AuthRequired)?;
            headers.insert(header::AUTHORIZATION, value);
        }

        let mut body = Bytes::new();
        if matches!(upstream.method, Method::POST | Method::PUT | Method::PATCH) {
            // A configured Content-Type header wins over both.
            if let Some(configured) = &upstream.body {
                body = configured.clone();
                headers.entry(header::CONTENT_TYPE).or_insert(HeaderValue::from_static("application/json"));
            } else if !client.body.is_empty() {
                body = client.body.clone();
                if let Some(kind) = client.headers.and_then(|h| h.get(header::CONTENT_TYPE)) {
                    headers.entry(header::CONTENT_TYPE).or_insert_with(|| kind.clone());
                }
            }
        }

        let uri = match client.query.filter(|query| !query.is_empty()) {
            None => upstream.uri.clone(),
            Some(query) => {
                upstream_uri(&upstream.prefix, query, &upstream.query).map_err(CallError::Broken)?
            }
        };
        Ok(UpstreamRequest { method: upstream.method.clone(), uri, headers, body })
    }
}

/// `prefix` with the query of a call: the client's pairs, except those the route configures,
/// then the configured ones.
fn upstream_uri(prefix: &str, client_query: &str, configured: &[(String, String)]) -> Result<Uri, String> {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    let is_configured = |name: &str| configured.iter().any(|(n, _)| n == name);
    for (name, value) in url::form_urlencoded::parse(client_query.as_bytes()) {
        if !is_configured(&name) {
            query.append_pair(&name, &value);
        }
    }
    for (name, value) in configured {
        query.append_pair(name, value);
    }
    let query = query.finish();
    let uri = if query.is_empty() { prefix.to_owned() } else { format!("{prefix}?{query}") };
    Uri::try_from(uri).map_err(|e| format!("the upstream URL is invalid: {e}"))
}

impl Upstream {
    fn new(config: &RouteConfig) -> Result<Upstream, String> {
        let base = BaseUrl::parse(&config.base_url)?.0;
        let path = UpstreamPath::parse(&config.upstream_path)?;
        let mut prefix = format!("{}://{}", base.scheme(), base.host_str().unwrap_or_default());
        if let Some(port) = base.port() {
            prefix.push_str(&format!(":{port}"));
        }
        let base_path = base.path().trim_end_matches('/');
        prefix.push_str(base_path);
        if !path.path.is_empty() || base_path.is_empty() {
            prefix.push('/');
            prefix.push_str(&path.path);
        }
        // The joined URL must stay on the base URL's origin and below its path.
        let joined = url::Url::parse(&prefix).map_err(|e| format!("the upstream URL is invalid: {e}"))?;
        if joined.origin() != base.origin() || !joined.path().starts_with(base_path) {
            return Err("the upstream path leaves the base URL".into());
        }

        let mut query: Vec<(String, String)> = Vec::new();
        let mut set = |name: &str, value: &str| {
            query.retain(|(n, _)| n != name);
            query.push((name.to_owned(), value.to_owned()));
        };
        for (name, value) in &path.query {
            set(name, value);
        }
        for (name, value) in config.queries.iter().chain(&config.pre_queries) {
            set(name, value);
        }

        let mut headers = HeaderMap::new();
        for (name, value) in config.headers.iter().chain(&config.pre_headers) {
            let name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("header `{name}`: {e}"))?;
            let value = HeaderValue::from_str(value).map_err(|e| format!("header `{name}`: {e}"))?;
            headers.insert(name, value);
        }
        let body = config.pre_body.as_ref().or(config.body.as_ref()).map(|text| Bytes::from(text.clone()));
        let method =
            config.upstream_method.parse().map_err(|_| "the upstream method is invalid".to_owned())?;
        let uri = upstream_uri(&prefix, "", &query)?;
        Ok(Upstream { method, prefix, query, uri, headers, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(json: &str) -> Registration {
        serde_json::from_str(json).expect("a registration")
    }

    const RULES: &str =
        r#"{"newBodyFields":{"a":{"key":"a","type":"String"}},"oldBodyFields":{"a":{"keys":["a"]}}}"#;

    fn config(original: &str, extra: &str) -> RouteConfig {
        let json = format!(r#"{{"path":"p","originalRoute":{original},"rulesAsString":{RULES}{extra}}}"#);
        registration(&json).validate(false, None).expect("valid")
    }

    fn request(config: RouteConfig, client: &ClientRequest<'_>) -> UpstreamRequest {
        let route = Route::new(Uuid::nil(), 0, 0, config, &Limits::default());
        route.upstream_request(client).expect("a request")
    }

    #[test]
    fn base_path_is_kept_and_queries_follow_their_precedence() {
        let c = config(
            r#"{"originalApi":{"baseUrl":"https://api.example.org/v2/"},"path":"/items?a=path&b=path","queries":{"b":"route","c":"route"}}"#,
            r#","preConfiguredQueries":{"c":"pre"}"#,
        );
        let r = request(
            c.clone(),
            &ClientRequest { query: Some("a=client&d=client&c=client"), ..Default::default() },
        );
        assert_eq!(r.uri.to_string(), "https://api.example.org/v2/items?d=client&a=path&b=route&c=pre");
        assert_eq!(r.method, Method::GET);
        // Without a query of its own (none, or empty), a call gets the URL built at compile time.
        for query in [None, Some("")] {
            let r = request(c.clone(), &ClientRequest { query, ..Default::default() });
            assert_eq!(r.uri.to_string(), "https://api.example.org/v2/items?a=path&b=route&c=pre");
        }
    }

    #[test]
    fn a_route_is_read_back_from_its_stored_form_and_an_unreadable_one_is_named() {
        let c = config(r#"{"originalApi":{"baseUrl":"https://api.example.org/"},"path":"/x"}"#, "");
        let route = Route::new(Uuid::new_v4(), 1, 2, c.clone(), &Limits::default());
        let again = Route::from_stored(route.to_stored(), &Limits::default()).expect("readable");
        assert_eq!((again.uuid, again.created_at, again.updated_at, &again.config), (route.uuid, 1, 2, &c));
        let mut stored = route.to_stored();
        stored.config = "not json".into();
        let Err(why) = Route::from_stored(stored, &Limits::default()) else {
            panic!("read as a configuration")
        };
        assert!(why.contains(&route.uuid.to_string()) && why.contains("unreadable"), "{why}");
    }

    #[test]
    fn empty_path_calls_the_base_url() {
        let c = config(r#"{"originalApi":{"baseUrl":"http://127.0.0.1:9/random.php"},"path":""}"#, "");
        assert_eq!(request(c, &ClientRequest::default()).uri.to_string(), "http://127.0.0.1:9/random.php");
        let c = config(r#"{"originalApi":{"baseUrl":"http://h.example"},"path":""}"#, "");
        assert_eq!(request(c, &ClientRequest::default()).uri.to_string(), "http://h.example/");
    }

    #[test]
    fn only_accept_headers_pass_and_configured_headers_win() {
        let c = config(
            r#"{"originalApi":{"baseUrl":"https://a.example"},"path":"x","headers":{"Accept-Language":"en","X-Key":"route"}}"#,
            r#","preConfiguredHeaders":{"X-Key":"pre"}"#,
        );
        let mut client = HeaderMap::new();
        for (name, value) in [
            ("accept", "application/json"),
            ("accept-language", "fr"),
            ("cookie", "s=1"),
            ("authorization", "Bearer leak"),
            ("x-other", "1"),
        ] {
            client.insert(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        let r = request(c, &ClientRequest { headers: Some(&client), ..Default::default() });
        let names: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(r.headers["accept-language"], "en");
        assert_eq!(r.headers["x-key"], "pre");
        assert_eq!(r.headers["accept"], "application/json");
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[test]
    fn stored_auth_wins_and_runtime_auth_is_required() {
        let bearer = config(
            r#"{"originalApi":{"baseUrl":"https://a.example"},"path":""}"#,
            r#","authHeader":{"type":"bearer","token":"s3"}"#,
        );
        let mut client = HeaderMap::new();
        client.insert(MAPPED_AUTH, HeaderValue::from_static("Bearer caller"));
        let with_caller = ClientRequest { headers: Some(&client), ..Default::default() };
        assert_eq!(request(bearer, &with_caller).headers["authorization"], "Bearer s3");

        let raw = config(
            r#"{"originalApi":{"baseUrl":"https://a.example"},"path":"","authHeader":{"type":"None","token":"k=1"}}"#,
            "",
        );
        assert_eq!(request(raw, &with_caller).headers["authorization"], "k=1");

        let json = format!(
            r#"{{"path":"p","originalRoute":{{"originalApi":{{"baseUrl":"https://a.example"}},"path":""}},"rulesAsString":{RULES}}}"#
        );
        let runtime = registration(&json).validate(true, None).unwrap();
        assert_eq!(runtime.auth, Auth::Runtime);
        let route = Route::new(Uuid::nil(), 0, 0, runtime, &Limits::default());
        assert_eq!(route.upstream_request(&ClientRequest::default()).unwrap_err(), CallError::AuthRequired);
        assert_eq!(route.upstream_request(&with_caller).unwrap().headers["authorization"], "Bearer caller");
    }

    #[test]
    fn bodies_follow_their_precedence_on_methods_that_carry_one() {
        let post = |extra: &str| {
            config(
                &format!(
                    r#"{{"originalApi":{{"baseUrl":"https://a.example"}},"path":"","method":"post"{extra}}}"#
                ),
                "",
            )
        };
        let client =
            ClientRequest { body: Bytes::from_static(b"{\"from\":\"client\"}"), ..Default::default() };
        assert_eq!(request(post(""), &client).body, client.body);
        assert_eq!(&request(post(r#","body":{"from":"route"}"#), &client).body[..], br#"{"from":"route"}"#);
        let get = config(r#"{"originalApi":{"baseUrl":"https://a.example"},"path":"","body":{"x":1}}"#, "");
        assert!(request(get, &client).body.is_empty(), "GET sends no body");
        let typed = post(r#","body":{"x":1},"headers":{"Content-Type":"application/vnd.api+json"}"#);
        assert_eq!(request(typed, &client).headers["content-type"], "application/vnd.api+json");
    }

    #[test]
    fn every_problem_of_a_registration_is_reported() {
        let json = r#"{"path":"a/../b","method":"FETCH","originalRoute":{"originalApi":{"baseUrl":"ftp://u:p@x"},"path":"//evil.example/x","method":"get","headers":{"Host":"x","X-Ok":"a\nb"},"authHeader":{"type":"Bearer"}},"authHeader":{"type":"Basic","token":"t"},"rulesAsString":{}}"#;
        let problems = registration(json).validate(false, None).unwrap_err();
        let locations: Vec<&str> = problems.iter().map(|p| p.location.as_str()).collect();
        assert_eq!(
            locations,
            [
                "/path",
                "/method",
                "/originalRoute/originalApi/baseUrl",
                "/originalRoute/path",
                "/originalRoute/headers/Host",
                "/originalRoute/headers/X-Ok",
                "/authHeader"
            ],
            "{problems:?}"
        );
    }

    #[test]
    fn upstream_paths_cannot_leave_the_base() {
        for path in
            ["../x", "a/%2e%2e/b", "a/%2E%2E", "http://evil.example/", "//evil.example", "a\\b", "a#b", "a b"]
        {
            assert!(UpstreamPath::parse(path).is_err(), "{path}");
        }
        for path in ["", "x", "/x/y.json", "a%20b", "api/json/v1/1/random.php?c=Seafood"] {
            assert!(UpstreamPath::parse(path).is_ok(), "{path}");
        }
    }

    #[test]
    fn base_urls_need_a_valid_host_name() {
        for base in ["https://}", "http://a{b}.example/", "http://a|b/", "http://a%7Bb/"] {
            assert!(BaseUrl::parse(base).is_err(), "{base}");
        }
        for base in [
            "https://api.example.com/v2/",
            "http://127.0.0.1:9/",
            "http://[::1]/",
            "https://bücher.example/",
            "http://a_b.example/",
        ] {
            assert!(BaseUrl::parse(base).is_ok(), "{base}");
        }
    }
}
