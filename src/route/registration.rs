//! A registration as a client sends it (`POST /v1/mapping`, `PUT /v1/routes/{uuid}`), and its
//! validation into a [`RouteConfig`], with every problem located in the body.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::composition::Composition;
use super::config::{Auth, RouteConfig};
use super::fields::{
    AuthHeader, auth, breaker_settings, cache_settings, json_text, method_of, rate_limit_settings,
    retry_settings, route_path, tls_settings,
};
use super::request::Single;
use crate::rules::{Limits, Problem};

/// The body of `POST /v1/mapping` and `PUT /v1/routes/{uuid}` as sent.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registration {
    /// SPEC §2.5: unique among routes (`[a-z0-9][a-z0-9-]{0,62}`).
    #[serde(default)]
    pub name: Option<String>,
    /// SPEC §2.5: a label of the same pattern; whose route it is.
    #[serde(default)]
    pub owner: Option<String>,
    /// SPEC §2.5: the uuid a registration asks for (one no route holds), so that one file gives
    /// the same addresses everywhere; an update may repeat its own.
    #[serde(default)]
    pub uuid: Option<String>,
    pub path: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    /// Absent when `sources` are given (SPEC §2.3).
    #[serde(default)]
    pub original_route: Option<OriginalRoute>,
    /// A composed route's named upstream calls (SPEC §2.3); checked by hand
    /// ([`super::sources`]), so that each of its problems has a location.
    #[serde(default)]
    pub sources: Option<serde_json::Value>,
    /// The caller's headers a composed route's templates may read (`request.headers`).
    #[serde(default)]
    pub forward_headers: Option<serde_json::Value>,
    #[serde(default)]
    pub pre_configured_queries: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub pre_configured_headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub pre_configured_body: Option<Box<RawValue>>,
    #[serde(default)]
    pub auth_header: Option<AuthHeader>,
    pub rules_as_string: Box<RawValue>,
    /// `{"ttlSeconds": N, "staleWhileRevalidateSeconds": M}`; checked by hand, so that each of
    /// its problems has a location.
    #[serde(default)]
    pub cache: Option<serde_json::Value>,
    /// `{"attempts": N, "on": [503, "timeout", ...], "unsafe": false}`; checked by hand, so that
    /// each of its problems has a location.
    #[serde(default)]
    pub retry: Option<serde_json::Value>,
    /// `{"requestsPerSecond": R, "burst": B, "scope": "route" | "origin", "maxWaitMs": W}`;
    /// checked by hand, so that each of its problems has a location.
    #[serde(default)]
    pub rate_limit: Option<serde_json::Value>,
    /// `{"ca": "<PEM>", "clientCert": "<PEM>", "clientKey": "<PEM>"}`; checked by hand, so that
    /// each of its problems has a location.
    #[serde(default)]
    pub tls: Option<serde_json::Value>,
    /// `"prior-knowledge"`: HTTP/2 to an `http` upstream from the start; checked by hand.
    #[serde(default)]
    pub http2: Option<serde_json::Value>,
    /// `{"scope": "origin" | "route"}`: whose calls the upstream's breaker counts; checked by
    /// hand.
    #[serde(default)]
    pub breaker: Option<serde_json::Value>,
    /// The caller's request the live calls are made as (SPEC §2.1); stored with the route.
    #[serde(default)]
    pub sample_request: Option<SampleRequest>,
    /// Who may call the route (SPEC §2.4); checked by hand ([`crate::callers::config`]).
    #[serde(default)]
    pub callers: Option<serde_json::Value>,
    /// A sample `$caller` for live calls (SPEC §2.4); stored with the route as given.
    #[serde(default)]
    pub caller: Option<Box<RawValue>>,
}

/// `sampleRequest`: the query and the body of the caller's request a registration's live call
/// is made as, for an upstream that needs them (a `POST` whose body comes from its callers).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleRequest {
    #[serde(default)]
    pub query: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub body: Option<Box<RawValue>>,
}

