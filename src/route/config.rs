//! A route's configuration as validated and stored ([`RouteConfig`], a composed route's
//! [`SourceConfig`]s, [`Auth`]): the one model every door (the API, the console, an import)
//! produces and the store keeps, sealed. Data only: validated by `registration`, compiled by
//! [`super::Route::new`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::paginate::PaginateConfig;
use crate::rules::Problem;
use crate::upstream::{BreakerScope, ClientCredentials, RateLimitSettings, RetrySettings, TlsSettings};

/// A validated route configuration: what is stored, and what [`Route`] is compiled from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteConfig {
    /// `name` (SPEC §2.5): unique among routes, how a routes file names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `owner` (SPEC §2.5): a label; `recast config apply --prune` deletes only its owner's routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
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
    /// Whether and how long mapped answers are cached (`cache`); `None` for no caching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSettings>,
    /// What failed upstream calls are sent again (`retry`); `None`: only the sends that are
    /// always safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySettings>,
    /// The upstream's quota (`rateLimit`); `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSettings>,
    /// A private CA and a client certificate for the upstream (`tls`); `None`: neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
    /// `"http2": "prior-knowledge"`: an `http` upstream spoken to in HTTP/2 from the start (h2c).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub http2_prior_knowledge: bool,
    /// `"breaker": {"scope": "route"}`: the route's calls are counted by a breaker of its own;
    /// by default, by its origin's.
    #[serde(default, skip_serializing_if = "BreakerScope::is_origin")]
    pub breaker: BreakerScope,
    /// A composed route's sources (SPEC §2.3), in the order given; empty for a route of one
    /// upstream (`originalRoute`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceConfig>,
    /// `originalRoute.paginate` (SPEC §2.3 "Pages"): the route's own upstream's pages, joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paginate: Option<PaginateConfig>,
    /// The caller's headers templates may read (lower-case names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_headers: Vec<String>,
    /// Whether `{{ expr }}` in the members of `originalRoute` and the `preConfigured…` ones are
    /// templates over `request` (SPEC §2.3); a route stored before templates existed has none,
    /// and its text is sent as written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub templates: bool,
    /// `sampleRequest` (SPEC §2.1): the caller's request live calls are made as (a registration's,
    /// an update's that gives none, a *Try it*): a sample, sealed with the route and shown as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_request: Option<StoredSample>,
    /// `callers` (SPEC §2.4): who may call the route; `None`: anyone, not said on purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callers: Option<crate::callers::CallersConfig>,
    /// `caller` (SPEC §2.4): the `$caller` live calls are made as (JSON text of an object), a
    /// sample kept like `sampleRequest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
}

/// A route's `sampleRequest` as stored: the query of the caller's request and its body (JSON
/// text), as the live call sends them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSample {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl StoredSample {
    /// The query as a caller would send it (`a=1&b=2`), encoded.
    pub fn query_string(&self) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in &self.query {
            query.append_pair(name, value);
        }
        query.finish()
    }

    /// The body as a caller would send it: its JSON text (none for `null` or no body).
    pub fn body_bytes(&self) -> bytes::Bytes {
        match self.body.as_deref() {
            None | Some("null") => bytes::Bytes::new(),
            Some(text) => bytes::Bytes::copy_from_slice(text.as_bytes()),
        }
    }
}

impl RouteConfig {
    /// Where this route keeps a credential its calls spend (an `authHeader` with a token or
    /// client credentials, a client certificate, a configured header that looks like a key),
    /// its own or a source's: the first place, as a location in the registration.
    pub fn stored_credential(&self) -> Option<String> {
        fn credential_header(name: &str) -> bool {
            let name = name.to_ascii_lowercase();
            ["authorization", "api-key", "apikey", "api_key", "token", "secret", "password"]
                .iter()
                .any(|word| name.contains(word))
        }
        let spends = |auth: &Auth, tls: bool, header: bool| match auth {
            Auth::Stored { token: Some(_), .. } | Auth::OAuth2(_) => Some("authHeader"),
            _ if tls => Some("tls"),
            _ => header.then_some("headers"),
        };
        let certificate =
            |tls: &Option<TlsSettings>| tls.as_ref().is_some_and(|tls| tls.client_cert.is_some());
        if self.sources.is_empty() {
            let header =
                self.headers.keys().chain(self.pre_headers.keys()).any(|name| credential_header(name));
            return spends(&self.auth, certificate(&self.tls), header).map(|member| format!("/{member}"));
        }
        self.sources.iter().find_map(|source| {
            let header = source.headers.keys().any(|name| credential_header(name));
            spends(&source.auth, certificate(&source.tls), header)
                .map(|member| format!("/sources/{}/{member}", source.name))
        })
    }

