//! A route's own upstream (SPEC §2.2): its request, compiled by the one request builder
//! ([`super::render`]) from `originalRoute` and the `preConfigured…` members, the settings of
//! its calls, and the request of one call from what the caller brings ([`FromClient`]).

use bytes::Bytes;
use http::HeaderMap;
use http::header::HeaderName;
use uuid::Uuid;

use super::config::RouteConfig;
use super::context::request_context;
use super::paginate::Paging;
use super::render::{CallerParts, Compiler, Members, RequestError, RequestTemplate};
use super::settings::{CallSettings, Given};
use super::template::{Context, Scratch};
use crate::expr::Patterns;
use crate::json::{self, push_pointer};
use crate::rules::{Limits, Problem};
use crate::upstream::{BreakerScope, UpstreamRequest};

/// A route's own upstream, compiled.
#[derive(Debug)]
pub struct Single {
    pub request: RequestTemplate,
    pub calls: CallSettings,
    /// `originalRoute.paginate`: the upstream's pages, joined into the document mapped.
    pub paging: Option<Paging>,
    /// The caller's headers its templates may read (`request.headers`).
    forward: Vec<HeaderName>,
    max_depth: usize,
    max_expr_bytes: usize,
    max_mapping_steps: u64,
}

/// What a call takes from the client's request.
#[derive(Debug, Default)]
pub struct FromClient<'a> {
    pub query: Option<&'a str>,
    pub headers: Option<&'a HeaderMap>,
    pub body: Bytes,
    /// `$caller` (SPEC §2.4), for templates that read it; `None`: `null`.
    pub caller: Option<&'a crate::expr::Const>,
}

/// Why a call cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// A runtime-auth route called without `X-Mapped-Auth`.
    AuthRequired,
    /// The stored configuration no longer makes a request (reported like broken rules).
    Broken(String),
    /// A template over the caller's request failed (where, and why: a type, never a value);
    /// or the caller's body, which templates read, is not JSON.
    Template { location: String, why: String },
}

pub const MAPPED_AUTH: HeaderName = HeaderName::from_static("x-mapped-auth");