impl SampleRequest {
    /// As stored with the route.
    pub fn stored(self) -> super::config::StoredSample {
        super::config::StoredSample {
            query: self.query.unwrap_or_default(),
            body: self.body.map(|body| body.get().to_owned()).filter(|text| text != "null"),
        }
    }
}

/// Only where the route goes is printed: a registration holds secrets (tokens, client
/// credentials, a TLS key, headers with keys in them).
impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("path", &self.path)
            .field("base_url", &self.original_route.as_ref().map(|o| &o.original_api.base_url))
            .field(
                "sources",
                &self.sources.as_ref().and_then(|s| s.as_object()).map(|s| s.keys().collect::<Vec<_>>()),
            )
            .finish_non_exhaustive()
    }
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
    /// SPEC §2.3 "Pages"; checked by hand ([`super::paginate`]), so that each of its problems
    /// has a location.
    #[serde(default)]
    pub paginate: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OriginalApi {
    pub base_url: String,
}

impl Registration {
    /// Checks the registration and returns the configuration to store, or every problem found
    /// (located by JSON pointer into the body). `runtime_auth` says whether the request carried
    /// `X-Mapped-Auth`. An update passes the route's `path`, which it may repeat but not change.
    pub fn validate(self, runtime_auth: bool, fixed_path: Option<&str>) -> Result<RouteConfig, Vec<Problem>> {
        self.validate_with(runtime_auth, fixed_path, &Limits::default())
    }

    /// [`Registration::validate`] under `limits` (a composition's depth and calls).
    pub fn validate_with(
        self,
        runtime_auth: bool,
        fixed_path: Option<&str>,
        limits: &Limits,
    ) -> Result<RouteConfig, Vec<Problem>> {
        let mut problems = Vec::new();
        let name = self.name.as_deref().map(|name| label(name, "/name", &mut problems));
        let owner = self.owner.as_deref().map(|owner| label(owner, "/owner", &mut problems));
        if let Err(problem) = self.given_uuid() {
            problems.push(problem);
        }
        match self.checked(runtime_auth, fixed_path, limits) {
            Ok(config) if problems.is_empty() => Ok(RouteConfig { name, owner, ..config }),
            Ok(_) => Err(problems),
            Err(found) => Err(problems.into_iter().chain(found).collect()),
        }
    }

    /// The uuid the registration asks for (`uuid`), if it gives one: a UUID in its usual
    /// hyphenated form, never the nil one.
    pub fn given_uuid(&self) -> Result<Option<uuid::Uuid>, Problem> {
        let Some(text) = self.uuid.as_deref() else { return Ok(None) };
        match uuid::Uuid::try_parse(text) {
            Ok(uuid) if !uuid.is_nil() && uuid.hyphenated().to_string().eq_ignore_ascii_case(text) => {
                Ok(Some(uuid))
            }
            _ => Err(Problem::new(
                "/uuid",
                "must be a UUID in its hyphenated form (8-4-4-4-12 hex digits), not the nil one",
            )),
        }
    }

