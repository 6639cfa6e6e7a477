//! Routes (SPEC §2.1–§2.3): what a client registers ([`registration`], its members checked by
//! [`fields`]), the configuration validated from it and stored ([`config`]), and the compiled
//! [`Route`] the route table holds: its rules, and its upstream, a route's own ([`request`]) or
//! a composed route's sources ([`composition`], their [`graph`]); both make their requests with
//! the one request builder ([`render`]) over the caller's request ([`context`]) and call with
//! their [`settings`]. No IO here: the server calls, the store keeps, this module decides what a
//! route is and what a call sends.

pub mod composition;
pub mod config;
pub mod context;
mod fields;
mod graph;
mod masked;
pub mod paginate;
mod registration;
pub mod render;
mod request;
pub mod settings;
pub mod shape;
pub mod sources;
pub mod template;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use http::Method;
use uuid::Uuid;

use self::composition::Composition;
use self::request::Single;
use crate::metrics::{RouteStats, StatusCounts};
use crate::rules::{Compiled, Limits, Problem, compile_json};
use crate::storage::{SCHEMA_VERSION, StoredRoute};
use crate::upstream::{RouteTls, TokenRequest, UpstreamRequest};
pub use config::{
    Auth, AuthKind, CacheSettings, RouteConfig, SHOWN_DEPTH, SourceConfig, StoredSample, shown,
};
pub use fields::AuthHeader;
pub use masked::MASK;
pub use registration::{LABEL_RULE, OriginalApi, OriginalRoute, Registration, SampleRequest, is_label};
pub use request::{CallError, FromClient, MAPPED_AUTH};

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
    /// Who may call it (SPEC §2.4): `None` for an open route.
    gate: Result<Option<Arc<crate::callers::Gate>>, String>,
    /// Whether its rules or templates may read `$caller` (its configuration names it anywhere):
    /// its cached answers are then kept per caller.
    reads_caller: bool,
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

/// Where a route's calls go: its own upstream, or the sources of a composition.
#[derive(Debug)]
enum Target {
    Single(Box<Single>),
    Composed(Arc<Composition>),
}

/// One upstream a route calls, for what is checked of all of them before a live call (the
/// outbound policy): its request and its settings, and the source's name for a composed route.
pub struct Upstream<'a> {
    pub request: &'a render::RequestTemplate,
    pub calls: &'a settings::CallSettings,
    pub source: Option<&'a str>,
}

impl Route {
    /// The composition of a composed route (SPEC §2.3).
    pub fn composition(&self) -> Option<&Arc<Composition>> {
        match &self.upstream {
            Ok(Target::Composed(composition)) => Some(composition),
            _ => None,
        }
    }

    /// A route's own upstream (SPEC §2.2).
    pub fn single(&self) -> Option<&Single> {
        match &self.upstream {
            Ok(Target::Single(single)) => Some(single),
            _ => None,
        }
    }

    /// Every upstream the route calls: its own, or each source.
    pub fn upstreams(&self) -> Vec<Upstream<'_>> {
        match &self.upstream {
            Ok(Target::Single(single)) => {
                vec![Upstream { request: &single.request, calls: &single.calls, source: None }]
            }
            Ok(Target::Composed(composition)) => composition
                .sources
                .iter()
                .map(|s| Upstream { request: &s.request, calls: &s.calls, source: Some(&s.name) })
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The token request of the route's own OAuth2 client credentials, if it has them.
    pub fn token_request(&self) -> Option<&Arc<TokenRequest>> {
        self.single()?.calls.oauth.as_ref()
    }

    /// The route's own `tls`, read, if it has one.
    pub fn tls(&self) -> Option<&RouteTls> {
        self.single()?.calls.tls.as_deref()
    }

    /// Builds the upstream request of one call of a route's own upstream (SPEC §2.2).
    pub fn upstream_request(&self, client: &FromClient<'_>) -> Result<UpstreamRequest, CallError> {
        match &self.upstream {
            Ok(Target::Single(single)) => single.request(client),
            Ok(Target::Composed(_)) => {
                Err(CallError::Broken("a composed route has no single upstream".into()))
            }
            Err(why) => Err(CallError::Broken(why.clone())),
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
            Single::compile(&config, uuid, limits).map(|single| Target::Single(Box::new(single))).map_err(
                |problems| {
                    format!(
                        "its upstream no longer builds: {}",
                        problems.iter().map(Problem::to_string).collect::<Vec<_>>().join("; ")
                    )
                },
            )
        } else {
            // The worst case of calls is registration's check; a stored composition past a bound
            // lowered since still serves, and each call is held to it as it runs.
            let limits = Limits { max_source_calls: usize::MAX, ..*limits };
            Composition::compile(&config.sources, &config.forward_headers, uuid, &limits)
                .map(|composition| Target::Composed(Arc::new(composition)))
                .map_err(|problems| {
                    format!(
                        "its sources no longer compile: {}",
                        problems.iter().map(Problem::to_string).collect::<Vec<_>>().join("; ")
                    )
                })
        };
        let method = config.method.parse().unwrap_or(Method::GET);
        let gate = crate::callers::Gate::compile(config.callers.as_ref(), uuid)
            .map(|gate| gate.map(Arc::new))
            .map_err(|why| format!("its callers no longer compile: {why}"));
        let reads_caller = serde_json::to_string(&config).map_or(true, |text| text.contains("$caller"));
        Route {
            uuid,
            created_at,
            updated_at,
            config,
            method,
            rules,
            upstream,
            gate,
            reads_caller,
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
            _ => self.gate.as_ref().err().cloned(),
        }
    }

    /// Whether its answers may depend on who calls (it reads `$caller`).
    pub fn reads_caller(&self) -> bool {
        self.reads_caller
    }

    /// `$caller` for this route's rules and templates: the caller's, when they may read it.
    pub fn caller_value<'c>(
        &self,
        caller: Option<&'c crate::callers::Caller>,
    ) -> Option<&'c crate::expr::Const> {
        caller.filter(|_| self.reads_caller).map(crate::callers::Caller::constant)
    }

    /// The `$caller` its live calls are made as (`caller`, a sample), if it has one.
    pub fn sample_caller(&self) -> Option<crate::callers::Caller> {
        let given: serde_json::Value = serde_json::from_str(self.config.caller.as_deref()?).ok()?;
        crate::callers::Caller::sample(&given)
    }

    /// Who may call the route; `None` for an open route (or one whose callers do not compile,
    /// which is [`Route::broken`]).
    pub fn gate(&self) -> Option<&Arc<crate::callers::Gate>> {
        self.gate.as_ref().ok().and_then(Option::as_ref)
    }

    /// The path clients call: `/v1/{uuid}/{path}`.
    pub fn public_path(&self) -> String {
        format!("/v1/{}/{}", self.uuid, self.config.path)
    }
}