impl Single {
    /// Compiles a route's own upstream from its configuration, or every problem at its place in
    /// the registration.
    pub fn compile(config: &RouteConfig, route: Uuid, limits: &Limits) -> Result<Single, Vec<Problem>> {
        let mut problems = Vec::new();
        let located = |at: &str, name: &str| {
            let mut location = at.to_owned();
            push_pointer(&mut location, name);
            location
        };
        let mut queries = Vec::new();
        for (at, map) in
            [("/originalRoute/queries", &config.queries), ("/preConfiguredQueries", &config.pre_queries)]
        {
            queries.extend(map.iter().map(|(n, v)| (n.as_str(), v.as_str(), located(at, n))));
        }
        let mut headers = Vec::new();
        for (at, map) in
            [("/originalRoute/headers", &config.headers), ("/preConfiguredHeaders", &config.pre_headers)]
        {
            // A later name wins, whatever its case.
            headers.extend(map.iter().map(|(n, v)| (n.as_str(), v.as_str(), located(at, n))));
        }
        let mut bodies = Vec::new();
        if let Some(body) = &config.body {
            bodies.push((body.as_str(), "/originalRoute/body".to_owned()));
        }
        if let Some(body) = &config.pre_body {
            bodies.push((body.as_str(), "/preConfiguredBody".to_owned()));
        }
        let members = Members {
            base_url: &config.base_url,
            base_url_at: "/originalRoute/originalApi/baseUrl".to_owned(),
            method: &config.upstream_method,
            method_at: "/originalRoute/method".to_owned(),
            path: &config.upstream_path,
            path_at: "/originalRoute/path".to_owned(),
            queries,
            headers,
            bodies,
            auth: &config.auth,
            auth_at: "/authHeader".to_owned(),
            templates: config.templates,
            caller_passes: true,
        };
        let mut patterns = Patterns::default();
        let mut compiler = Compiler {
            names: &[],
            closure: &[],
            reads: Vec::new(),
            at: "/originalRoute".to_owned(),
            item: false,
            item_only_request: true,
            max_depth: limits.max_depth,
            patterns: &mut patterns,
            problems: &mut problems,
        };
        let request = compiler.request(&members);
        let paging = config.paginate.as_ref().and_then(|paginate| {
            Paging::compile(
                paginate,
                "/originalRoute/paginate",
                limits.max_depth,
                &mut patterns,
                &mut problems,
            )
        });
        let calls = CallSettings::read(
            Given {
                auth: &config.auth,
                token_url_at: "/authHeader/tokenUrl".to_owned(),
                tls: config.tls.as_ref(),
                tls_at: "/tls".to_owned(),
                retry: config.retry.as_ref(),
                rate_limit: config.rate_limit.as_ref(),
                h2c: config.http2_prior_knowledge,
                key: route,
                breaker: (config.breaker == BreakerScope::Route).then_some(route),
            },
            &mut problems,
        );
        let mut forward = Vec::new();
        for name in &config.forward_headers {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(header) => forward.push(header),
                Err(_) => {
                    problems.push(Problem::new("/forwardHeaders", format!("`{name}` is not a header name")))
                }
            }
        }
        match (request, calls) {
            (Some(request), Some(calls)) if problems.is_empty() => Ok(Single {
                request,
                calls,
                paging,
                forward,
                max_depth: limits.max_depth,
                max_expr_bytes: limits.max_expr_bytes,
                max_mapping_steps: limits.max_mapping_steps,
            }),
            _ => Err(problems),
        }
    }

    /// The request of one call (SPEC §2.2): rendered over `request` when its templates read
    /// it, with the caller's query, `Accept` headers, body and `X-Mapped-Auth` as they pass.
    pub fn request(&self, client: &FromClient<'_>) -> Result<UpstreamRequest, CallError> {
        let caller = CallerParts {
            query: client.query,
            headers: client.headers,
            body: Some(&client.body),
            mapped_auth: client.headers.and_then(|h| h.get(&MAPPED_AUTH)),
        };
        let rendered = if self.request.reads() {
            self.rendered(client, &caller)?
        } else {
            self.request.render(None, &caller)
        };
        rendered.map_err(|e| match e {
            RequestError::AuthRequired => CallError::AuthRequired,
            RequestError::Template { location, why, .. } | RequestError::Missing { location, why, .. } => {
                CallError::Template { location, why }
            }
        })
    }

    /// The request rendered over the context `{"request": ...}`.
    fn rendered(
        &self,
        client: &FromClient<'_>,
        caller: &CallerParts<'_>,
    ) -> Result<Result<UpstreamRequest, RequestError>, CallError> {
        let empty = HeaderMap::new();
        let headers = client.headers.unwrap_or(&empty);
        let request = request_context(client.query, headers, &self.forward, &client.body, self.max_depth)
            .map_err(|e| CallError::Template {
                location: "(request body)".to_owned(),
                why: format!("the body is not JSON: {e}"),
            })?;
        let mut text = Vec::with_capacity(request.len() + 16);
        text.extend_from_slice(b"{\"request\":");
        text.extend_from_slice(&request);
        text.push(b'}');
        json::with_parsed(&mut text, self.max_depth, |doc| {
            let scratch = Scratch::new(self.max_expr_bytes, self.max_mapping_steps);
            let arena = scratch.arena();
            let who = client.caller.map_or(crate::expr::Val::Null, crate::expr::Val::from_const);
            let context = Context { doc, item: None, caller: who, arena: &arena, explain: false };
            self.request.render(Some(&context), caller)
        })
        .map_err(|e| CallError::Template { location: "(request)".to_owned(), why: e.to_string() })
    }
}