    /// A configuration with no upstream of its own and nothing else set: what a composed route's
    /// is made from (its sources added).
    pub fn without_upstream(path: String, method: String, auth: Auth, rules: String) -> RouteConfig {
        RouteConfig {
            name: None,
            owner: None,
            path,
            method,
            base_url: String::new(),
            upstream_path: String::new(),
            upstream_method: "GET".to_owned(),
            headers: BTreeMap::new(),
            queries: BTreeMap::new(),
            body: None,
            pre_queries: BTreeMap::new(),
            pre_headers: BTreeMap::new(),
            pre_body: None,
            auth,
            rules,
            cache: None,
            retry: None,
            rate_limit: None,
            tls: None,
            http2_prior_knowledge: false,
            breaker: BreakerScope::Origin,
            sources: Vec::new(),
            paginate: None,
            forward_headers: Vec::new(),
            templates: false,
            sample_request: None,
            callers: None,
            caller: None,
        }
    }
}

/// Deepest a stored JSON member (a body, the rules) may nest: what `GET /v1/routes/{uuid}` can
/// show back, and what a registration body can carry (the JSON reader's bound).
pub const SHOWN_DEPTH: usize = 127;

/// A stored JSON member as `GET /v1/routes/{uuid}` shows it: rewritten without white space, its
/// members in their order; or why it cannot be shown (it is then never shown as `null`, which
/// saving the view back would store).
pub fn shown(text: &str) -> Result<Box<serde_json::value::RawValue>, String> {
    let mut buf = text.as_bytes().to_vec();
    let mut out = Vec::with_capacity(text.len());
    crate::json::with_parsed(&mut buf, SHOWN_DEPTH, |nodes| crate::json::value(&mut out, nodes, 0))
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8(out).map_err(|e| e.to_string())?;
    serde_json::value::RawValue::from_string(text).map_err(|e| e.to_string())
}

impl RouteConfig {
    /// Problems of members `GET` could not show back (see [`shown`]), each at its place.
    pub fn unshowable(&self) -> Vec<Problem> {
        let mut members: Vec<(String, &str)> = vec![("/rulesAsString".to_owned(), self.rules.as_str())];
        if let Some(body) = &self.body {
            members.push(("/originalRoute/body".to_owned(), body));
        }
        if let Some(body) = &self.pre_body {
            members.push(("/preConfiguredBody".to_owned(), body));
        }
        if let Some(body) = self.sample_request.as_ref().and_then(|sample| sample.body.as_ref()) {
            members.push(("/sampleRequest/body".to_owned(), body));
        }
        for source in &self.sources {
            if let Some(body) = &source.body {
                let mut at = "/sources".to_owned();
                crate::json::push_pointer(&mut at, &source.name);
                members.push((format!("{at}/body"), body));
            }
        }
        members
            .into_iter()
            .filter_map(|(at, text)| {
                shown(text).err().map(|why| {
                    Problem::new(at, format!("it could not be shown back by GET /v1/routes/{{uuid}} ({why})"))
                })
            })
            .collect()
    }
}

/// A route's `cache` member: how long a mapped answer is fresh, and how long after that it may
/// still be answered at once while one refresh runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheSettings {
    pub ttl_seconds: u64,
    pub stale_while_revalidate_seconds: u64,
}

/// How a route authenticates to its upstream. Its `Debug` masks the stored token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "camelCase")]
pub enum Auth {
    /// No `authHeader` and no `X-Mapped-Auth` at registration: nothing stored; a caller's
    /// `X-Mapped-Auth` is still passed on.
    None,
    /// Registered with `X-Mapped-Auth` only: every call must bring one.
    Runtime,
    /// An `authHeader` was given and is stored.
    Stored { kind: AuthKind, token: Option<String> },
    /// `OAuth2ClientCredentials`: the client credentials are stored; the tokens they bring are
    /// kept in memory only.
    #[serde(rename = "oauth2")]
    OAuth2(ClientCredentials),
}

impl std::fmt::Debug for Auth {
    // The stored token is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Runtime => f.write_str("Runtime"),
            Auth::Stored { kind, token } => f
                .debug_struct("Stored")
                .field("kind", kind)
                .field("token", &token.as_ref().map(|_| "***"))
                .finish(),
            Auth::OAuth2(credentials) => f.debug_tuple("OAuth2").field(credentials).finish(),
        }
    }
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

/// One source as stored: the members of `originalRoute`, its upstream settings, and where it
/// stands in the composition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceConfig {
    pub name: String,
    pub base_url: String,
    /// `path` as given, templates included (it may hold a literal query string).
    pub path: String,
    pub method: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub queries: BTreeMap<String, String>,
    /// JSON text of `body`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    pub auth: Auth,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub http2_prior_knowledge: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<String>,
    pub max_calls: u32,
    pub concurrency: u32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `paginate` (SPEC §2.3 "Pages"): the source follows its upstream's pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paginate: Option<PaginateConfig>,
}
