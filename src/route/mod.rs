//! Routes (SPEC §2.1, §2.2): what a client registers ([`registration`]), the configuration that is
//! validated from it and stored ([`RouteConfig`]), the compiled [`Route`] the route table holds,
//! and the upstream request of one call ([`request`]). No IO here: the server calls, the store
//! keeps, this module decides what a route is and what a call sends.

pub mod composition;
mod masked;
mod registration;
mod request;
pub mod shape;
pub mod sources;
pub mod template;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use http::Method;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use self::request::Upstream;
use crate::metrics::{RouteStats, StatusCounts};
use crate::rules::{Compiled, Limits, Problem, compile_json};
use crate::storage::{SCHEMA_VERSION, StoredRoute};
use crate::upstream::{BreakerScope, ClientCredentials, RateLimitSettings, RetrySettings, TlsSettings};
pub use masked::MASK;
pub use registration::{AuthHeader, OriginalApi, OriginalRoute, Registration, SampleRequest};
pub use request::{CallError, FromClient, MAPPED_AUTH};

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
    pub sources: Vec<sources::SourceConfig>,
    /// The caller's headers templates may read (lower-case names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_headers: Vec<String>,
    /// Whether `{{ expr }}` in the members of `originalRoute` and the `preConfigured…` ones are
    /// templates over `request` (SPEC §2.3); a route stored before templates existed has none,
    /// and its text is sent as written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub templates: bool,
}

impl RouteConfig {
    /// A configuration with no upstream of its own and nothing else set: what a composed route's
    /// is made from (its sources added).
    pub fn without_upstream(path: String, method: String, auth: Auth, rules: String) -> RouteConfig {
        RouteConfig {
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
            forward_headers: Vec::new(),
            templates: false,
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
    crate::json::with_parsed(&mut buf, SHOWN_DEPTH, |nodes| crate::json::write::value(&mut out, nodes, 0))
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
    upstream: Result<Target, String>,
    /// Answers to calls of this route by status (`GET /metrics`); an update hands them on to the
    /// route that replaces this one.
    pub statuses: Arc<StatusCounts>,
    /// Calls, errors and latency (`GET /v1/routes/{uuid}/stats`), handed on like `statuses`.
    pub stats: Arc<RouteStats>,
    /// Cluster mode: the revision of the database change this version comes from (0 otherwise).
    pub revision: u64,
    /// This version's number in the process, unique: cached answers are kept by it, so a new
    /// version never reads an older one's.
    pub serial: u64,
}

/// A stored route whose record the key ring cannot open (it names a key the ring lacks): its
/// configuration, path included, is unknown until the key is given back. It is listed, answers
/// 503 with `why` at any path under its uuid, and takes `DELETE` only: an update could not
/// keep what it cannot read.
#[derive(Debug)]
pub struct LockedRoute {
    pub uuid: Uuid,
    pub created_at: u64,
    pub updated_at: u64,
    pub revision: u64,
    pub why: String,
}

/// Where a route's calls go: one upstream, or the sources of a composition. Either is run as a
/// schedule of sources, one way: a route's own upstream is the one-source case
/// ([`composition::Composition::own`]).
#[derive(Debug)]
enum Target {
    Single(Box<Upstream>, Arc<composition::Composition>),
    Composed(Arc<composition::Composition>),
}

impl Route {
    /// The composition of a composed route (SPEC §2.3).
    pub fn composition(&self) -> Option<&Arc<composition::Composition>> {
        match &self.upstream {
            Ok(Target::Composed(composition)) => Some(composition),
            _ => None,
        }
    }

    /// What a call runs: a composed route's sources, or the route's own upstream as the one
    /// source; `None` for a route that cannot serve ([`Route::broken`] says why).
    pub fn schedule(&self) -> Option<&Arc<composition::Composition>> {
        match &self.upstream {
            Ok(Target::Single(_, schedule) | Target::Composed(schedule)) => Some(schedule),
            Err(_) => None,
        }
    }
}

/// The serial of the next route version compiled.
static SERIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Route {
    /// Compiles a stored route. A route whose rules or upstream no longer build is still returned:
    /// it answers 503 with the reason instead of disappearing.
    pub fn new(uuid: Uuid, created_at: u64, updated_at: u64, config: RouteConfig, limits: &Limits) -> Route {
        let rules = compile_json(config.rules.as_bytes(), limits);
        let upstream = if config.sources.is_empty() {
            Upstream::new(&config, limits).map(|upstream| {
                let schedule = Arc::new(upstream.schedule(&config, uuid));
                Target::Single(Box::new(upstream), schedule)
            })
        } else {
            // The worst case of calls is registration's check; a stored composition past a bound
            // lowered since still serves, and each call is held to it as it runs.
            let limits = Limits { max_source_calls: usize::MAX, ..*limits };
            composition::Composition::compile(&config.sources, &config.forward_headers, uuid, &limits)
                .map(|composition| Target::Composed(Arc::new(composition)))
                .map_err(|problems| {
                    format!(
                        "its sources no longer compile: {}",
                        problems.iter().map(Problem::to_string).collect::<Vec<_>>().join("; ")
                    )
                })
        };
        let method = config.method.parse().unwrap_or(Method::GET);
        Route {
            uuid,
            created_at,
            updated_at,
            config,
            method,
            rules,
            upstream,
            statuses: Default::default(),
            stats: Default::default(),
            revision: 0,
            serial: SERIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
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
}