    fn checked(
        self,
        runtime_auth: bool,
        fixed_path: Option<&str>,
        limits: &Limits,
    ) -> Result<RouteConfig, Vec<Problem>> {
        let mut problems = Vec::new();
        let path = match (&self.path, fixed_path) {
            (Some(given), Some(fixed)) if given.strip_prefix('/').unwrap_or(given) != fixed => {
                problems.push(Problem::new("/path", "the path of a route cannot change"));
                fixed.to_owned()
            }
            // The stored path is checked as a given one is: an update never stores one that a
            // registration could not have.
            (_, Some(fixed)) => route_path(fixed, &mut problems),
            (Some(path), None) => route_path(path, &mut problems),
            (None, None) => {
                problems.push(Problem::new("/path", "missing required member `path`"));
                String::new()
            }
        };
        let method = method_of(self.method.as_deref(), "/method", &mut problems);
        if self.sources.is_some() {
            return self.composed(path, method, limits, problems);
        }
        let Some(original) = &self.original_route else {
            problems.push(Problem::new(
                "/originalRoute",
                "missing required member `originalRoute` (or `sources`, for a route of several upstream calls)",
            ));
            return Err(problems);
        };
        let upstream_method = method_of(original.method.as_deref(), "/originalRoute/method", &mut problems);
        let base_url = original.original_api.base_url.trim().to_owned();
        // The base URL, path, queries, headers and bodies are checked by compiling the request
        // (below), as every route's are.
        let headers = original.headers.clone().unwrap_or_default();
        let pre_headers = self.pre_configured_headers.clone().unwrap_or_default();
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
        let cache = cache_settings(self.cache.as_ref(), &method, &mut problems);
        let retry = retry_settings(self.retry.as_ref(), &upstream_method, &mut problems);
        let rate_limit = rate_limit_settings(self.rate_limit.as_ref(), &mut problems);
        let tls = tls_settings(self.tls.as_ref(), &base_url, &mut problems);
        let breaker = breaker_settings(self.breaker.as_ref(), &mut problems);
        let http2_prior_knowledge = match &self.http2 {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::String(mode)) if mode == "prior-knowledge" => {
                if !base_url.to_ascii_lowercase().starts_with("http://") {
                    problems.push(Problem::new(
                        "/http2",
                        "\"prior-knowledge\" is for an http upstream; an https one is offered HTTP/2 by ALPN and picks",
                    ));
                }
                true
            }
            Some(_) => {
                problems.push(Problem::new(
                    "/http2",
                    "must be \"prior-knowledge\" (HTTP/2 to an http upstream from the start), or null",
                ));
                false
            }
        };
        let forward_headers = super::sources::forward_headers(self.forward_headers.as_ref(), &mut problems);
        let callers = crate::callers::config::callers(self.callers.as_ref(), &mut problems);
        caller_sample(self.caller.as_deref(), &mut problems);
        let queries = original.queries.clone().unwrap_or_default();
        let pre_queries = self.pre_configured_queries.clone().unwrap_or_default();
        let body = json_text(original.body.as_deref());
        let pre_body = json_text(self.pre_configured_body.as_deref());
        let paginate =
            super::paginate::validate(original.paginate.as_ref(), "/originalRoute/paginate", &mut problems);
        if let Some(paginate) = &paginate {
            let attempts = 1 + retry.as_ref().map_or(0, |r| r.attempts as usize);
            let worst = paginate.max_pages as usize * attempts;
            if worst > limits.max_source_calls {
                problems.push(Problem::new(
                    "/originalRoute/paginate/maxPages",
                    format!(
                        "at worst one call sends {worst} requests (`maxPages`, each with its retries), more than {} (RECAST_MAX_SOURCE_CALLS)",
                        limits.max_source_calls
                    ),
                ));
            }
        }
        let config = RouteConfig {
            name: None,
            owner: None,
            path,
            method,
            base_url,
            upstream_path: original.path.clone(),
            upstream_method,
            headers,
            queries,
            body,
            pre_queries,
            pre_headers,
            pre_body,
            auth,
            rules: self.rules_as_string.get().to_owned(),
            cache,
            retry,
            rate_limit,
            tls,
            http2_prior_knowledge,
            breaker,
            sources: Vec::new(),
            paginate,
            forward_headers,
            templates: true,
            sample_request: None,
            callers,
            caller: None,
        };
        // Its request, compiled as every call's will be: one check for every route's upstream
        // (a place the checks above told of already is not told twice).
        if let Err(found) = Single::compile(&config, uuid::Uuid::nil(), limits) {
            for problem in found {
                if !problems.iter().any(|p| p.location == problem.location) {
                    problems.push(problem);
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(config)
    }

    /// A composed route (SPEC §2.3): its sources, the members that go with them, and none of a
    /// single upstream's.
    fn composed(
        self,
        path: String,
        method: String,
        limits: &Limits,
        mut problems: Vec<Problem>,
    ) -> Result<RouteConfig, Vec<Problem>> {
        let present = |value: &Option<serde_json::Value>| value.as_ref().is_some_and(|v| !v.is_null());
        let single = [
            ("originalRoute", self.original_route.is_some()),
            ("authHeader", self.auth_header.is_some()),
            ("tls", present(&self.tls)),
            ("retry", present(&self.retry)),
            ("rateLimit", present(&self.rate_limit)),
            ("http2", present(&self.http2)),
            ("breaker", present(&self.breaker)),
            // Empty, as a composed route is shown (`GET /v1/routes/{uuid}`), they say nothing.
            ("preConfiguredQueries", self.pre_configured_queries.as_ref().is_some_and(|q| !q.is_empty())),
            ("preConfiguredHeaders", self.pre_configured_headers.as_ref().is_some_and(|h| !h.is_empty())),
            ("preConfiguredBody", self.pre_configured_body.as_deref().is_some_and(|b| b.get() != "null")),
        ];
        for (member, _) in single.iter().filter(|(_, given)| *given) {
            let why = match *member {
                "originalRoute" => "`originalRoute` does not go with `sources`: a composed route's upstream calls are its sources".to_owned(),
                "breaker" => "`breaker` does not go with `sources`: each source's calls are counted by its origin's breaker".to_owned(),
                m if m.starts_with("preConfigured") => format!("`{m}` does not go with `sources`: give each source its own `queries`, `headers` or `body`"),
                m => format!("`{m}` does not go with `sources`: give it inside each source that needs it"),
            };
            problems.push(Problem::new(format!("/{member}"), why));
        }
        let cache = cache_settings(self.cache.as_ref(), &method, &mut problems);
        let sources = super::sources::validate(
            self.sources.as_ref().unwrap_or(&serde_json::Value::Null),
            limits.max_source_calls as u32,
            &mut problems,
        );
        let forward_headers = super::sources::forward_headers(self.forward_headers.as_ref(), &mut problems);
        let callers = crate::callers::config::callers(self.callers.as_ref(), &mut problems);
        caller_sample(self.caller.as_deref(), &mut problems);
        if problems.is_empty()
            && let Err(found) = Composition::compile(&sources, &forward_headers, uuid::Uuid::nil(), limits)
        {
            problems.extend(found);
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let runtime = sources.iter().any(|s| s.auth == Auth::Runtime);
        let auth = if runtime { Auth::Runtime } else { Auth::None };
        Ok(RouteConfig {
            cache,
            sources,
            forward_headers,
            callers,
            ..RouteConfig::without_upstream(path, method, auth, self.rules_as_string.get().to_owned())
        })
    }
}

/// `caller`: a sample `$caller`, an object (or `null`: none).
fn caller_sample(given: Option<&RawValue>, problems: &mut Vec<Problem>) {
    match given.map(|raw| serde_json::from_str::<serde_json::Value>(raw.get())) {
        None | Some(Ok(serde_json::Value::Null | serde_json::Value::Object(_))) => {}
        Some(_) => problems.push(Problem::new(
            "/caller",
            "must be an object: the `$caller` live calls are made as, such as {\"kind\": \"jwt\", \"id\": \"u1\", \"claims\": {...}}",
        )),
    }
}

/// A route's `name` or `owner` (SPEC §2.5): `[a-z0-9][a-z0-9-]{0,62}`, so that it is the same in
/// a URL, a file name and a label selector; a problem at `at` when it is not.
pub fn label(text: &str, at: &str, problems: &mut Vec<Problem>) -> String {
    if !is_label(text) {
        problems.push(Problem::new(at, LABEL_RULE));
    }
    text.to_owned()
}

/// What a `name` or an `owner` must be.
pub const LABEL_RULE: &str =
    "must be 1 to 63 characters of a-z, 0-9 and '-', starting with a letter or a digit";

/// Whether `text` is a valid `name` or `owner`.
pub fn is_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes[0] != b'-'
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}
